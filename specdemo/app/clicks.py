"""What a Generate click and a race decode, as data: the part of a click that runs in its GPU call.

On ZeroGPU a click's GPU call runs in a worker process of its own, and its seconds are charged to the
visitor's quota. So these generators decode and time, and yield plain records (runs, checks,
timings) that cross back to the page's process; `specdemo.app.handlers` draws them there, and the
race's replay runs there too. Nothing here draws.
"""

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace

from specdemo import passcost
from specdemo.app.limits import Deadline, time_left
from specdemo.app.live import (
    MARGIN_S,
    Baselines,
    Divergence,
    Request,
    Spread,
    amateur_reference,
    cllm_quality,
    collect,
    divergence_from,
    first_difference,
    median,
    median_run,
    own_reference,
    run,
    speeds,
    spread,
    stats,
    timed_events,
    timing_rounds,
)
from specdemo.app.zerogpu import GpuPlan, companions_key, keep, on_zerogpu
from specdemo.core.events import StepEvent, Summary
from specdemo.methods import METHODS, decoded, method_options
from specdemo.models import LoadedModel, capture, compiled, compiles

WARM_TOKENS = 8  # a warm-up answer's (`warmed`): after the prompt's pass, room for a static draft tree 6 deep
UPDATE_EVERY_S = 0.5  # a streamed run's records a second at most: drawing competes with decoding for the CPU
# what Measure times: passes of these widths after PASS_CONTEXT cached tokens, the median of PASS_REPEATS each, so that
# both models together take seconds, not minutes
PASS_WIDTHS, PASS_CONTEXT, PASS_REPEATS = (1, 4, 8, 16, 32), 64, 3


@dataclass(frozen=True)
class Preparing:
    """A GPU call getting ready before its first pass (`ready`): what it does now, for the page to say
    while the visitor waits."""

    what: str


@dataclass(frozen=True)
class Streaming:
    """A run so far: the AR baseline's (`baseline` None) or the method's, beside its baseline's events."""

    events: list[StepEvent]
    baseline: list[StepEvent] | None = None


@dataclass(frozen=True)
class Baseline:
    """The AR baseline's finished run, for the page to keep (`live.Baselines`)."""

    events: list[StepEvent]
    summary: Summary


@dataclass(frozen=True)
class Checks:
    """What a verdict needs that only the model can tell: the CLLM's stored quality, where a greedy
    answer parts from its reference and AR's margin there, the amateur's own answer."""

    own_weights: bool = False  # the method decodes other weights than the target's (cllm): `quality` is its verdict
    quality: dict | None = None
    divergence: Divergence | None = None
    amateur: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Answered:
    """The method's finished run, its AR baseline's and its checks."""

    events: list[StepEvent]
    summary: Summary
    baseline_events: list[StepEvent]
    baseline_summary: Summary
    checks: Checks
    dtype: str  # the decoded model's, for the verdict's sentence on rounding


@dataclass(frozen=True)
class Timing:
    """Timing rounds under way: `done` of `runs` runs of round `round_` of `rounds`; `running`, the method running."""

    round_: int
    rounds: int
    done: int
    runs: int
    running: str = ""


@dataclass(frozen=True)
class Timed:
    """Generate's timing rounds, done: the speedup's spread, each side's median run's stats and speed,
    and the events of those two runs (undrawn, as the speedup was measured)."""

    measured: Spread | None
    method_stats: dict
    ar_stats: dict
    method_speed: float
    ar_speed: float
    method_events: list[StepEvent]
    ar_events: list[StepEvent]


@dataclass(frozen=True)
class Untimed:
    """No timing round fits what is left of the click (`left_s` seconds), or the plan has none."""

    left_s: float


@dataclass(frozen=True)
class Stopped:
    """Stop, or the click's deadline, ended the timing."""


@dataclass(frozen=True)
class Raced:
    """One method's part of a race: its median run, its timed runs' speeds and spread against AR,
    and how its answer compares with AR's and with its own reference (AR on its own weights)."""

    method: str
    events: list[StepEvent]
    summary: Summary
    stats: dict
    measured: Spread | None
    tokens_per_pass: list[float]
    differs: int | None = None
    reference: Summary | None = None
    own_differs: int | None = None
    divergence: Divergence | None = None


@dataclass(frozen=True)
class RaceOutcome:
    """A finished race: every method's part, AR first, and the CLLM's stored quality when it raced."""

    raced: list[Raced]
    quality: dict | None
    dtype: str


def planned(target: LoadedModel, plan: GpuPlan, on_cpu: Callable[[LoadedModel], LoadedModel],
            requests: tuple[Request, ...] = ()) -> Generator[Preparing, None, LoadedModel]:
    """The model a click of `requests` decodes, returned after `ready`'s records: the page's, or its
    twin on the CPU (`on_cpu`, the page's `Targets.on_cpu`) when ZeroGPU refused the click."""
    if plan.on_cpu and target.device.type != "cpu":
        return on_cpu(target)
    return (yield from ready(target, requests, plan.before_s))


