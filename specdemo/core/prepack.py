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
at its next call. A packed layout is held by whoever holds its weight (`Packed`): a `PackedLinear`
for its own, a draft or Medusa's heads beside the rows of the LM head they propose from, which no
layer owns, passed to `linear` as a value. Nothing is kept at module level.
"""

import functools

import torch
from torch import nn


def cpu_multiplies_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX): what torch itself asks
    before a oneDNN bfloat16 product."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class Packed:
    """One weight's prepacked layout, kept by whoever holds the weight: packed at its first use in
    a product and again whenever the weight changed since (in place, or moved to a new tensor).
    A copy (of a model: `copy.deepcopy`, pickling) starts empty and packs its own weight at its first
    use: oneDNN's layout is no tensor that copies."""

    def __init__(self):
        self.stamp: tuple[int, int, int] | None = None  # the weight it was packed from, and that weight's version
        self.layout: torch.Tensor | None = None

    def __reduce__(self):
        return Packed, ()

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        """`weight` in oneDNN's blocked layout. No batch-size hint: a hint of 1 picks a layout for
        one-row products that slows the products of a few rows in float32 (docs/benchmarks.md)."""
        stamp = (id(weight), weight.data_ptr(), weight._version)
        if stamp != self.stamp:
            self.stamp, self.layout = stamp, torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        return self.layout


class PackedLinear(nn.Linear):
    """An `nn.Linear` whose product runs through its weight's prepacked layout (`linear`). It
    holds the very parameters of the layer it replaces (`of`), so tied weights stay tied, and
    their layout (`packed`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.packed = Packed()

    @classmethod
    def of(cls, layer: nn.Linear) -> "PackedLinear":
        packed = cls(layer.in_features, layer.out_features, bias=False, device="meta", dtype=layer.weight.dtype)
        packed.weight, packed.bias = layer.weight, layer.bias
        return packed.train(layer.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: Packed | None = None) -> torch.Tensor:
    """`torch.nn.functional.linear`, through `weight`'s prepacked layout (`packed`, held beside the
    weight) where nothing needs the plain product (no gradient, no graph being compiled, a packable
    weight of x's dtype). Without `packed`, the plain product."""
    if (packed is None or torch.is_grad_enabled() or torch.compiler.is_compiling() or x.dtype != weight.dtype
            or not packable(weight)):
        return nn.functional.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed.of(weight), bias, "none", [], "")
