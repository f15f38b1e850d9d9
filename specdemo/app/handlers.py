"""What the page's events do: each handler turns the page's named inputs into a request, runs it
through `specdemo.app.live` and returns what the page shows (drawn by `specdemo.app.views`).
A handler's every return or yield is a dict of updates keyed by the name of what it changes
("answer", "stats", "speed_plot"...); what it does not name stays as it is. The layout, and
which component each name is for each event, are `specdemo.app.ui`'s."""

import contextlib
import dataclasses
import html
import math
import threading
import time
from collections.abc import Iterator

import gradio as gr

from specdemo.app import clicks, views, zerogpu
from specdemo.app.drawing import (
    STOPPED,
    GenerateDrawing,
    decoder,
    difference_note,
    plan_html,
    preparing_html,
    race_row,
    view_updates,
)
from specdemo.app.limits import LIMITS, Deadline, budget
from specdemo.app.live import (
    Baselines,
    Request,
    collect,
    let_workers_go,
    race_methods,
    run,
    sampling_from,
    stats,
    text,
    whole,
)
from specdemo.app.targets import Targets
from specdemo.app.zerogpu import (
    GpuPlan,
    call_with_cpu_fallback,
    gpu_call,
    on_zerogpu,
    plan_for,
    unplanned,
    whole_cap,
    with_cpu_fallback,
)
from specdemo.core.errors import SpecDemoError, in_one_line
from specdemo.core.events import StepEvent
from specdemo.methods import METHODS
from specdemo.models import LoadedModel


def crossing(error: Exception) -> gr.Error:
    """What a GPU call raises for `error`, which crosses back from its process as a sentence: a
    SpecDemoError's own, any other's kind and first line (ZeroGPU would send back its kind alone)."""
    return gr.Error(str(error) if isinstance(error, SpecDemoError) else f"The answer failed: {in_one_line(error)}")


def click_budget(plan: GpuPlan) -> Deadline:
    """The click's deadline: its budget, or on ZeroGPU what its declaration grants less a margin and
    what the call's worker spent before it (`before_s`), so that no GPU call runs past it."""
    return budget(plan.granted_s - zerogpu.MARGIN_S - plan.before_s if plan.declared_s else None)


@contextlib.contextmanager
def gpu_call_of(plan: GpuPlan, served: set[int]) -> Iterator[tuple[GpuPlan, Deadline]]:
    """The body of a click's GPU call: its plan, with what its worker spent before it
    (`zerogpu.before_the_call_s`, `served`: the workers that ran a call of this page), and its
    deadline (`click_budget`), set when the call ends however it ends (its end, Stop, an error), so
    that no pass of it runs on; an error other than a gr.Error leaves it as a sentence (`crossing`)."""
    plan = dataclasses.replace(plan, before_s=zerogpu.before_the_call_s(served))
    stop = click_budget(plan)
    try:
        yield plan, stop
    except gr.Error:
        raise
    except Exception as error:  # noqa: BLE001 -- ZeroGPU sends back any other error's kind alone
        raise crossing(error) from error
    finally:
        stop.set()


KNOBS = (  # in the order of the page's inputs
    "gamma", "adaptive_gamma", "draft_tree_size", "copy_length", "retrieve", "tree", "tree_size", "typical_acceptance",
    "decoder", "block_size", "window", "ngram", "candidates", "num_beams", "length_penalty", "early_stopping", "alpha",
    "amateur_temperature",
)


GENERATE_INPUTS = (  # the Generate event's inputs, by name, in the order the page passes them
    "model", "precision", "prompt", "method", "max_new_tokens",
    "do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "no_repeat_ngram_size", *KNOBS,
)


