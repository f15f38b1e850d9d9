"""ZeroGPU, the shared GPUs of a free Hugging Face Space: what a click declares, and what a refusal means.

The platform's rules, as the `spaces` package applies them (`spaces/zero/client.py`):
- A GPU call declares its duration before it runs. The platform charges the declared seconds,
  times its GPU kind's duration factor (`spaces/zero/configs.json`: 1.0 on an H200, 1.5 on an
  RTX PRO 6000, whose calls it also grants that much longer), to the visitor's daily quota (120 s
  without a login) and refuses the call when they exceed what is left ("ZeroGPU quota exceeded")
  or the tier's maximum ("ZeroGPU illegal duration"); a call that waited too long for a GPU is
  refused too ("ZeroGPU queue timeout"). A shorter declaration also queues ahead of a longer one.
- Every call runs in a forked worker process, fresh or one an earlier call used that the platform
  kept while its GPU was idle (`spaces/zero/wrappers.py`): what a call captures lives on only in
  that worker, which may or may not serve the next one.

So a click declares what it will run, not a constant (`plan_click`): its passes at the pass cost
measured on this device, its timing rounds, the setup of a fresh process and a margin, within
`LIMITS.gpu_max_s` of the visitor's quota, whatever the factor (`plan_for`). What cannot fit is
shortened first in timing, then in new tokens, and the page says so. A refused click runs on the
CPU instead (`refused`, `refusal_sentence`).
"""

import importlib.util
import json
import math
import multiprocessing
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

REFUSALS = ("ZeroGPU quota exceeded", "ZeroGPU illegal duration", "ZeroGPU queue timeout", "ZeroGPU client error",
            "ZeroGPU pending credits exceeded")
# a fresh process's share (attaching the GPU, moving the model, capturing the graphs) until a call measured it
SETUP_S = 4.0
MARGIN_S = 2.0  # the last pass, and the wobble of a shared GPU
PASS_S = 0.03  # seconds a target pass, until this device measured its own (an eager GPU pass of the embedded model)
SHORTEST_ANSWER = 16  # new tokens a shortened click keeps at least
LONGEST_CALL_S = 120  # the longest call ZeroGPU's tiers allow: a worker older than that is no fresh one


@dataclass(frozen=True)
class GpuPlan:
    """What one click asks of the GPU: its declared seconds and what it runs within them."""

    declared_s: float
    max_new_tokens: int
    measure_s: float  # seconds of timing rounds (0: the streamed runs' speed, no spread)
    note: str = ""  # what was shortened, or why the click runs on the CPU, for the page ("" when neither)
    on_cpu: bool = False  # ZeroGPU refused the click: it runs on the Space's CPU
    factor: float = 1.0  # the seconds ZeroGPU charges and grants a declared second (`duration_factor`)
    before_s: float = 0.0  # what the call's worker spent before its function, set in the call (`before_the_call_s`)

    @property
    def granted_s(self) -> float:
        """The seconds the call may run: what it declared, times the factor."""
        return self.declared_s * self.factor


def on_zerogpu() -> bool:
    """Whether the app runs on ZeroGPU (or its stand-in): the `spaces` package is installed and the
    platform says so, as the package reads it (`spaces/config.py`: SPACES_ZERO_GPU "1", "t" or
    "true"). Installed alone (any Gradio Space, a laptop), `spaces.GPU` does nothing."""
    zero = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
    return zero and importlib.util.find_spec("spaces") is not None


def at_start(device: str | None, compile_passes: bool | None) -> tuple[str | None, bool | None]:
    """The app's device and capture at start. On ZeroGPU, `spaces` is imported first (it lends CUDA
    to GPU calls and stands in for it outside them), the model goes to cuda as the platform expects,
    and nothing is captured at start, whatever is asked: outside a GPU call there is no CUDA to
    capture on, and GPU calls run in worker processes of their own, where a graph stays. Elsewhere
    (or on the CPU a command line asks for), as given."""
    if not on_zerogpu():
        return device, compile_passes
    import spaces  # noqa: F401

    device = device or "cuda"
    return device, compile_passes if device == "cpu" else False


