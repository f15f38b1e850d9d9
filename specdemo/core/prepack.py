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

On 2 cores of an AMD EPYC with AVX-512 BF16, 26 Spec-Bench questions (docs/benchmarks.md): in
bfloat16 every method ran 1.25x to 1.32x faster with the same answers; in float32 AR 1.52x,
speculative 1.58x and Medusa 1.68x, every answer still AR's and every run the same tokens in the
same passes. Packed without a batch-size hint (`packed_weight`): with a hint of 1, as until
2026-11-27, a float32 pass of 13 tokens cost 39.4 ms against 33.4 now, and 55.9 against 41.8 where only AVX2
runs (docs/benchmarks.md, 2026-11-27 midday: float32 speculative decoding from 1.51x AR to 1.67x here).

CUDA, other dtypes, training (gradients on) and a graph being compiled go through
`torch.nn.functional.linear` as before, as does a model loaded under `torch.inference_mode`
(`packable`). A weight changed in place (merged adapters, a `load_state_dict`) is packed again
at its next call. `linear(x, weight)` is the same product for a weight that is no layer's: the
rows of the LM head a draft or Medusa's heads propose from (0.14 ms against 0.30 ms for 4 rows
times 8,192 of them in bfloat16, measured while another process shared the cores; the same values).
"""

import functools
import types

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

_PACKED: "WeakIdKeyDictionary[torch.Tensor, tuple[tuple[int, int], torch.Tensor]]" = WeakIdKeyDictionary()  # weight -> (stamp, packed)


def cpu_multiplies_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX): what torch itself asks
    before a oneDNN bfloat16 product."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def prepack(module: nn.Module) -> int:
    """Route every float32 or bfloat16 `nn.Linear` of `module` on a CPU through its prepacked
    weight (bfloat16 only where this CPU multiplies it natively); returns how many layers now do."""
    layers = [layer for layer in module.modules() if isinstance(layer, nn.Linear) and packable(layer.weight)]
    for layer in layers:
        layer.forward = types.MethodType(packed_forward, layer)
    return len(layers)


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


def packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`nn.Linear.forward` through the prepacked weight (`linear`)."""
    return linear(x, self.weight, self.bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`torch.nn.functional.linear`, through `weight`'s prepacked layout where nothing needs the
    plain product (no gradient, no graph being compiled, a packable weight of x's dtype)."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or x.dtype != weight.dtype or not packable(weight):
        return nn.functional.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight(weight), bias, "none", [], "")


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` in oneDNN's blocked layout, packed again when it changed in place. No batch-size
    hint: a hint of 1 picks a layout for one-row products that makes float32 products of 4 to 32
    rows 1.3x to 2.3x slower (docs/benchmarks.md, 2026-11-27 midday); bfloat16 products are the same either way."""
    stamp = (weight.data_ptr(), weight._version)
    cached = _PACKED.get(weight)
    if cached is None or cached[0] != stamp:
        cached = (stamp, torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
        _PACKED[weight] = cached
    return cached[1]