def request_from(named: dict) -> Request:
    """The request the page's controls describe (`named`: GENERATE_INPUTS' values by name), every
    value checked: a sentence naming the setting otherwise."""
    values = {name: named[name] for name in KNOBS}
    # the draft tree and copy boxes: checked, speculative chooses (a tree, with a copy, when greedy); unchecked, none
    chooses = lambda checked: None if checked else 0  # noqa: E731
    convert = {"adaptive_gamma": bool, "draft_tree_size": chooses, "copy_length": chooses, "retrieve": bool,
               "tree": str, "decoder": str, "typical_acceptance": bool, "early_stopping": bool, "length_penalty": float,
               "alpha": float, "amateur_temperature": float}
    for name, value in values.items():  # a value posted to the queue may be anything: a sentence, not a bare "Error"
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecDemoError(f"{name} must be a number, got {value!r}")
    # 0 on the slider: the method's own (the tree's size; lookahead's or the CLLM's window)
    for name in ("tree_size", "window"):
        if not values[name]:
            values[name] = None
    method = named["method"]
    own = METHODS[method].controls if method in METHODS else ()  # an unknown method gets its sentence from Request
    settings = {name: convert.get(name, int)(values[name])
                for name in KNOBS if name in own and values[name] is not None}
    sampling = sampling_from(*(named[name] for name in ("do_sample", "temperature", "top_k", "top_p",
                                                        "repetition_penalty", "seed", "no_repeat_ngram_size")))
    return Request(text("prompt", named["prompt"] or ""), text("method", method),
                   whole("max_new_tokens", named["max_new_tokens"]), sampling, settings)


RACE_MEASURE_S, RACE_MIN_ROUNDS = 2.5 * LIMITS.timing_s, 2  # a race times every method: fewer rounds than Generate's
NO_ANSWER = "Generate an answer first, then walk through it step by step here."  # Step through, before any answer
REPLAY_EVERY_S = 0.15  # a replay frame's wall time
REPLAY_SPEEDS = {"real time": 1.0, "half speed": 0.5, "quarter speed": 0.25}