def before_the_call_s(served: set[int], stat: Path = Path("/proc/self/stat"),
                      uptime: Path = Path("/proc/uptime")) -> float:
    """Seconds a GPU call's worker ran before its function: ZeroGPU counts a call's duration from
    when it grants the GPU, then forks the worker, which attaches the GPU and moves the model in
    before the function starts. The worker's age at its first call, read from Linux's /proc
    (`stat`'s start time, in clock ticks since boot, against `uptime`), after which the process
    joins `served` (the workers that have run a call); 0 in a worker an earlier call used (ZeroGPU
    reuses an idle one, whose function starts at once), in the page's own process (the stand-in's
    calls), and off Linux."""
    if multiprocessing.parent_process() is None or os.getpid() in served:
        return 0.0
    served.add(os.getpid())
    try:
        started = int(stat.read_text().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        age = float(uptime.read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return 0.0
    return age if 0.0 <= age <= LONGEST_CALL_S else 0.0


def unplanned(max_new_tokens: int, measure_s: float) -> GpuPlan:
    """A click off ZeroGPU: nothing declared, nothing shortened."""
    return GpuPlan(0.0, max_new_tokens, measure_s)


def plan_for(runs: int, max_new_tokens: int, measure_s: float, cap_s: float, methods: tuple[str, ...] = ()) -> GpuPlan:
    """The click's plan: on ZeroGPU `plan_click` at this device's kept pass cost, with a fresh
    process's setup as kept: the worker's start, the target's graphs, and the companions of each of
    `methods` (none before a call measured them); elsewhere `unplanned`. `cap_s` bounds what the
    click charges the visitor: on a GPU kind with a duration factor it declares its seconds divided
    by the factor, which the platform grants and charges multiplied."""
    if not on_zerogpu():
        return unplanned(max_new_tokens, measure_s)
    setup_s = (kept("start_s", 0.0) + kept("setup_s", SETUP_S)
               + sum(kept(companions_key(method), 0.0) for method in set(methods)))
    factor = duration_factor()
    # whole seconds the call may run: a whole number of declared seconds, times the factor, within the cap
    runnable = math.floor(math.floor(cap_s / factor) * factor)
    plan = plan_click(runs, max_new_tokens, measure_s, kept("pass_s", PASS_S), runnable, setup_s)
    return replace(plan, declared_s=math.ceil(plan.declared_s / factor), factor=factor)


def whole_cap(cap_s: float) -> GpuPlan:
    """A plan that declares all of `cap_s` the factor allows (a click that measures what it runs for)."""
    factor = duration_factor()
    return GpuPlan(math.floor(cap_s / factor), 0, 0.0, factor=factor)


def duration_factor() -> float:
    """What ZeroGPU charges, and grants, for each declared second on this Space's GPU kind (the
    `spaces` package's own config); 1.0 where the package does not say."""
    try:
        from spaces.zero.config import get_config

        return float(get_config()["duration_factor"])
    except Exception:  # noqa: BLE001 -- an older or another package: a second is a second
        return 1.0


def companions_key(method: str) -> str:
    """The name under which a GPU call keeps what loading `method`'s companions took (`keep`, `kept`)."""
    return f"companions_s {method}"


def gpu_call(function):
    """`function(plan, ...)` as a ZeroGPU call declaring `plan.declared_s`; elsewhere, as is. A
    generator stays a generator."""
    if not on_zerogpu():
        return function
    import spaces

    return spaces.GPU(duration=lambda plan, *args, **kwargs: plan.declared_s)(function)


def with_cpu_fallback(gpu_function, cpu_function, plan: GpuPlan, *args):
    """Yield what `gpu_function(plan, *args)` yields; if ZeroGPU refuses it before it runs, what
    `cpu_function` yields for the same click on the CPU (`on_the_cpu`)."""
    try:
        yield from gpu_function(plan, *args)
    except Exception as error:  # noqa: BLE001 -- only ZeroGPU's refusals are caught; the rest goes on up
        if not refused(error):
            raise
        yield from cpu_function(on_the_cpu(plan, error), *args)


def call_with_cpu_fallback(gpu_function, cpu_function, plan: GpuPlan, *args):
    """`with_cpu_fallback` for a function that returns instead of yielding."""
    try:
        return gpu_function(plan, *args)
    except Exception as error:  # noqa: BLE001 -- as above
        if not refused(error):
            raise
        return cpu_function(on_the_cpu(plan, error), *args)


def on_the_cpu(plan: GpuPlan, refusal: BaseException) -> GpuPlan:
    """The plan of a click ZeroGPU refused, run on the CPU instead: it declares nothing, so its
    deadline is the CPU's budget, not the GPU seconds it asked for, and it says why it runs there."""
    return replace(plan, declared_s=0.0, note=refusal_sentence(refusal), on_cpu=True)


def state_file() -> Path:
    """Where what this device measured is kept between ZeroGPU's processes (`kept`, `keep`)."""
    return Path(os.environ.get("SPECDEMO_STATE", Path.home() / ".cache" / "specdemo")) / "pass_cost.json"


def kept(name: str, default: float) -> float:
    """A cost this device measured in an earlier GPU call ("pass_s": seconds a target pass;
    "start_s": what a fresh worker spent before its call, `before_the_call_s`; "setup_s": seconds a
    call took to capture the target's graphs; `companions_key(method)`: to load a method's
    companions and capture their graphs), `default` before the first."""
    try:
        return float(json.loads(state_file().read_text())[name])
    except (OSError, ValueError, KeyError, TypeError):
        return default


def keep(**seconds: float) -> None:
    """Keep costs measured in a GPU call (a forked process writes them; the next click's plan reads them)."""
    try:
        known = json.loads(state_file().read_text())
    except (OSError, ValueError):
        known = {}
    try:
        state_file().parent.mkdir(parents=True, exist_ok=True)
        # written aside, then renamed: a plan read meanwhile finds the old file whole, never half the new one
        aside = state_file().with_suffix(f".{os.getpid()}.tmp")
        aside.write_text(json.dumps({**known, **seconds}))
        os.replace(aside, state_file())
    except OSError:
        pass  # a read-only disk: the next plan uses the defaults


def decode_seconds(runs: int, max_new_tokens: int, pass_s: float) -> float:
    """Seconds `runs` decodes of up to `max_new_tokens` take at `pass_s` a target pass, at worst: a
    pass a token, the prompt's pass, and as much again for a method's drafts or heads."""
    return runs * 2 * (max_new_tokens + 1) * pass_s


def plan_click(runs: int, max_new_tokens: int, measure_s: float, pass_s: float, cap_s: float,
               setup_s: float = SETUP_S) -> GpuPlan:
    """The GPU time a click of `runs` decodes (the method, its AR baseline, a race's methods) of
    `max_new_tokens` with `measure_s` of timing rounds declares, with `setup_s` for a fresh process,
    within `cap_s`: the timing shrinks first, then the answer, down to SHORTEST_ANSWER tokens."""
    fixed = setup_s + MARGIN_S

    def total(tokens: int, measure: float) -> float:
        return fixed + decode_seconds(runs, tokens, pass_s) + measure

    if total(max_new_tokens, measure_s) <= cap_s:
        return GpuPlan(math.ceil(total(max_new_tokens, measure_s)), max_new_tokens, measure_s)
    measure = max(0.0, cap_s - total(max_new_tokens, 0.0))
    if measure > 0:
        return GpuPlan(math.ceil(total(max_new_tokens, measure)), max_new_tokens, measure,
                       f"timed for {measure:.0f} s instead of {measure_s:.0f} s to fit this Space's GPU time of "
                       f"{cap_s:.0f} s a click")
    room = (cap_s - fixed) / (runs * 2 * pass_s) - 1
    tokens = max(SHORTEST_ANSWER, min(max_new_tokens, int(room)))
    return GpuPlan(min(cap_s, math.ceil(total(tokens, 0.0))), tokens, 0.0,
                   f"shortened to {tokens} new tokens, untimed, to fit this Space's GPU time of {cap_s:.0f} s a click")


def refused(error: BaseException) -> bool:
    """Whether `error` is ZeroGPU refusing a call before it ran (a `gr.Error` with one of REFUSALS as its title)."""
    return getattr(error, "title", None) in REFUSALS


def refusal_sentence(error: BaseException) -> str:
    """One sentence for the page: why this answer runs on the CPU, and when the GPU quota comes back.
    The platform titles the visitor's quota, the Space's own limit and a GPU queue that timed out
    alike ("ZeroGPU quota exceeded"): only its message says the visitor's quota ("exceeded your")."""
    message = str(getattr(error, "message", "") or error)
    wait = re.search(r"Try again in ([0-9:.]+)", message)
    when = f" It comes back in {wait.group(1).split('.')[0]} (hours:minutes:seconds)." if wait else ""
    if getattr(error, "title", "") == "ZeroGPU quota exceeded" and "exceeded your" in message:
        return (f"Your free GPU time on this Space is used up for today, so this answer runs on the Space's CPU and is "
                f"slower.{when}")
    why = message.split(". ")[0].strip().rstrip(".") or getattr(error, "title", "ZeroGPU")
    return f"No GPU could take this click ({why}), so it runs on the Space's CPU and is slower.{when}"
