"""Linear layers whose weights are prepacked for oneDNN: a CPU's eager pass at nearly compiled speed.

A bfloat16 matrix product on a CPU runs in oneDNN, which first lays the weight out in the blocked
format its kernel reads. Called through `torch.nn.functional.linear` it lays it out afresh on every call,
for every layer: reading the weight twice and writing it once, where the product itself reads it
once. Prepacking does it once (`torch.ops.mkldnn._reorder_linear_weight`) and every call then
runs the kernel alone (`torch.ops.mkldnn._linear_pointwise`). This is what the compiled path's
freezing does inside its graph (`static.compile_passes`); here the eager path gets it with no
compile. The product is the same kernel on the same blocked weight, so its values are the same.

Every method's pass gets cheaper, AR's most (docs/benchmarks.md has the run, on 2 cores of an
AMD EPYC with AVX-512 BF16), and no answer changes: the bench's tokens are the same token for token.

Only bfloat16 layers on a CPU that multiplies bfloat16 natively are packed (where the app picks
bfloat16); float32 layers, CUDA, training (gradients on) and a graph being compiled go through
`torch.nn.functional.linear` as before, as does a model loaded under `torch.inference_mode`
(`packable`). A weight changed in place (merged adapters, a
`load_state_dict`) is packed again at its next call.
"""

import types
import weakref

import torch
from torch import nn

_PACKED: "weakref.WeakKeyDictionary[nn.Linear, tuple[tuple[int, int], torch.Tensor]]" = weakref.WeakKeyDictionary()


def cpu_multiplies_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX): what torch itself asks
    before a oneDNN bfloat16 product."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def prepack(module: nn.Module) -> int:
    """Route every bfloat16 `nn.Linear` of `module` on a CPU through its prepacked weight, where
    this CPU multiplies bfloat16 natively; returns how many layers now do (0 elsewhere)."""
    layers = [layer for layer in module.modules() if isinstance(layer, nn.Linear) and packable(layer.weight)]
    if layers and not cpu_multiplies_bfloat16():
        return 0
    for layer in layers:
        layer.forward = types.MethodType(packed_forward, layer)
    return len(layers)


def packable(weight: torch.Tensor) -> bool:
    """A bfloat16 weight on a CPU, whose changes its version counter tracks: a weight made under
    `torch.inference_mode` has none, so a change to it in place could not be seen (plain path)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and not weight.is_inference()


def packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`nn.Linear.forward` through the prepacked weight, where nothing needs the plain product."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling() or not packable(self.weight) or x.dtype != torch.bfloat16:
        return nn.functional.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight(self), self.bias, "none", [], "")


def packed_weight(layer: nn.Linear) -> torch.Tensor:
    """`layer`'s weight in oneDNN's blocked layout, packed again when the weight changed."""
    weight = layer.weight
    stamp = (weight.data_ptr(), weight._version)
    cached = _PACKED.get(layer)
    if cached is None or cached[0] != stamp:
        cached = (stamp, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1))
        _PACKED[layer] = cached
    return cached[1]
