"""Each method's default settings for a kind of device, as data beside the CPU's.

A method's keyword defaults (its `generate` signature) are sized for a CPU, where every token a
pass feeds costs a few percent of the pass: small trees, a narrow window. With CUDA graphs a
pass costs about the same at any width up to the widest bucket (docs/gpu.md), so more guesses a
pass pay there, and `GPU` overrides some of those defaults. Rules:

- A run takes the set of the device its target runs on (`defaults_for`); a setting given
  explicitly (the page's controls, the bench's `--set`, a library call's keyword) wins over it,
  and a setting given as None ("the method chooses") takes the set's value.
- A set says where its values were chosen (`chosen`); the bench prints its name and the page
  shows it beside the method settings.
- A GPU kind measured apart gets a set of its own in `BY_GPU_NAME`, keyed by
  `torch.cuda.get_device_name`; any other GPU takes `GPU`.
"""

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from specdemo.methods import METHODS


@dataclass(frozen=True)
class Defaults:
    """A device kind's overrides of the methods' own defaults: {method: {setting: value}}."""

    name: str
    chosen: str  # where the values were measured, for the page and the bench
    settings: Mapping[str, Mapping[str, object]] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, method: str) -> Mapping[str, object]:
        return self.settings.get(method, MappingProxyType({}))


CPU = Defaults("CPU", "the methods' own defaults, measured on 2 CPU cores (docs/methods/)")

# Wider guesses where a pass costs about the same at any width: of the settings that only widen the pass, those
# that commit the most tokens a pass. The draft tree stays 2 deep: each level more is a draft pass, whose cost on
# a GPU `scripts/gpu_sweep.py` measures, as it measures each of these (docs/gpu.md, "Defaults on a GPU").
GPU = Defaults(
    "GPU",
    "the settings that commit the most tokens a pass (which no device changes) among those that only widen a pass, "
    "which on an NVIDIA H200 costs about the same at any width: docs/gpu.md",
    MappingProxyType({
        # greedy decoding's draft tree, 2 deep (γ's default): beside a copy it fills the 64-token pass; sampling still
        # drafts a chain
        "speculative": MappingProxyType({"auto_tree_size": 31}),
        "medusa": MappingProxyType({"tree_size": 31}),  # beside a copy, a dynamic tree that fills the 64-token pass
        "lookahead": MappingProxyType({"window": 4, "candidates": 7}),
        "cllm": MappingProxyType({"window": 3, "candidates": 7}),  # lookahead's n-grams and candidates: the page's
    }),
)

BY_GPU_NAME: Mapping[str, Defaults] = MappingProxyType({})


def defaults_for(device: torch.device) -> Defaults:
    """The set for a target on `device`. A GPU's name is asked only where a kind has a set of its
    own, and a GPU that cannot say it (ZeroGPU's stand-in outside a GPU call) takes `GPU`."""
    if device.type != "cuda":
        return CPU
    if not BY_GPU_NAME:
        return GPU
    try:
        return BY_GPU_NAME.get(torch.cuda.get_device_name(device), GPU)
    except (RuntimeError, AssertionError):
        return GPU


def with_defaults(defaults: Defaults, method: str, settings: Mapping[str, object]) -> dict:
    """`method`'s settings for a run: the set's values, then those given (None given: the set's, else the method's)."""
    return {**defaults.of(method), **{name: value for name, value in settings.items() if value is not None}}


def default_of(defaults: Defaults, method: str, setting: str):
    """What `method` runs with for `setting` on a device of `defaults` when it is given none: the
    set's value, else the method's own default (None: the method chooses)."""
    if setting in defaults.of(method):
        return defaults.of(method)[setting]
    return inspect.signature(METHODS[method].generate).parameters[setting].default
