"""The models a page offers (`Targets`): the one it started with, its other precision, its copy with
the layers on disk, and the presets; each loaded once, on ZeroGPU all at the page's start."""

import itertools
import logging
import threading

from specdemo.app.lesson import ON_DISK, ON_DISK_ABOUT
from specdemo.core.errors import SpecDemoError, in_one_line
from specdemo.models import EMBEDDED, LoadedModel, compiled, fast_dtype, free_memory, load_model
from specdemo.presets import Preset, preset_for, preset_named

log = logging.getLogger(__name__)


class Targets:
    """The models a page offers: the one it started with, and the presets this machine can run
    (with CUDA, the GPU presets: `specdemo.presets`), each loaded on first use. Besides the start,
    one model is resident at a time (a preset, or the start at the other precision): asking for
    another evicts it first, so a class switching presets never holds more than two in memory.
    Where the start is the embedded model, it is offered again with its decoder layers on disk
    (`lesson.ON_DISK`, on the start's device), standing in for a model too big for memory; it is
    resident as a preset is. A compiled start makes every model it loads compiled too (but the one
    on disk: no graph holds weights that move in during a pass). On ZeroGPU, a click the platform
    refused runs on the model's twin on the CPU (`on_cpu`), loaded once too.
    With `preload` (ZeroGPU, which offers no preset) every model the page offers is loaded at once,
    in the thread that builds the page, where `spaces` stands in for CUDA: a handler runs in another
    thread, where nothing stands in and touching CUDA fails, and each GPU call is a fork of this
    process that finds them loaded. A model that fails to load then is not offered: asking for it
    is told why. The CPU twins load then too: at launch the platform deletes the Hub's model files
    whose weights it packed for the GPU, so a twin loaded later would find none."""

    def __init__(self, start: LoadedModel, presets: tuple[Preset, ...], preload: bool = False):
        self.start, self.presets = start, presets
        self.resident: LoadedModel | None = None
        self.resident_key: tuple | None = None  # (spec, dtype, on disk) of the resident model
        self.cpu_twins: dict[bool, LoadedModel] = {}  # by whether its layers are on disk
        self.lock = threading.Lock()  # a class's clicks may ask for a model at once: one loads it
        start_preset = preset_for(start.spec, presets)
        self.start_name = start_preset.name if start_preset else start.spec
        self.on_disk = ON_DISK if start.spec == EMBEDDED and start.placed is None else None
        self.names = list(dict.fromkeys([self.start_name, *(preset.name for preset in presets),
                                         *([self.on_disk] if self.on_disk else [])]))
        # exact: float32, where every method's answer is AR's; fast: the dtype this device multiplies fastest, if
        # not float32
        fast = fast_dtype(start.device)
        self.precisions = {EXACT: "float32", **({fast_label(fast): fast} if fast != "float32" else {})}
        start_dtype = str(start.dtype).removeprefix("torch.")
        self.start_precision = next((label for label, dtype in self.precisions.items() if dtype == start_dtype), EXACT)
        # preloaded: (spec, dtype, on disk) -> the model, or why it did not load
        self.preloaded: dict[tuple, LoadedModel | str] | None = None
        if preload:
            self.preloaded = {}
            for name, precision in itertools.product(self.names, self.precisions):
                if name != self.start_name or self.precisions[precision] != start_dtype:
                    self.preloaded[self.key(name, precision)] = self.loaded_or_why(name, precision)
            for on_disk in (False, True) if self.on_disk else (False,):
                try:
                    self.cpu_twins[on_disk] = self.cpu_twin(start.spec, on_disk)
                except Exception as error:  # noqa: BLE001 -- a refused click then loads it, or says why
                    log.warning("the page's CPU twin (on disk: %s) did not load: %s", on_disk, error)

    def about(self, name: str, precision: str = "") -> str:
        """What model `name` brings, and what the precision switch does once `precision` is not the start's."""
        preset = next((preset for preset in self.presets if preset.name == name), None)
        brings = ON_DISK_ABOUT if name and name == self.on_disk else preset.about if preset else ""
        return " ".join(filter(None, [brings, PRECISION_ABOUT if precision not in ("", self.start_precision) else ""]))

    def shows_about(self, name: str, precision: str = "") -> bool:
        """Whether the page says what model `name` brings: once another than the start is chosen, or
        always with GPU presets (a lesson step setting the start back leaves the first screen as it was);
        or what the precision switch does, once `precision` is not the start's."""
        return (name != self.start_name or len(self.names) > 1 + bool(self.on_disk)
                or precision not in ("", self.start_precision))

    def __call__(self, name: str | None, precision: str | None = None) -> LoadedModel:
        """The model `name` (default: the start) at `precision` (a label of `self.precisions`;
        default: the start's dtype), loaded once."""
        with self.lock:
            return self.load(name, precision)

    def key(self, name: str | None, precision: str | None) -> tuple[str, str, bool]:
        """(spec, dtype, on disk) of the model `name` at `precision` (defaults: the start's)."""
        if precision not in (None, "", *self.precisions):
            raise SpecDemoError(f"precision must be one of {', '.join(map(repr, self.precisions))}, got {precision!r}")
        dtype = self.precisions[precision] if precision else str(self.start.dtype).removeprefix("torch.")
        start = not name or name in (self.start_name, self.on_disk)
        spec = self.start.spec if start else preset_named(name, self.presets).target
        return spec, dtype, bool(name) and name == self.on_disk

    def loaded_or_why(self, name: str, precision: str) -> LoadedModel | str:
        try:
            return self.load(name, precision)
        except Exception as error:  # noqa: BLE001 -- a model that fails to load is not offered, and says why
            log.warning("the page's model %r at %s did not load; it is not offered: %s", name, precision, error)
            return in_one_line(error)

    def load(self, name: str | None, precision: str | None) -> LoadedModel:
        spec, dtype, on_disk = self.key(name, precision)
        if (spec, dtype, on_disk) == (self.start.spec, str(self.start.dtype).removeprefix("torch."), False):
            return self.start
        if self.preloaded is not None and (spec, dtype, on_disk) in self.preloaded:
            preloaded = self.preloaded[spec, dtype, on_disk]
            if isinstance(preloaded, str):
                raise SpecDemoError(f"{name or self.start_name} at {precision} did not load when this page started, "
                                    f"so it is not offered ({preloaded})")
            return preloaded
        preset = None if spec == self.start.spec else preset_for(spec, self.presets)
        if self.resident is not None and self.resident_key == (spec, dtype, on_disk):
            return self.resident
        if self.resident is not None:
            self.resident = self.resident_key = None
            free_memory()  # before the next load, so two presets never share the GPU
        device = str(self.start.device)
        loaded = (self.layers_on_disk(dtype, device) if on_disk
                  else load_model(spec, dtype, device, device_map=preset and preset.device_map))
        self.resident, self.resident_key = compiled(loaded) if self.start.passes else loaded, (spec, dtype, on_disk)
        return self.resident

    def layers_on_disk(self, dtype: str, device: str) -> LoadedModel:
        """The start's model with every decoder layer on disk, in a temporary folder of its own that
        goes with the model (`placement.dispatch`): dropped by the page, or at the process's exit."""
        return load_model(self.start.spec, dtype, device, device_map="disk")

    def on_cpu(self, target: LoadedModel) -> LoadedModel:
        """`target`'s twin on the CPU at its fastest dtype there, its layers on disk where `target`'s
        are, loaded on first use and held (one in memory, one on disk)."""
        on_disk = target.placed is not None
        with self.lock:
            twin = self.cpu_twins.get(on_disk)
            if twin is None or twin.spec != target.spec:
                self.cpu_twins.pop(on_disk, None)
                self.cpu_twins[on_disk] = self.cpu_twin(target.spec, on_disk)
            return self.cpu_twins[on_disk]

    def cpu_twin(self, spec: str, on_disk: bool) -> LoadedModel:
        """Model `spec` on the CPU at its fastest dtype there, its layers on disk if `on_disk`."""
        return self.layers_on_disk("auto", "cpu") if on_disk else load_model(spec, "auto", "cpu")


EXACT = "exact (float32)"
PRECISION_ABOUT = ("Precision: exact (float32) gives every method AR's answer; fast rounds, which may flip a near-tie "
                   "between AR's two likeliest tokens, and the page then says where.")


def fast_label(dtype: str) -> str:
    return f"fast ({dtype})"
