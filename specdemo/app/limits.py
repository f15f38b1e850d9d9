"""What one visitor may ask of the app, in one place. A Space owner overrides each limit with an
environment variable (docs/hosting.md); a bad value stops the app at start with a sentence."""

import dataclasses
import math
import os
import threading
import time
from dataclasses import dataclass, fields

from specdemo.core.errors import SpecDemoError


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int = 512  # SPECDEMO_MAX_NEW_TOKENS: the most tokens one answer may have
    max_prompt_chars: int = 4000  # SPECDEMO_MAX_PROMPT_CHARS
    # SPECDEMO_BUDGET_S: one click's time: loading, the AR baseline, the method(s), reference runs
    budget_s: float = 120.0
    # SPECDEMO_TIMING_S: after an answer, about how long AR and the method are timed again (3 rounds at least)
    timing_s: float = 8.0
    queue_size: int = 64  # SPECDEMO_QUEUE_SIZE: decodes waiting, all visitors together (a class of 30 and more)
    presets: bool = True  # SPECDEMO_PRESETS: 0 offers only the model the app started with (the default on a Space)
    max_upload: str = "1mb"  # SPECDEMO_MAX_UPLOAD: the page takes no uploads; Gradio's upload route gets this cap
    # SPECDEMO_GPU_MAX_S: on ZeroGPU, the most GPU seconds one click declares (`zerogpu.plan_click`)
    gpu_max_s: float = 10.0

    @staticmethod
    def variable(name: str) -> str:
        return f"SPECDEMO_{name.upper()}"


def limits_from(environ=os.environ) -> Limits:
    """The limits, with each SPECDEMO_* variable that is set taking the place of its default. On a
    Hugging Face Space (SPACE_ID set) the GPU presets are off unless SPECDEMO_PRESETS turns them on:
    a public page must not let a visitor load 7B models."""
    values = {"presets": False} if environ.get("SPACE_ID") else {}
    for field in fields(Limits):
        text = environ.get(Limits.variable(field.name))
        if text is None:
            continue
        try:
            if field.type is bool:
                if text.strip().lower() not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(text)
                values[field.name] = text.strip().lower() in ("1", "true", "yes", "on")
            elif field.type in (int, float):
                number = field.type(text)
                if not number > 0:
                    raise ValueError(text)
                values[field.name] = number
            else:
                values[field.name] = text.strip()
        except ValueError:
            raise SpecDemoError(f"{Limits.variable(field.name)}={text!r} is not a valid {field.name.replace('_', ' ')} "
                                f"(default {getattr(Limits, field.name)!r})") from None
    return Limits(**values)


LIMITS = limits_from()


@dataclass(frozen=True)
class Deadline:
    """One click's deadline, handed to every run the click starts as its `stop`: it has come once
    `ends_at` (on `time.monotonic`'s clock) has passed, or once the click is stopped early (`set`:
    the Stop button, or the click's end). The decoding core asks `is_set()` between two passes."""

    ends_at: float = math.inf
    stopped: threading.Event = dataclasses.field(default_factory=threading.Event, compare=False)

    def is_set(self) -> bool:
        return self.stopped.is_set() or time.monotonic() >= self.ends_at

    def set(self) -> None:
        self.stopped.set()

    def left(self) -> float:
        """Seconds before it comes: 0 once it has."""
        return 0.0 if self.is_set() else max(0.0, self.ends_at - time.monotonic())

    def wait(self, timeout: float) -> bool:
        """Wait until it comes, `timeout` seconds at most; whether it has."""
        self.stopped.wait(min(timeout, self.left()))
        return self.is_set()


def budget(seconds: float | None = None) -> Deadline:
    """One click's budget: a `Deadline` `seconds` from now (default: LIMITS.budget_s), so loading,
    the baseline, the method and any reference run share one deadline. Stop sets it sooner."""
    return Deadline(time.monotonic() + (LIMITS.budget_s if seconds is None else seconds))


def time_left(stop: "Deadline | threading.Event") -> float:
    """Seconds before a click's deadline comes: 0 once stopped; unbounded for a plain stop event."""
    if isinstance(stop, Deadline):
        return stop.left()
    return 0.0 if stop.is_set() else math.inf