class Handlers:
    """The page's decoding events, for one page: its models (`Targets`) and its cache of AR
    baselines. On ZeroGPU each click declares the GPU time it plans (`zerogpu.plan_for`), decodes
    in a GPU call, and runs on the CPU if the platform refuses it (`zerogpu.with_cpu_fallback`)."""

    def __init__(self, targets: Targets):
        self.targets, self.baselines = targets, Baselines()
        self.served: set[int] = set()  # the worker processes that ran a GPU call of this page (ZeroGPU reuses them)
        self.generate_on_gpu, self.race_on_gpu = gpu_call(self.decode_generate), gpu_call(self.decode_race)
        self.measure_on_gpu = gpu_call(self.decode_pass_costs)

    def decode_generate(self, plan: GpuPlan, model_name, precision, request: Request, baseline=None):
        """Generate's GPU call: its plan first, then what readying its model takes (`clicks.ready`), then
        `clicks.generate_records`' records, within the plan's deadline. `baseline` is the AR run the
        page keeps for the plan's request, passed in: a worker ZeroGPU reused holds none the page kept
        after it forked. A click run on the CPU decodes its own."""
        # one deadline for the click: loading, the AR baseline, the method, timing and reference runs
        with gpu_call_of(plan, self.served) as (plan, stop):
            yield plan
            target = yield from clicks.planned(self.targets(model_name, precision), plan, self.targets.on_cpu,
                                               (request,))
            yield from clicks.generate_records(target, None if plan.on_cpu else baseline,
                                               dataclasses.replace(request, max_new_tokens=plan.max_new_tokens), plan,
                                               stop)

    def generate_plan(self, target: LoadedModel, request: Request) -> tuple[GpuPlan, tuple | None]:
        """Generate's plan (`plan_for`), and the AR baseline the page keeps for the request it plans
        (None: the call decodes it, and declares it)."""
        def decoding(runs: int) -> GpuPlan:
            return plan_for(runs, request.max_new_tokens, LIMITS.timing_s, LIMITS.gpu_max_s, (request.method,))

        known = self.baselines.known(target, request)
        plan = decoding(1 if known else 2)
        if plan.max_new_tokens != request.max_new_tokens:  # shortened: the kept baseline is another length's
            plan = decoding(2)
            known = self.baselines.known(target, dataclasses.replace(request, max_new_tokens=plan.max_new_tokens))
        return plan, known

    def on_generate(self, *values):
        """Generate, as the page calls it (the values are GENERATE_INPUTS' in order): the AR baseline
        (once per prompt and settings), then the method, streamed; then both timed alike for the
        speedup and its spread. Decoded in one GPU call on ZeroGPU (on the CPU when the platform
        refuses it), and drawn here, outside it (`GenerateDrawing`)."""
        named = dict(zip(GENERATE_INPUTS, values, strict=True))
        try:
            request = request_from(named)
            target = self.targets(named["model"], named["precision"])
            plan, baseline = self.generate_plan(target, request)
            records = with_cpu_fallback(self.generate_on_gpu, self.decode_generate, plan, named["model"],
                                        named["precision"], request, baseline)
            with contextlib.closing(records):  # Stop closes this generator, and with it the GPU call's
                drawing = GenerateDrawing(target, request, self.baselines)
                for record in records:
                    update = drawing.draw(record)
                    if update is not None:
                        yield update
        except SpecDemoError as error:  # a sentence for the person, not a traceback
            raise gr.Error(str(error)) from error

    def on_step(self, history, step) -> dict:
        """Step through: step n shows the answer after the n-th target pass, that pass's tokens
        outlined, its beats (draft, verify, accept) and sentence ("explanation"); step 0 is before the first pass."""
        events, summary, decode, decode_tokens = history or ([], None, str, None)
        if not events:
            return {"answer": "", **view_updates(views.method_pictures([], decode)), "explanation": NO_ANSWER}
        step = max(0, min(int(step), len(events)))  # the slider counts passes from 1, the events from 0
        if step == 0:
            before = ("<p>Step 0: before the first target pass. Nothing is committed yet; press Play or Next to watch "
                      "each pass.</p>")
            return {"answer": "", **view_updates(views.before_pictures(events, decode)), "explanation": before}
        event = events[step - 1]
        shown = view_updates(views.method_pictures(events[:step], decode))
        # as HTML, escaped: a token such as '*' or '_' would be Markdown's formatting
        explained = views.beats_html(event, decode) + f"<p>{html.escape(views.explain_step(event, decode))}</p>"
        answer = views.stream_html(events[:step], decode, decode_tokens, current=True)
        return {"answer": answer, **shown, "explanation": explained}

    def on_race(self, model_name, precision, prompt, methods, max_new_tokens, replay_speed="real time"):
        """The race, as the page calls it: decoded and timed in one GPU call (`decode_race`), then
        replayed and drawn here, outside it, so a GPU's time is spent on decoding alone. Its updates
        name the race's "table", its "streams" (the replay, then the answers) and its "plot"."""
        try:
            names = ["ar", *race_methods(methods)]
            request = Request(text("prompt", prompt or ""), "ar", whole("max_new_tokens", max_new_tokens))
            target = self.targets(model_name, precision)
        except SpecDemoError as error:
            raise gr.Error(str(error)) from error
        plan = plan_for(len(names), request.max_new_tokens, RACE_MEASURE_S, LIMITS.gpu_max_s, tuple(names))
        outcome = None
        records = with_cpu_fallback(self.race_on_gpu, self.decode_race, plan, model_name, precision, request.prompt,
                                    names, request.max_new_tokens)
        with contextlib.closing(records):
            for record in records:
                if isinstance(record, GpuPlan):
                    plan = record
                elif isinstance(record, clicks.Preparing):
                    yield {"streams": preparing_html(record)}
                elif isinstance(record, clicks.Timing):
                    note = (f"Timing every method the same way, without drawing: round {record.round_} of "
                            f"{record.rounds}, {record.done} of {record.runs} runs done; {record.running} running.")
                    notes = [views.race_note(m, note if m == record.running else "") for m in names]
                    yield {"table": views.race_table(notes), "streams": ""}
                elif isinstance(record, clicks.Stopped):
                    notes = [views.race_note(m, STOPPED) for m in names]
                    yield {"table": views.race_table(notes), "streams": "", "plot": None}
                else:
                    outcome = record
        if outcome is not None:
            yield from self.replay(outcome, target, plan, replay_speed)

    def decode_race(self, plan: GpuPlan, model_name, precision, prompt, names, max_new_tokens):
        """The race's GPU call: its plan first, then what readying its model takes (`clicks.ready`), then
        `clicks.race_records`' records, within the plan's deadline. Stop ends the race between two passes."""
        with gpu_call_of(plan, self.served) as (plan, stop):
            yield plan
            target = yield from clicks.planned(self.targets(model_name, precision), plan, self.targets.on_cpu,
                                               tuple(Request(prompt, name, max_new_tokens) for name in names))
            yield from clicks.race_records(target, prompt, names, min(max_new_tokens, plan.max_new_tokens), plan, stop,
                                           RACE_MIN_ROUNDS)

    @staticmethod
    def replay(outcome: clicks.RaceOutcome, target: LoadedModel, plan: GpuPlan, replay_speed):
        """A finished race, replayed as it ran (each method's median run, at `replay_speed`), then its table, answers
        and chart."""
        decode_tokens, decode = target.decode, decoder(target)
        names, medians = [part.method for part in outcome.raced], [part.events for part in outcome.raced]
        slow = REPLAY_SPEEDS.get(replay_speed, 1.0) if isinstance(replay_speed, str) else 1.0
        for frame in views.replay_frames(list(zip(names, medians)), REPLAY_EVERY_S * slow):
            streams = [(label, views.stream_html(events, decode, decode_tokens)) for label, events in frame]
            yield {"streams": views.race_grid(streams)}
            time.sleep(REPLAY_EVERY_S)
        answers = views.race_grid([(m, views.stream_html(events, decode, decode_tokens))
                                   for m, events in zip(names, medians)])
        rows = [race_row(part.method, part.stats, None, part.differs, part.summary, decode, part.reference,
                         part.own_differs, difference_note(part.divergence, outcome.dtype, decode),
                         measured=part.measured)
                for part in outcome.raced]
        results = [{"method": part.method, "speedup": part.measured, "tokens_per_pass": part.tokens_per_pass}
                   for part in outcome.raced]
        quality = views.cllm_quality_html(outcome.quality) if "cllm" in names else ""
        yield {"table": views.race_table(rows), "streams": plan_html(plan) + quality + answers,
               "plot": views.race_figure(results)}

    def on_measure(self):
        """Measure on this machine: what one target pass costs by the tokens it feeds, the page's
        model in memory and with its layers on disk (`clicks.pass_cost_records`), its figure
        ("pass_cost_plot") and sentence ("pass_cost_note") drawn as each width is measured. Decoded
        in one GPU call on ZeroGPU (on the CPU when the platform refuses it), drawn here, outside it."""
        if not self.targets.on_disk:
            raise gr.Error("this page's model has no copy with its layers on disk to compare it with")
        try:
            self.targets(self.targets.on_disk)  # loaded before the GPU call, as Generate loads its model
        except SpecDemoError as error:
            raise gr.Error(str(error)) from error
        plan = whole_cap(LIMITS.gpu_max_s) if on_zerogpu() else unplanned(0, 0.0)  # it measures the cost
        records = with_cpu_fallback(self.measure_on_gpu, self.decode_pass_costs, plan)
        with contextlib.closing(records):
            for record in records:
                if isinstance(record, GpuPlan):
                    plan = record
                    yield {"pass_cost_note": f"<p>{html.escape(plan.note)}</p>" if plan.note else ""}
                else:
                    sentence = views.pass_cost_sentence(record.costs, record.widths,
                                                        f"{record.device}, {record.dtype}", record.done)
                    note = f"<p>{html.escape(plan.note)}</p>" if plan.note else ""
                    yield {"pass_cost_plot": views.pass_cost_figure(record.costs), "pass_cost_note": sentence + note}

    def decode_pass_costs(self, plan: GpuPlan):
        """Measuring's GPU call: its plan first, then `clicks.pass_cost_records`' records, within its deadline."""
        with gpu_call_of(plan, self.served) as (plan, stop):
            yield plan
            models = {where: clicks.as_it_is(self.targets(name), plan, self.targets.on_cpu)
                      for where, name in (("in memory", None), ("offloaded", self.targets.on_disk))}
            yield from clicks.pass_cost_records(models, stop)

    @staticmethod
    def on_tick(step, history) -> dict:
        """Autoplay: the next step, or the end of the answer, where the timer stops. A tick never
        turns the timer on: one answered after Pause would undo it."""
        total = len(history[0]) if history and history[0] else 0
        step = int(step or 0)
        if step >= total:
            return {"timer": gr.Timer(active=False)}
        return {"step": step + 1, **({} if step + 1 < total else {"timer": gr.Timer(active=False)})}

    @staticmethod
    def on_play(step, history) -> dict:
        """Play from the current step (from step 0 when at the end); nothing to play without an answer."""
        total = len(history[0]) if history and history[0] else 0
        return {**({"step": 0} if int(step or 0) >= total else {}), "timer": gr.Timer(active=total > 0)}