def ready(target: LoadedModel, requests: tuple[Request, ...] = (),
          before_s: float = 0.0) -> Generator[Preparing, None, LoadedModel]:
    """The target a click of `requests` decodes on a GPU, returned before its first pass: in a ZeroGPU
    call's fresh process with its CUDA graphs captured (`models.capture`); wherever it has graphs,
    with the companions of the requests' methods loaded and whatever else a method captures at its
    first use with the request's settings captured too (`warmed`), so the answer a visitor watches
    and times captures nothing. Each part is announced as it starts (`Preparing`): the visitor
    waits for it, and Stop takes effect between parts. A ZeroGPU call keeps what each took for the
    next click's plan (`zerogpu.plan_for`), and a fresh worker's start (`before_s`, what it spent
    before the call): the next call may be a fresh process. A worker ZeroGPU reuses keeps the
    graphs its first call captured (`models.compiled`). On a CPU, or without graphs, the
    target as it is, and companions load at their first use."""
    if target.device.type != "cuda":
        return target
    fresh = on_zerogpu()
    # a fresh worker's start is kept apart: a reused one (ZeroGPU reuses an idle worker) has none to measure
    measured = {"start_s": before_s} if fresh and before_s else {}
    if fresh:
        if compiles(target):  # none kept from an earlier call of this worker; a model on disk has none to capture
            yield Preparing("capturing the model's CUDA graphs, once for each of ZeroGPU's worker processes")
            target, measured["setup_s"] = capture(target)
        else:
            target = compiled(target)  # the graphs an earlier call of this worker captured (or none: on disk)
    if measured:
        keep(**measured)
    if target.passes is None:
        return target
    firsts: dict[str, Request] = {}  # each method's first request
    for request in requests:
        firsts.setdefault(request.method, request)
    took = {}
    for request in firsts.values():
        if request.method != "ar":  # AR's graphs are the target's
            yield Preparing(f"getting {request.method} ready: its companions, and the graphs its settings need")
        started, before = time.perf_counter(), set(target.companions.loaded)
        method_options(request.method, target)
        warmed(target, request)
        # kept only where this call loaded them: ZeroGPU may hand a click a worker an earlier click warmed, where
        # they cost nothing, and the next click's may be fresh
        if set(target.companions.loaded) != before:
            took[companions_key(request.method)] = time.perf_counter() - started
    if fresh and took:  # one write of the state file for them all
        keep(**took)
    return target


def quietly(records: Generator):
    """What a generator of records returns, its records passed over (a call that shows none)."""
    while True:
        try:
            next(records)
        except StopIteration as end:
            return end.value


def warmed(target: LoadedModel, request: Request) -> None:
    """`request` answered `WARM_TOKENS` long, unless it is AR's (whose graphs are the target's): what
    its method captures at its first use with its settings (a draft tree's graph, Medusa's heads')
    is captured there, not in the steps a visitor watches and times."""
    if request.method != "ar":
        collect(run(target, replace(request, max_new_tokens=WARM_TOKENS)))


def kept(target: LoadedModel, summary: Summary | None) -> None:
    """On a GPU, keep what a target pass cost for the next click's plan (`zerogpu.keep`)."""
    if target.device.type == "cuda" and summary is not None and summary.target_forwards:
        keep(pass_s=summary.target_s / summary.target_forwards)


def dtype_of(target: LoadedModel) -> str:
    return str(target.dtype).removeprefix("torch.")


def divergence(target: LoadedModel, request: Request, summary: Summary, reference: Summary) -> Divergence | None:
    """Where a greedy answer that should equal `reference` parts from it, with AR's margin there;
    None when it equals it or the method is not meant to (`Method.other_answer`)."""
    if METHODS[request.method].other_answer:
        return None
    return divergence_from(target, request, summary.tokens, reference.tokens)


def checks(target: LoadedModel, request: Request, summary: Summary, baseline: Summary, stop: Deadline) -> Checks:
    """Generate's checks of a finished answer (`Checks`), run on the click's device within its deadline."""
    amateur = amateur_reference(target, request, stop)
    found = Checks(amateur=tuple(amateur.tokens) if amateur else None)
    if request.method == "ar" or METHODS[request.method].other_answer:
        return found
    if decoded(request.method, target)[0] is not target.model:  # a changed model (cllm): is it still a good one?
        return replace(found, own_weights=True, quality=cllm_quality(target, request))
    return replace(found, divergence=divergence(target, request, summary, baseline))


