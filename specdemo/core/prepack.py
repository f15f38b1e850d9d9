"""Linear layers whose weights are prepacked for oneDNN: a CPU's eager pass at nearly compiled speed.

A matrix product through `torch.nn.functional.linear` on a CPU lays the weight out afresh, on
every call and in every layer, in the blocked format the kernel reads. Prepacking does it once
(`torch.ops.mkldnn._reorder_linear_weight`) and every call then runs oneDNN's kernel alone
(`torch.ops.mkldnn._linear_pointwise`). This is what the compiled path's freezing does inside
its graph (`static.compile_passes`); here the eager path gets it with no compile.

- bfloat16, where the CPU multiplies it natively (where the app picks bfloat16): the plain product
  runs the same oneDNN kernel, so the values are the same.
- float32 (the app's choice on a CPU without native bfloat16): the plain product is MKL's, so the
  values differ within rounding, as a product's values already differ with the rows beside it.

Swapping a model's layers for `PackedLinear` (`prepack`) is explicit: the model's modules say
which layers take this path. How much faster it is, by CPU and dtype: docs/benchmarks.md.

CUDA, other dtypes, training (gradients on) and a graph being compiled go through
`torch.nn.functional.linear` as before, as does a model loaded under `torch.inference_mode`
(`packable`). A weight changed in place (merged adapters, a `load_state_dict`) is packed again
at its next call. `linear(x, weight)` is the same product for a weight that is no layer's: the
rows of the LM head a draft or Medusa's heads propose from. Packed layouts are kept beside their weights
(`_PACKED`, weakly: a weight that goes frees its layout), never on a model.
"""

import functools

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

# weight -> (stamp, packed)
_PACKED: "WeakIdKeyDictionary[torch.Tensor, tuple[tuple[int, int], torch.Tensor]]" = WeakIdKeyDictionary()


def cpu_multiplies_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX): what torch itself asks
    before a oneDNN bfloat16 product."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Linear):
    """An `nn.Linear` whose product runs through its weight's prepacked layout (`linear`). It
    holds the very parameters of the layer it replaces (`of`), so tied weights stay tied."""

    @classmethod
    def of(cls, layer: nn.Linear) -> "PackedLinear":
        packed = cls(layer.in_features, layer.out_features, bias=False, device="meta", dtype=layer.weight.dtype)
        packed.weight, packed.bias = layer.weight, layer.bias
        return packed.train(layer.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def prepack(module: nn.Module) -> int:
    """Swap every float32 or bfloat16 `nn.Linear` of `module` on a CPU for a `PackedLinear` of the
    same parameters (bfloat16 only where this CPU multiplies it natively); returns how many."""
    names = [name for name, layer in module.named_modules()
             if name and type(layer) is nn.Linear and packable(layer.weight)]
    for name in names:
        module.set_submodule(name, PackedLinear.of(module.get_submodule(name)))
    return len(names)


def packable(weight: torch.Tensor) -> bool:
    """A weight on a CPU of a dtype oneDNN multiplies there (`packed_dtypes`), whose changes its
    version counter tracks: a weight made under `torch.inference_mode` has none, so a change to
    it in place could not be seen (plain path)."""
    return weight.device.type == "cpu" and weight.dtype in packed_dtypes() and not weight.is_inference()


@functools.cache
def packed_dtypes() -> frozenset[torch.dtype]:
    """float32 wherever torch has oneDNN; bfloat16 too where the CPU multiplies it natively."""
    if not torch.backends.mkldnn.is_available():
        return frozenset()
    return frozenset({torch.float32, torch.bfloat16} if cpu_multiplies_bfloat16() else {torch.float32})


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.nn.functional.linear`, through `weight`'s prepacked layout where nothing needs the
    plain product (no gradient, no graph being compiled, a packable weight of x's dtype)."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or x.dtype != weight.dtype or not packable(weight):
        return nn.functional.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight(weight), bias, "none", [], "")


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` in oneDNN's blocked layout, packed again when it changed in place. No batch-size
    hint: a hint of 1 picks a layout for one-row products that slows the products of a few rows
    in float32 (docs/benchmarks.md)."""
    stamp = (weight.data_ptr(), weight._version)
    cached = _PACKED.get(weight)
    if cached is None or cached[0] != stamp:
        cached = (stamp, torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
        _PACKED[weight] = cached
    return cached[1]
