"""A stand-in for Hugging Face's `spaces` package on ZeroGPU, for tests and `make space-check`:
put this folder first on `sys.path` and `import spaces` finds it; set SPACES_ZERO_GPU=true, as
the platform does on a ZeroGPU Space (without it the app runs as on any other machine).

What it keeps of the real package (`spaces/zero/client.py` and `wrappers.py`, version 0.51):
- `spaces.GPU(duration=...)` wraps a function or a generator; `duration` is seconds or a callable
  of the call's arguments, evaluated before the call runs;
- each visitor has a daily quota (QUOTA_S, 120 s without a login), charged by the *declared*
  duration in whole seconds times the GPU kind's duration factor (DURATION_FACTOR, which
  `spaces.zero.config.get_config` gives: 1.5 on an RTX PRO 6000), checked before the call runs,
  with the same `gr.Error` titles and messages:
  "ZeroGPU quota exceeded" ("You have exceeded your ZeroGPU quota (Ns requested vs. Ms left).
  Try again in H:MM:SS.") and "ZeroGPU illegal duration" (above TIER_MAX_S);
- a visitor is the request's `x-ip-token` header (the platform's), else its client's address;
- a call waits, uncharged and untimed, for the Space's one GPU (`GPUS`);
- what crosses to and from the worker crosses as a pickle: the call's arguments, what it yields
  and returns (`crossed`), so each is a copy, and one that cannot be pickled fails;
- an error other than a `gr.Error` comes back as "ZeroGPU worker error" with its class's name alone;
- a generator learns of Stop (the page closing it) when it hands over its next value, which is
  dropped: it then closes.
What it cannot keep on a CPU: the GPU itself and the forked worker process (its own copy of the
page's memory, and its reuse by a later call).
`CALLS` records every call (visitor, declared, charged and elapsed seconds) for the tests to check.
SPACES_STANDIN_QUOTA_S sets the daily quota at import (`make space-check` uses a short one to
reach a used-up quota in a few clicks), SPACES_STANDIN_DURATION_FACTOR the factor.
"""

import contextlib
import functools
import inspect
import os
import pickle
import threading
import time
from datetime import timedelta


def from_environment() -> tuple[int, float]:
    """The daily quota (a visitor without a login: 120 s) and the GPU kind's factor the environment sets."""
    return (int(os.environ.get("SPACES_STANDIN_QUOTA_S", "120")),
            float(os.environ.get("SPACES_STANDIN_DURATION_FACTOR", "1.0")))


QUOTA_S, DURATION_FACTOR = from_environment()  # a visitor's seconds a day; the GPU kind's, a declared second
TIER_MAX_S = 120  # the longest call the tier allows
USED: dict[str, float] = {}  # visitor -> seconds charged today
CALLS: list[dict] = []
LOCK = threading.Lock()
GPUS = threading.Semaphore(1)  # the Space's GPUs: a call waits in the queue for one, uncharged and untimed
INSIDE = threading.local()  # INSIDE.call: True while this thread runs a GPU call


def inside() -> bool:
    """Whether the calling thread is inside a GPU call."""
    return getattr(INSIDE, "call", False)


def reset(quota_s: int | None = None, duration_factor: float | None = None) -> None:
    """A new day on a GPU kind of `duration_factor`: every visitor's quota back, the calls forgotten.
    A value not given is the environment's, as at import."""
    global QUOTA_S, DURATION_FACTOR
    quota, factor = from_environment()
    QUOTA_S = quota if quota_s is None else quota_s
    DURATION_FACTOR = factor if duration_factor is None else duration_factor
    USED.clear()
    CALLS.clear()


def visitor() -> str:
    from gradio.context import LocalContext

    request = LocalContext.request.get(None)
    if request is None:
        return "local"
    return request.headers.get("x-ip-token") or (request.client.host if request.client else "local")


def schedule(seconds: float) -> tuple[str, int]:
    """The platform's pre-check: refuse before the call runs, or charge its declared whole seconds
    times the duration factor; the visitor and the seconds charged (which the call is granted)."""
    import gradio as gr

    who, requested = visitor(), round(int(seconds) * DURATION_FACTOR)
    if requested > TIER_MAX_S:
        raise gr.Error(f"The requested GPU duration ({requested}s) is larger than the maximum allowed",
                       title="ZeroGPU illegal duration")
    with LOCK:
        left = QUOTA_S - USED.get(who, 0)
        if requested > left:
            raise gr.Error(f"You have exceeded your ZeroGPU quota ({requested}s requested vs. {max(0, round(left))}s "
                           f"left). Try again in {timedelta(hours=23, minutes=59, seconds=12)}. ",
                           title="ZeroGPU quota exceeded")
        USED[who] = USED.get(who, 0) + requested
    return who, requested


def crossed(value):
    """`value` as the other process receives it: through a pickle."""
    return pickle.loads(pickle.dumps(value))


def worker_error(error: Exception) -> Exception:
    """What the page receives for `error` raised in a GPU call: a `gr.Error` as it is, any other as
    the platform's "ZeroGPU worker error" naming its class alone."""
    import gradio as gr

    return error if isinstance(error, gr.Error) else gr.Error(type(error).__name__, title="ZeroGPU worker error")


def GPU(task=None, duration=60, size=None):  # noqa: N802 (the real package's name)
    if task is None:
        return functools.partial(GPU, duration=duration, size=size)

    def declared(*args, **kwargs) -> float:
        value = duration(*args, **kwargs) if callable(duration) else duration
        return value.total_seconds() if isinstance(value, timedelta) else float(value)

    if inspect.isgeneratorfunction(task):
        @functools.wraps(task)
        def generator(*args, **kwargs):
            seconds = declared(*args, **kwargs)
            who, granted = schedule(seconds)
            GPUS.acquire()
            started = time.monotonic()
            INSIDE.call = True
            try:
                items = task(*crossed(args), **crossed(kwargs))
                while True:
                    try:
                        item = crossed(next(items))
                    except StopIteration:
                        break
                    except Exception as error:  # noqa: BLE001 -- as the worker sends it back
                        raise worker_error(error) from None
                    INSIDE.call = False
                    try:
                        # the page draws what a GPU call yields outside it, as the real worker's queue hands it over
                        yield item
                    except GeneratorExit:  # Stop: the worker learns of it at its next value, drops it and closes
                        INSIDE.call = True
                        with contextlib.suppress(Exception):
                            next(items)
                        items.close()
                        raise
                    INSIDE.call = True
            finally:
                INSIDE.call = False
                CALLS.append({"visitor": who, "declared_s": seconds, "charged_s": granted,
                              "elapsed_s": time.monotonic() - started})
                GPUS.release()

        return generator

    @functools.wraps(task)
    def function(*args, **kwargs):
        seconds = declared(*args, **kwargs)
        who, granted = schedule(seconds)
        with GPUS:
            started = time.monotonic()
            INSIDE.call = True
            try:
                return crossed(task(*crossed(args), **crossed(kwargs)))
            except Exception as error:  # noqa: BLE001 -- as the worker sends it back
                raise worker_error(error) from None
            finally:
                INSIDE.call = False
                CALLS.append({"visitor": who, "declared_s": seconds, "charged_s": granted,
                              "elapsed_s": time.monotonic() - started})

    return function