def generate_records(target: LoadedModel, baseline: tuple[list[StepEvent], Summary] | None, request: Request,
                     plan: GpuPlan, stop: Deadline) -> Iterator:
    """Generate's decoding: the AR baseline (unless the page kept it: `baseline`), then the method, each
    streamed as `Streaming` records; the `Answered` run; then both timed alike (`Timed`), or why not."""
    method_options(request.method, target)  # a missing companion is said now, not after the AR baseline
    if baseline is not None:
        baseline_events, baseline_summary = baseline
    else:
        for baseline_events, baseline_summary in timed_events(  # noqa: B007 (the last pair is the run)
                run(target, Baselines.ar_request(request), stop), UPDATE_EVERY_S, stop):
            yield Streaming(baseline_events)
        if baseline_summary is None or baseline_summary.finish_reason == "stopped":
            return
        yield Baseline(baseline_events, baseline_summary)
    for events, summary in timed_events(run(target, request, stop), UPDATE_EVERY_S, stop):
        if summary is None:
            yield Streaming(events, baseline_events)
    kept(target, summary)
    yield Answered(events, summary, baseline_events, baseline_summary,
                   checks(target, request, summary, baseline_summary, stop), dtype_of(target))
    if summary.finish_reason == "stopped":
        return
    # no round fits the click
    if not plan.measure_s or baseline_summary.elapsed_s + summary.elapsed_s > time_left(stop) - MARGIN_S:
        yield Untimed(time_left(stop))
        return
    timed = []
    for round_, rounds, done, timed in timing_rounds(  # noqa: B007
            target, [Baselines.ar_request(request), request], stop, plan.measure_s):
        yield Timing(round_, rounds, done, 2)
    if not timed or not timed[0]:  # Stop, or the click's deadline, ended the timing
        yield Stopped()
        return
    ar_runs, method_runs = timed
    method_median, ar_median = median_run(method_runs), median_run(ar_runs)
    yield Timed(spread(speeds(method_runs), speeds(ar_runs)), stats(*method_median), stats(*ar_median),
                median(speeds(method_runs)), median(speeds(ar_runs)), method_median[0], ar_median[0])


def race_records(target: LoadedModel, prompt: str, names: list[str], max_new_tokens: int, plan: GpuPlan, stop: Deadline,
         least_rounds: int) -> Iterator:
    """AR and each of `names`' methods, timed alike in rounds (`live.timing_rounds`, undrawn): a
    `Timing` record as runs go, then a `RaceOutcome` with each method checked against its
    reference, or `Stopped`."""
    requests = [Request(prompt, method, max_new_tokens) for method in names]
    timed = []
    for round_, rounds, done, timed in timing_rounds(target, requests, stop, plan.measure_s, least_rounds):  # noqa: B007
        order = names if round_ % 2 else names[::-1]  # timing_rounds reverses every other round
        yield Timing(round_, rounds, done, len(names), order[done] if done < len(names) else "")
    if not timed or not timed[0]:
        yield Stopped()
        return
    medians = [median_run(runs) for runs in timed]
    kept(target, medians[0][1])
    ar_speeds, baseline = speeds(timed[0]), medians[0][1]
    raced = []
    for request, runs, (events, summary) in zip(requests, timed, medians):
        shown = {**stats(events, summary), "tokens_per_s": median(speeds(runs))}
        part = Raced(request.method, events, summary, shown, spread(speeds(runs), ar_speeds),
                     [stats(*r)["tokens_per_forward"] for r in runs])
        if request.method != "ar":
            reference = own_reference(target, request, stop)
            part = replace(part, differs=first_difference(summary.tokens, baseline.tokens), reference=reference,
                           own_differs=first_difference(summary.tokens, reference.tokens) if reference else None,
                           divergence=divergence(target, request, summary, reference or baseline))
        raced.append(part)
    quality = cllm_quality(target, Request(prompt, "cllm", max_new_tokens)) if "cllm" in names else None
    yield RaceOutcome(raced, quality, dtype_of(target))


@dataclass(frozen=True)
class PassCosts:
    """Pass costs measured so far: {where the weights are: {tokens fed: milliseconds of one pass}}, of
    `widths` planned; `done` once the measuring has ended, with every width or as many as the click's time allowed."""

    costs: dict[str, dict[int, float]]
    widths: tuple[int, ...]
    device: str
    dtype: str
    done: bool = False


def as_it_is(target: LoadedModel, plan: GpuPlan, on_cpu: Callable[[LoadedModel], LoadedModel]) -> LoadedModel:
    """The model a measurement times: the page's as it is (an eager pass needs no captured graph),
    or its twin on the CPU (`on_cpu`) when ZeroGPU refused the click."""
    return on_cpu(target) if plan.on_cpu and target.device.type != "cpu" else target


def pass_cost_records(models: dict[str, LoadedModel], stop: Deadline) -> Iterator[PassCosts]:
    """What one eager target pass of each model in `models` (by where its weights are) costs by
    the tokens it feeds (`passcost.pass_costs`: PASS_WIDTHS, after PASS_CONTEXT, PASS_REPEATS
    each), width by width, the models in turn at each width so that a click cut short by `stop`
    leaves every line the same widths: a `PassCosts` record after each, then the last with `done`."""
    first = next(iter(models.values()))
    costs: dict[str, dict[int, float]] = {where: {} for where in models}
    measuring = dict(widths=PASS_WIDTHS, device=str(first.device), dtype=dtype_of(first))
    for width in PASS_WIDTHS:
        if stop.is_set():
            break
        for where, target in models.items():
            costs[where][width] = passcost.pass_costs(target.model, (width,), PASS_CONTEXT, PASS_REPEATS)[width]
        yield PassCosts({where: dict(by_width) for where, by_width in costs.items()}, **measuring)
    yield PassCosts(costs, **measuring, done=True)
