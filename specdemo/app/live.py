"""Running methods for the app: one request's settings checked, its events collected, the AR
baseline measured on the same prompt, and the numbers a person sees. No decoding happens here:
this module only calls a method's generator and reads its events.
"""

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from specdemo.app.limits import LIMITS, budget, time_left
from specdemo.core.errors import SpecDemoError, check_whole
from specdemo.core.events import StepEvent, Summary, committed_by_origin, final_summary
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.core.static import CompiledPass
from specdemo.core.threads import let_workers_go
from specdemo.defaults import defaults_for, with_defaults
from specdemo.divergence import SUSPECT_MARGIN, Divergence, divergences, first_difference  # noqa: F401 (the app reads them here)
from specdemo.methods import METHODS, ar, cllm, companion, decoded, get_method, method_options
from specdemo.models import LoadedModel

# Per-request limits of the app, so one visitor cannot hold the model for long (specdemo.app.limits).
MAX_PROMPT_CHARS = LIMITS.max_prompt_chars
MAX_NEW_TOKENS = LIMITS.max_new_tokens

@dataclass(frozen=True)
class Request:
    """What a person asked for: a prompt, a method and its settings."""

    prompt: str
    method: str = "ar"
    max_new_tokens: int = 128
    sampling: SamplingConfig = GREEDY
    settings: dict = field(default_factory=dict)  # only the method's own settings (`MethodSpec.settings`)

    def __post_init__(self):
        check_request(self)


def check_request(request: Request) -> None:
    """Refuse, with a sentence, what the app does not serve (the methods check the rest)."""
    if not isinstance(request.prompt, str) or not request.prompt.strip():
        raise SpecDemoError("the prompt is empty: type something for the model to answer")
    if len(request.prompt) > MAX_PROMPT_CHARS:
        raise SpecDemoError(f"the prompt is {len(request.prompt)} characters long; this app takes at most "
                            f"{MAX_PROMPT_CHARS}")
    if not isinstance(request.method, str) or request.method not in METHODS:
        raise SpecDemoError(f"unknown method {request.method!r}: choose one of {', '.join(METHODS)}")
    tokens = request.max_new_tokens
    check_whole("max_new_tokens", tokens, 1, MAX_NEW_TOKENS)
    if request.sampling.do_sample and not samples(request):
        raise SpecDemoError(
            f"{request.method} picks its tokens deterministically (greedy verification or a greedy search), so it does "
            "not sample: turn sampling off, or choose "
            f"{' or '.join(sorted(m for m, spec in METHODS.items() if spec.samples))}"
        )
    if not request.sampling.do_sample and request.sampling != GREEDY and not processes(request):
        raise SpecDemoError(
            f"{request.method} does not apply a repetition penalty or n-gram blocking: reset them, "
            f"or choose {' or '.join(sorted(m for m, spec in METHODS.items() if spec.processors))}"
        )
    unknown = set(request.settings) - set(METHODS[request.method].settings)
    if unknown:
        raise SpecDemoError(f"{request.method} has no setting {', '.join(sorted(unknown))}")


# What the page's controls allow, and so what a value sent to the API may be (a sentence otherwise).
RANGES = {"max_new_tokens": (1, MAX_NEW_TOKENS), "temperature": (0.05, 2.0), "top_k": (0, 200), "top_p": (0.05, 1.0),
          "repetition_penalty": (0.5, 2.0), "seed": (-1, 2**63 - 1), "no_repeat_ngram_size": (0, 6)}