def api_generate_for(targets: Targets):
    served: set[int] = set()  # the worker processes that ran a call of this endpoint (ZeroGPU reuses them)

    def decode(plan: GpuPlan, prompt, method, max_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty,
               seed, model, no_repeat_ngram_size, precision) -> tuple[str, dict]:
        with gpu_call_of(plan, served) as (plan, stop):
            sampling = sampling_from(do_sample, temperature, top_k, top_p, repetition_penalty, seed,
                                     no_repeat_ngram_size)
            request = Request(text("prompt", prompt or ""), text("method", method),
                              min(whole("max_new_tokens", max_new_tokens), plan.max_new_tokens), sampling)
            page = targets(text("model", model or ""), text("precision", precision or ""))
            target = clicks.quietly(clicks.planned(page, plan, targets.on_cpu, (request,)))
            try:
                events, summary = collect(run(target, request, stop))
            finally:
                let_workers_go()  # this thread waits for the next call now (`live.let_workers_go`)
            clicks.kept(target, summary)
            return (target.decode(list(summary.tokens)),
                    {**stats(events, summary), **({"note": plan.note} if plan.note else {})})

    decode_on_gpu = gpu_call(decode)

    def generate(prompt: str, method: str = "ar", max_new_tokens: int = 64, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                 seed: int = -1, model: str = "", no_repeat_ngram_size: int = 0,
                 precision: str = "") -> tuple[str, dict]:
        """Decode `prompt` with `method`; returns the answer and its stats. `model`: a preset name (default: the page's
        model); `precision`: "exact (float32)" or the fast one the page offers (default: the page's)."""
        try:
            plan = plan_for(1, whole("max_new_tokens", max_new_tokens), 0.0, LIMITS.gpu_max_s, (str(method),))
        except SpecDemoError as error:
            raise gr.Error(str(error)) from error
        return call_with_cpu_fallback(decode_on_gpu, decode, plan, prompt, method, max_new_tokens, do_sample,
                                      temperature, top_k, top_p, repetition_penalty, seed, model, no_repeat_ngram_size,
                                      precision)

    return generate


def stream_answer(
    target: LoadedModel, prompt: str, max_new_tokens: int, method: str = "ar", stop: threading.Event | None = None
) -> Iterator[str]:
    """The answer's text after each target pass, growing as tokens are committed."""
    tokens: list[int] = []
    for item in run(target, Request(prompt, method, int(max_new_tokens)), stop):
        if isinstance(item, StepEvent):
            tokens += item.committed
            yield target.decode(tokens)
