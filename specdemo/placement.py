"""Where a target's weights live: one device, or a device map through accelerate.

A device map names, for each module of the model, where its weights are kept: a device (`cuda:0`,
`cpu`), or `disk`. accelerate's hooks bring a module's weights to the device that runs it at
each pass and back afterwards, so a model larger than one device runs, slower. Rules:

- `device_map` is one of accelerate's strategies (`auto`, `balanced`, `balanced_low_0`,
  `sequential`), within `max_memory` per device (`{0: "6GiB", "cpu": "30GiB"}`); a dict of
  module name to device; or `disk`, ours: every decoder layer offloaded to `offload_folder`, the
  embeddings, the final norm and the LM head kept where the model runs. `disk` stands in for a
  model too big for memory: every pass streams every layer's weights in, whatever it feeds.
- A pass runs where the embeddings are (`execution_device`); a layer kept elsewhere runs on its
  own device, and its KV cache lives there. A map onto one device is an ordinary load there.
- A dispatched model keeps its weights as they are: no prepacked linear layers, no grouped
  attention (both replace modules whose weights must be resident), and no compiled pass (a
  graph cannot hold weights that move in during the pass).
"""

import shutil
import tempfile
import weakref
from pathlib import Path

import torch
from accelerate import dispatch_model, infer_auto_device_map
from accelerate.utils import get_balanced_memory
from transformers import PreTrainedModel

from specdemo.core.errors import SpecDemoError

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
DISK = "disk"


def parse_max_memory(text: str | None) -> dict | None:
    """`max_memory` from the command line's "0=6GiB,cpu=30GiB" (a GPU by index, or cpu / disk)."""
    if not text:
        return None
    limits = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not size:
            raise SpecDemoError(f"--max-memory takes DEVICE=SIZE pairs such as 0=6GiB,cpu=30GiB, got {part!r}")
        name = name.strip().removeprefix("cuda:")
        limits[int(name) if name.isdigit() else name] = size.strip()
    return limits


def device_map_for(model: PreTrainedModel, device_map: str | dict, device: torch.device,
                   max_memory: dict | None = None) -> dict:
    """The module-to-device dict for `device_map` (see the module docstring) on `model`."""
    if isinstance(device_map, dict):
        return dict(device_map)
    if device_map == DISK:
        return disk_map(model, device)
    if device_map not in STRATEGIES:
        raise SpecDemoError(f"device_map must be one of {', '.join((*STRATEGIES, DISK))} or a dict, got {device_map!r}")
    no_split = getattr(model, "_no_split_modules", None) or []
    if device_map != "sequential":
        max_memory = get_balanced_memory(model, max_memory, no_split, low_zero=device_map == "balanced_low_0")
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)


def disk_map(model: PreTrainedModel, device: torch.device) -> dict:
    """Every decoder layer on `disk`; every other top-level part of the decoder, and the LM head, on `device`."""
    decoder_name = next(name for name, module in model.named_modules() if module is model.get_decoder())
    layers = model.get_decoder().layers
    placed = {f"{decoder_name}.layers.{i}": DISK for i in range(len(layers))}
    for name, _ in model.get_decoder().named_children():
        if name != "layers":
            placed[f"{decoder_name}.{name}"] = str(device)
    for name, module in model.named_children():
        if module is not model.get_decoder():
            placed[name] = str(device)
    return placed


def dispatch(model: PreTrainedModel, device_map: dict, offload_folder: str | Path | None = None) -> PreTrainedModel:
    """`model` (whole, on the CPU) spread as `device_map` says; a map with `disk` writes those
    weights into `offload_folder`, or into a fresh temporary folder that lives as long as the model:
    removed when the model is collected, or at the latest when the process exits."""
    if DISK in device_map.values() and offload_folder is None:
        offload_folder = tempfile.mkdtemp(prefix="specdemo-offload-")
        weakref.finalize(model, shutil.rmtree, offload_folder, ignore_errors=True)
    return dispatch_model(model, device_map, offload_dir=None if offload_folder is None else str(offload_folder))


def execution_device(device_map: dict) -> torch.device:
    """Where a dispatched model's passes start: the first device of the map that is not disk."""
    placed = [device for device in device_map.values() if device != DISK]
    if not placed:
        return torch.device("cpu")
    return torch.device(f"cuda:{placed[0]}" if isinstance(placed[0], int) else placed[0])


def spread(device_map: dict) -> bool:
    """Whether `device_map` puts weights in more than one place, or on disk (they move in at each pass);
    a map onto one device is an ordinary load there."""
    return len(set(device_map.values())) > 1 or DISK in device_map.values()


def is_dispatched(model: PreTrainedModel) -> bool:
    """Whether accelerate spread `model` (`spread`)."""
    return spread(getattr(model, "hf_device_map", {}))