def whole(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """`value` as a whole number within RANGES[name] (or low..high), or a sentence naming the setting.
    A float with a whole value (1.0, as JSON clients send) is taken; True, 1.5, NaN or "3" are not."""
    low, high = (low, high) if low is not None else RANGES[name]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return check_whole(name, value, low, high)


def number(name: str, value, low: float | None = None, high: float | None = None) -> float:
    """`value` as a number within RANGES[name] (or low..high), or a sentence naming the setting (NaN is refused)."""
    low, high = (low, high) if low is not None else RANGES[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise SpecDemoError(f"{name} must be a number from {low} to {high}, got {value!r}")
    return float(value)


def flag(name: str, value) -> bool:
    """`value` as a yes/no setting: a bool, or a sentence naming the setting (the string "false"
    would otherwise read as true)."""
    if not isinstance(value, bool):
        raise SpecDemoError(f"{name} must be true or false (a JSON boolean), got {value!r}")
    return value


def text(name: str, value) -> str:
    if not isinstance(value, str):
        raise SpecDemoError(f"{name} must be text, got {type(value).__name__} {value!r}")
    return value


def race_methods(methods) -> list[str]:
    """The methods a race runs against AR: known ones, each once, in the page's order. A list
    repeated 300 times races each method once; anything that is not a list of names is refused."""
    if (isinstance(methods, str) or not isinstance(methods, (list, tuple))
            or not all(isinstance(m, str) for m in methods)):
        raise SpecDemoError(f"methods must be a list of method names, got {methods!r}")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SpecDemoError(f"unknown method {', '.join(map(repr, unknown))}: a race takes methods from "
                            f"{', '.join(METHODS)}")
    chosen = [m for m in METHODS if m in set(methods) and m != "ar"]
    if not chosen:
        raise SpecDemoError("choose at least one method to race against ar")
    return chosen


def sampling_from(do_sample, temperature, top_k, top_p, repetition_penalty, seed,
                  no_repeat_ngram_size=0) -> SamplingConfig:
    """The sampling settings as the page or an API client sent them, each checked against RANGES
    (a sentence naming the setting otherwise); GREEDY when nothing changes greedy decoding.
    A seed of -1 (or None) draws a random one."""
    do_sample, penalty, ngram = (flag("do_sample", do_sample), number("repetition_penalty", repetition_penalty),
                                 whole("no_repeat_ngram_size", no_repeat_ngram_size))
    temperature, top_k, top_p = number("temperature", temperature), whole("top_k", top_k), number("top_p", top_p)
    seed = None if seed is None else whole("seed", seed)
    if not do_sample and penalty == 1.0 and not ngram:
        return GREEDY
    return SamplingConfig(do_sample, temperature, top_k, top_p, penalty, None if seed is None or seed < 0 else seed,
                          ngram)


def samples(request: Request) -> bool:
    """Whether the method takes sampling settings: exactly (ar, speculative), or Medusa with its
    typical acceptance, an explicit opt-in because it does not keep the target's distribution."""
    spec = METHODS[request.method]
    return spec.samples or bool(spec.samples_when and request.settings.get(spec.samples_when))


def processes(request: Request) -> bool:
    """Whether the method takes the logits processors (repetition penalty, n-gram blocking)."""
    return METHODS[request.method].processors or samples(request)


def run(target: LoadedModel, request: Request, stop: threading.Event | None = None) -> Iterator[StepEvent | Summary]:
    """The method's events for this request, until `stop` is set: the click's budget
    (`limits.budget`), shared with the click's other runs; without one, a budget of its own. Its
    settings are the device's defaults (`specdemo.defaults`) and the request's."""
    stop = budget() if stop is None else stop
    generate, options = get_method(request.method).generate, method_options(request.method, target)
    sampling = {"sampling": request.sampling} if processes(request) else {}
    yield from generate(
        target.model,
        target.encode_chat(request.prompt),
        max_new_tokens=request.max_new_tokens,
        eos_token_ids=target.eos_token_ids,
        stop=stop,
        passes=target.passes,
        **sampling,
        **options,
        **with_defaults(defaults_for(target.device), request.method, request.settings),
    )


def collect(events: Iterator[StepEvent | Summary]) -> tuple[list[StepEvent], Summary]:
    steps, summary = [], None
    for item in events:
        if isinstance(item, StepEvent):
            steps.append(item)
        else:
            summary = item
    return steps, summary


class Baselines:
    """AR runs of the target, measured on the same prompt and settings as the run they are
    compared with, kept per (model, precision, placement, device, prompt, max_new_tokens, sampling)
    so a person waits for each once: a float32 run is never compared with bfloat16's AR answer, nor
    a model offloaded to disk with its twin in memory, nor a run on the CPU (a click ZeroGPU
    refused) with the GPU's."""

    def __init__(self, size: int = 64):
        self.size = size
        self.runs: dict[tuple, tuple[list[StepEvent], Summary]] = {}
        self.lock = threading.Lock()

    @staticmethod
    def key(target: LoadedModel, request: Request) -> tuple:
        return (target.spec, target.dtype, target.placed is not None, target.device.type, request.prompt,
                request.max_new_tokens, request.sampling)

    def known(self, target: LoadedModel, request: Request) -> tuple[list[StepEvent], Summary] | None:
        """The AR run kept for this request's prompt and settings, or None."""
        with self.lock:
            return self.runs.get(self.key(target, request))

    @staticmethod
    def ar_request(request: Request) -> Request:
        return Request(request.prompt, "ar", request.max_new_tokens, request.sampling)

    def put(self, target: LoadedModel, request: Request, measured: tuple[list[StepEvent], Summary]) -> None:
        """Keep an AR run measured elsewhere (the app streams it, drawn as the run it is compared with)."""
        with self.lock:
            if len(self.runs) >= self.size:
                self.runs.pop(next(iter(self.runs)))
            self.runs[self.key(target, request)] = measured


def own_reference(target: LoadedModel, request: Request, stop: threading.Event | None = None) -> Summary | None:
    """For a method that decodes other weights than the target's (cllm), greedy AR on those
    weights: the answer it must equal. None for the others, whose reference is the target's AR."""
    model, passes = decoded(request.method, target)
    return None if model is target.model else greedy_answer(model, target, request, stop, passes)


def amateur_reference(target: LoadedModel, request: Request, stop: threading.Event | None = None) -> Summary | None:
    """For contrastive decoding, the amateur's own greedy answer, shown beside the expert's (AR's)
    so a person sees what the contrast changed; None for the other methods."""
    amateur = method_options(request.method, target).get("amateur")
    return None if amateur is None else greedy_answer(amateur, target, request, stop)


def greedy_answer(model, target: LoadedModel, request: Request, stop: threading.Event | None = None,
                  passes: CompiledPass | None = None) -> Summary:
    """Greedy AR of `model` (a model of the target's vocabulary; `passes`, its compiled pass) on the
    request's prompt, within the click's budget `stop` (default: a budget of its own)."""
    input_ids = target.encode_chat(request.prompt)
    stop = budget() if stop is None else stop
    return final_summary(ar.generate(model, input_ids, max_new_tokens=request.max_new_tokens,
                                     eos_token_ids=target.eos_token_ids, stop=stop, passes=passes))


def cllm_quality(target: LoadedModel, request: Request) -> dict | None:
    """For a CLLM request, the quality check stored with the target's CLLM (`cllm.quality`), else None."""
    if request.method != "cllm":
        return None
    try:
        return cllm.quality(companion(target, "cllm"))
    except SpecDemoError:  # no CLLM for this target: the run itself says so
        return None


def divergence_from(target: LoadedModel, request: Request, tokens, reference_tokens) -> Divergence | None:
    """Where a greedy answer first parts from its reference answer (AR on the weights it decodes),
    with AR's logit margin there (`divergence.divergences`); None when they are equal, when one
    only stops earlier, or when the request samples (a sampled answer may differ anyway)."""
    if request.sampling.do_sample or first_difference(tokens, reference_tokens) is None:
        return None
    model, passes = decoded(request.method, target)
    return divergences(model, target.encode_chat(request.prompt), list(reference_tokens), {"other": list(tokens)},
                       passes)["other"]


def stats(events: list[StepEvent], summary: Summary | None = None) -> dict:
    """What a person reads off a run: tokens, passes, time, and the rates that follow."""
    tokens = sum(len(e.committed) for e in events)
    passes = events[-1].target_forwards if events else 0
    wall_s = summary.elapsed_s if summary else (events[-1].elapsed_s if events else 0.0)
    proposed = sum(len(e.proposed) for e in events)
    accepted = sum(len(e.accepted) for e in events)
    return {
        "method": events[0].method if events else (summary.method if summary else None),
        "tokens": tokens,
        "forward_passes": passes,
        "draft_forwards": events[-1].draft_forwards if events else 0,
        "wall_s": round(wall_s, 3),
        "tokens_per_s": round(tokens / wall_s, 2) if wall_s else 0.0,
        "tokens_per_forward": round(tokens / passes, 3) if passes else 0.0,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": round(accepted / proposed, 3) if proposed else None,
        "finish_reason": summary.finish_reason if summary else None,
        "origins": committed_by_origin(events),
    }


def speedup(run_stats: dict, baseline_stats: dict) -> float | None:
    """Tokens/s over the AR baseline's tokens/s on the same prompt."""
    if not run_stats["tokens_per_s"] or not baseline_stats["tokens_per_s"]:
        return None
    return round(run_stats["tokens_per_s"] / baseline_stats["tokens_per_s"], 3)


def timed_events(
    events: Iterator[StepEvent | Summary], every_s: float, stop: threading.Event
) -> Iterator[tuple[list[StepEvent], Summary | None]]:
    """The events so far, every `every_s` seconds while they come and once at the end.

    The method runs in a worker thread, so the page updates while it decodes; this thread only
    waits, so its OpenMP workers go first (`threads.let_workers_go`: kept, they would slow the
    worker's decoding). On a CPU, drawing still takes some of decoding's time, and not alike from
    run to run, so a speedup is measured on undrawn runs (`timing_rounds`). Closing this generator (the
    Stop button) sets `stop`, which the method checks before each target pass."""
    steps: list[StepEvent] = []
    outcome: dict = {}

    def drain() -> None:
        try:
            for item in events:
                if isinstance(item, Summary):
                    outcome["summary"] = item
                else:
                    steps.append(item)
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error

    worker = threading.Thread(target=drain, daemon=True)
    let_workers_go()
    worker.start()
    try:
        shown = 0
        while worker.is_alive():
            worker.join(every_s)
            if worker.is_alive() and len(steps) > shown:
                shown = len(steps)
                yield steps[:shown], None
        if "error" in outcome:
            raise outcome["error"]
        yield list(steps), outcome.get("summary")
    finally:
        if worker.is_alive():  # closed early (Stop) or failed: end the method between two passes
            stop.set()
        worker.join()


# Timing: a method and its AR baseline are timed the same way, in rounds that alternate their
# order (a slow spell of the machine hits both alike), without drawing the page, and as many
# rounds as fit MEASURE_S (LIMITS.timing_s; at least MIN_ROUNDS, at most MAX_ROUNDS): the page shows the median
# and the spread, so a run of AR against itself reads 1.0x within its spread.
MEASURE_S = LIMITS.timing_s
MIN_ROUNDS = 3
MAX_ROUNDS = 7
TICK_S = 0.5  # while a timed run goes on, the caller hears from it this often
MARGIN_S = 5.0  # of the click's budget, kept for what follows the timing (reference runs, drawing)


@dataclass(frozen=True)
class Spread:
    """A ratio of speeds measured over runs: the median run's, and the lowest and highest that
    any pairing of the runs gives (the slowest run of one against the fastest of the other)."""

    median: float
    low: float
    high: float
    runs: int  # runs of each side

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def spread(speeds: list[float], baseline_speeds: list[float]) -> Spread | None:
    """`speeds` against `baseline_speeds` (tokens/s of repeated runs), or None without both."""
    if not speeds or not baseline_speeds or min(baseline_speeds) <= 0:
        return None
    return Spread(median(speeds) / median(baseline_speeds), min(speeds) / max(baseline_speeds),
                  max(speeds) / min(baseline_speeds), min(len(speeds), len(baseline_speeds)))


def rounds_for(one_round_s: float, measure_s: float | None = None, least: int | None = None,
               most: int = MAX_ROUNDS) -> int:
    """How many timing rounds to run when one takes `one_round_s`: as many as fit `measure_s`, within least..most."""
    measure_s, least = MEASURE_S if measure_s is None else measure_s, MIN_ROUNDS if least is None else least
    fitting = int(measure_s // one_round_s) if one_round_s > 0 else most
    return max(least, min(most, fitting))


def timing_rounds(
    target: LoadedModel, requests: list[Request], stop: threading.Event, measure_s: float | None = None,
    least: int | None = None
) -> Iterator[tuple[int, int, int, list[list[tuple[list[StepEvent], Summary]]]]]:
    """Run every request once a round, the order reversed every other round, undrawn. After each
    run, and every TICK_S while one goes on, (round, rounds planned, runs done this round, per
    request its runs of the whole rounds so far). The first round's time decides how many follow
    (`rounds_for`). Ends early, keeping whole rounds only, when `stop` is set."""
    measure_s, least = MEASURE_S if measure_s is None else measure_s, MIN_ROUNDS if least is None else least
    runs: list[list[tuple[list[StepEvent], Summary]]] = [[] for _ in requests]
    planned, done = least, 0
    while done < planned:
        started, order = time.perf_counter(), list(enumerate(requests))
        measured = []
        for index, request in order if done % 2 == 0 else order[::-1]:
            # in a worker thread, as the page's streamed runs: a tick now and then lets the caller close
            # this generator (the Stop button), which stops the run between two passes
            for events, summary in timed_events(run(target, request, stop), TICK_S, stop):  # noqa: B007 (the last pair is the run)
                if summary is None:
                    yield done + 1, planned, len(measured), runs
            if summary is None or summary.finish_reason == "stopped":
                return
            measured.append((index, (events, summary)))
            if len(measured) < len(requests):
                yield done + 1, planned, len(measured), runs
        for index, result in measured:
            runs[index].append(result)
        done += 1
        if done == 1:
            round_s, left = time.perf_counter() - started, time_left(stop) - MARGIN_S
            planned = rounds_for(round_s, measure_s, least)
            # never more rounds than the click's budget still holds (fewer than `least`, if need be)
            if math.isfinite(left) and round_s > 0:
                planned = min(planned, 1 + int(max(0.0, left) // round_s))
        yield done, planned, len(requests), runs


def speeds(runs: list[tuple[list[StepEvent], Summary]]) -> list[float]:
    """Tokens/s of each run."""
    return [stats(events, summary)["tokens_per_s"] for events, summary in runs]


def median_run(runs: list[tuple[list[StepEvent], Summary]]) -> tuple[list[StepEvent], Summary]:
    """The run of median speed (the slower of the two middle ones), the one a replay shows."""
    ordered = sorted(runs, key=lambda result: stats(*result)["tokens_per_s"])
    return ordered[(len(ordered) - 1) // 2]
