"""What the page's events do: each handler turns the page's named inputs into a request, runs it
through `specdemo.app.live` and returns what the page shows (drawn by `specdemo.app.views`).
The layout and the wiring are `specdemo.app.ui`'s."""

import dataclasses
import html
import json
import math
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gradio as gr

from specdemo.app import views, zerogpu
from specdemo.app.limits import LIMITS, budget, time_left
from specdemo.app.live import (
    MARGIN_S,
    SUSPECT_MARGIN,
    Baselines,
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
    race_methods,
    run,
    sampling_from,
    speeds,
    speedup,
    spread,
    stats,
    text,
    timed_events,
    timing_rounds,
    whole,
)
from specdemo.app.zerogpu import GpuPlan, call_with_cpu_fallback, gpu_call, plan_for, with_cpu_fallback
from specdemo.core.errors import SpecDemoError
from specdemo.core.events import StepEvent
from specdemo.methods import METHODS, decoded_model, forget_companions, method_options
from specdemo.models import LoadedModel, compile_like, fast_dtype, free_memory, load_model, unload
from specdemo.presets import Preset, preset_for, preset_named


def click_budget(plan: GpuPlan) -> threading.Event:
    """The click's deadline: its budget, or on ZeroGPU what it declared less a margin, so that no
    GPU call runs past its declaration."""
    return budget(plan.declared_s - zerogpu.MARGIN_S if plan.declared_s else None)


def planned(target: LoadedModel, plan: GpuPlan) -> LoadedModel:
    """The model a click decodes: the page's, or its twin on the CPU when ZeroGPU refused the click."""
    return load_model(target.spec, "auto", "cpu") if plan.on_cpu and target.device.type != "cpu" else target


def kept(target: LoadedModel, summary) -> None:
    """On a GPU, keep what a target pass cost for the next click's plan (`zerogpu.keep_pass_s`)."""
    if target.device.type == "cuda" and summary is not None and summary.target_forwards:
        zerogpu.keep_pass_s(summary.target_s / summary.target_forwards)


def plan_html(plan: GpuPlan) -> str:
    return f"<p><i>{html.escape(plan.note[0].upper() + plan.note[1:])}.</i></p>" if plan.note else ""

UPDATE_EVERY_S = 0.5  # page updates a second at most: drawing competes with decoding for the CPU


PLOTS = ("timeline", "detail", "trajectory", "tree", "best")
KNOBS = (  # in the order of the page's inputs
    "gamma", "adaptive_gamma", "draft_tree_size", "copy_length", "retrieve", "tree", "tree_size", "typical_acceptance", "decoder", "block_size", "window", "ngram", "candidates",
    "num_beams", "length_penalty", "early_stopping", "alpha", "amateur_temperature",
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
    convert = {"adaptive_gamma": bool, "draft_tree_size": chooses, "copy_length": chooses, "retrieve": bool, "tree": str, "decoder": str,
               "typical_acceptance": bool, "early_stopping": bool, "length_penalty": float, "alpha": float, "amateur_temperature": float}
    for name, value in values.items():  # a value posted to the queue may be anything: a sentence, not a bare "Error"
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecDemoError(f"{name} must be a number, got {value!r}")
    for name in ("tree_size", "window"):  # 0 on the slider: the method's own (the tree's size; lookahead's or the CLLM's window)
        if not values[name]:
            values[name] = None
    method = named["method"]
    own = METHODS[method].controls if method in METHODS else ()  # an unknown method gets its sentence from Request
    settings = {name: convert.get(name, int)(values[name]) for name in KNOBS if name in own and values[name] is not None}
    sampling = sampling_from(*(named[name] for name in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "no_repeat_ngram_size")))
    return Request(text("prompt", named["prompt"] or ""), text("method", method), whole("max_new_tokens", named["max_new_tokens"]), sampling, settings)


def view_updates(view: dict) -> list:
    """Gradio updates for the method's plots (hidden when the method has none of that kind) and its HTML."""
    return [gr.Plot(value=view[name], visible=view[name] is not None) for name in PLOTS] + [view["html"]]


def why_html(run_stats: dict, baseline_stats: dict, events: list[StepEvent], measured: Spread | None = None) -> str:
    """The run's own numbers that explain its speed: time per pass against AR's, tokens per pass
    (`run_stats` and `baseline_stats`: timed runs of each), and the speedup measured (`measured`)."""
    if not run_stats["forward_passes"] or not baseline_stats["forward_passes"]:
        return ""
    pass_ms = 1000 * run_stats["wall_s"] / run_stats["forward_passes"]
    ar_pass_ms = 1000 * baseline_stats["wall_s"] / baseline_stats["forward_passes"]
    predicted = run_stats["tokens_per_forward"] * ar_pass_ms / pass_ms
    median = measured.median if measured else speedup(run_stats, baseline_stats) or 0
    said = f"<b>{median:.2f}x</b>" + (f" (range {measured.low:.2f}x to {measured.high:.2f}x)" if measured else "")
    fed = sum(len(e.proposed) for e in events) / max(len(events), 1)
    return (
        f"<p><b>Why is it {'faster' if median > 1 else 'not faster'}?</b> A step of this run took {pass_ms:.1f} ms "
        f"(one target pass over about {1 + fed:.1f} tokens{', plus the draft' if run_stats['draft_forwards'] else ''}) "
        f"against {ar_pass_ms:.1f} ms for AR's one-token pass, and committed {run_stats['tokens_per_forward']:.2f} tokens "
        f"against 1. Those predict {run_stats['tokens_per_forward']:.2f} × {ar_pass_ms:.1f} / {pass_ms:.1f} = "
        f"<b>{predicted:.2f}x</b>; measured: {said}.</p>"
    )


def answers_beside(target: LoadedModel, request: Request, summary, baseline_summary, stop=None) -> str:
    """For contrastive decoding (a quality method), its answer beside the expert's and the amateur's own."""
    amateur = amateur_reference(target, request, stop)
    if amateur is None:
        return ""
    answers = {"contrastive (expert − amateur)": summary.tokens, "expert alone (greedy AR)": baseline_summary.tokens,
               "amateur alone (greedy)": amateur.tokens}
    return views.answers_html(answers, target.decode)


EXPORTS = Path(tempfile.gettempdir()) / "specdemo-runs"
EXPORTS_KEPT_S = 3600  # an export older than this is deleted when the next one is written


def export_events(events: list[StepEvent], summary) -> str:
    """The run's events as a JSON file for download. Exports older than an hour are deleted
    first (Gradio serves its own copy, which its `delete_cache` removes), so files never pile up."""
    EXPORTS.mkdir(exist_ok=True)
    for old in EXPORTS.glob("specdemo-run-*.json"):
        if time.time() - old.stat().st_mtime > EXPORTS_KEPT_S:
            old.unlink(missing_ok=True)
    payload = {"events": [e.as_dict() for e in events], "summary": {**vars(summary), "tokens": list(summary.tokens)} if summary else None}
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="specdemo-run-", dir=EXPORTS, delete=False) as handle:
        json.dump(payload, handle, default=list)
        return handle.name


class Targets:
    """The models a page offers: the one it started with, and the presets this machine can run
    (with CUDA, the GPU presets: `specdemo.presets`), each loaded on first use. Besides the start,
    one model is resident at a time (a preset, or the start at the other precision): asking for
    another evicts it first, so a class switching presets never holds more than two in memory."""

    def __init__(self, start: LoadedModel, presets: tuple[Preset, ...]):
        self.start, self.presets = start, presets
        self.resident: LoadedModel | None = None
        start_preset = preset_for(start.spec, presets)
        self.start_name = start_preset.name if start_preset else start.spec
        self.names = list(dict.fromkeys([self.start_name, *(preset.name for preset in presets)]))
        # exact: float32, where every method's answer is AR's; fast: the dtype this device multiplies fastest, if not float32
        fast = fast_dtype(start.device)
        self.precisions = {EXACT: "float32", **({fast_label(fast): fast} if fast != "float32" else {})}
        start_dtype = str(start.dtype).removeprefix("torch.")
        self.start_precision = next((label for label, dtype in self.precisions.items() if dtype == start_dtype), EXACT)

    def about(self, name: str) -> str:
        preset = next((preset for preset in self.presets if preset.name == name), None)
        return preset.about if preset else ""

    def __call__(self, name: str | None, precision: str | None = None) -> LoadedModel:
        """The model `name` (default: the start) at `precision` (a label of `self.precisions`;
        default: the start's dtype), loaded once."""
        if precision not in (None, "", *self.precisions):
            raise SpecDemoError(f"precision must be one of {', '.join(map(repr, self.precisions))}, got {precision!r}")
        dtype = self.precisions[precision] if precision else str(self.start.dtype).removeprefix("torch.")
        same_dtype = dtype == str(self.start.dtype).removeprefix("torch.")
        if (not name or name == self.start_name) and same_dtype:
            return self.start
        spec = self.start.spec if not name or name == self.start_name else preset_named(name, self.presets).target
        if self.resident is not None and (self.resident.spec, str(self.resident.dtype).removeprefix("torch.")) == (spec, dtype):
            return self.resident
        if self.resident is not None:
            forget_companions()
            unload(self.resident)
            self.resident = None
            free_memory()  # before the next load, so two presets never share the GPU
        self.resident = load_model(spec, dtype, str(self.start.device))
        compile_like(self.resident, self.start)
        return self.resident


EXACT = "exact (float32)"
NOT_TIMED = ("Not timed again: the {left:.0f} s left of this click's time hold no more round of AR and this method, so the speed is "
             "the streamed runs' above (one run each, drawn as they ran; no spread). A shorter answer gets timed rounds.")
TIMING = "Timing the speed: AR and this method run again, alternately and without drawing, as many rounds as fit a few seconds."
RACE_MEASURE_S, RACE_MIN_ROUNDS = 2.5 * LIMITS.timing_s, 2  # a race times every method: fewer rounds than Generate's
REPLAY_EVERY_S = 0.15  # a replay frame's wall time
REPLAY_SPEEDS = {"real time": 1.0, "half speed": 0.5, "quarter speed": 0.25}
STOPPED = f"stopped: Stop was pressed, or the click's {LIMITS.budget_s:.0f} s (loading, AR and every method together) ran out"


def fast_label(dtype: str) -> str:
    return f"fast ({dtype})"


def decoder(target: LoadedModel):
    return lambda token: target.decode([token])


@dataclasses.dataclass(frozen=True)
class RaceOutcome:
    """What a race's GPU call hands back to be drawn: each method's median run, the table's rows,
    the chart's results and CLLM's quality note."""

    medians: list  # each method's median run's events, AR first
    rows: list[str]
    results: list[dict]
    quality: str


class Handlers:
    """The page's decoding events, for one page: its models (`Targets`) and its cache of AR
    baselines. On ZeroGPU each click declares the GPU time it plans (`zerogpu.plan_for`), decodes
    in a GPU call, and runs on the CPU if the platform refuses it (`zerogpu.with_cpu_fallback`)."""

    def __init__(self, targets: "Targets"):
        self.targets, self.baselines = targets, Baselines()
        self.generate_on_gpu, self.race_on_gpu = gpu_call(self.generate), gpu_call(self.race)

    def stream_baseline(self, target, request, decode, stop):
        """AR on this prompt first, streamed with the same page updates as the run it is compared
        with: on a CPU drawing takes time from decoding, as much in both runs, so the speedup
        compares like with like. Stop, or the end of the click's budget, ends it (nothing is kept then).
        While it streams, the statistics and the verdict areas are empty: no earlier run's numbers stay beside it."""
        note = "<p><i>First the AR baseline on this prompt (once per prompt and settings); the chosen method runs next.</i></p>"
        for events, summary in timed_events(run(target, self.baselines.ar_request(request), stop), UPDATE_EVERY_S, stop):
            if summary and summary.finish_reason != "stopped":
                self.baselines.put(target, request, (events, summary))
            shown = note + views.stream_html(events, decode, target.decode), *view_updates(views.method_pictures(events, decode)), views.speed_figure(events)
            yield *shown, "", "", *[gr.skip()] * 3  # no statistics nor verdict while the baseline streams

    def on_generate(self, *values):
        """Generate, as the page calls it: the values are GENERATE_INPUTS' in order (`generate`)."""
        named = dict(zip(GENERATE_INPUTS, values, strict=True))
        plan = plan_for(2, int(named["max_new_tokens"]), LIMITS.timing_s, LIMITS.gpu_max_s)  # the method and its AR baseline
        yield from with_cpu_fallback(self.generate_on_gpu, self.generate, plan, *values)

    def generate(self, plan: GpuPlan, *values):
        """Generate: the AR baseline (once per prompt and settings), then the method, streamed; then
        both timed alike (`live.timing_rounds`) for the speedup and its spread, within `plan`."""
        stop = click_budget(plan)  # one deadline for the click: loading, the AR baseline, the method, timing and reference runs
        try:
            named = dict(zip(GENERATE_INPUTS, values, strict=True))
            request = dataclasses.replace(request_from(named), max_new_tokens=plan.max_new_tokens)
            target = planned(self.targets(named["model"], named["precision"]), plan)
            decode = decoder(target)
            method_options(request.method, target)  # a missing companion is said now, not after the AR baseline
            if not self.baselines.has(target, request):
                yield from self.stream_baseline(target, request, decode, stop)
                if not self.baselines.has(target, request):  # Stop or the budget ended the baseline
                    return
            baseline_events, baseline_summary = self.baselines.get(target, request)
            for events, summary in timed_events(run(target, request, stop), UPDATE_EVERY_S, stop):
                shown = (views.stream_html(events, decode, target.decode), *view_updates(views.method_pictures(events, decode)),
                         views.speed_figure(events, baseline_events))
                if summary is None:
                    yield *shown, views.stats_html(stats(events)), "", *[gr.skip()] * 2, gr.Slider()  # no verdict while the answer streams
            run_stats = stats(events, summary)
            kept(target, summary)
            verdict = (plan_html(plan) + same_as_ar_html(target, request, summary, baseline_summary, decode)
                       + answers_beside(target, request, summary, baseline_summary, stop) + budget_note(summary))
            finished = (verdict, (events, summary, decode, target.decode), export_events(events, summary), gr.Slider(maximum=max(len(events), 1), value=max(len(events), 1)))
            if summary.finish_reason == "stopped":
                yield *shown, views.stats_html(run_stats, done=True), *finished
                return
            baseline_stats = stats(baseline_events, baseline_summary)
            if not plan.measure_s or baseline_summary.elapsed_s + summary.elapsed_s > time_left(stop) - MARGIN_S:  # no round fits the click
                single = spread([run_stats["tokens_per_s"]], [baseline_stats["tokens_per_s"]])
                note = NOT_TIMED.format(left=time_left(stop))
                yield *shown, views.stats_html(run_stats, single, baseline_stats["tokens_per_s"], note=note, done=True, drawn=True), *finished
                return
            yield *shown, views.stats_html(run_stats, note=TIMING), *finished
            timed = []
            for round_, rounds, done, timed in timing_rounds(target, [Baselines.ar_request(request), request], stop, plan.measure_s):  # noqa: B007
                note = f"{TIMING} Round {round_} of {rounds}: {done} of 2 runs done."
                yield *[gr.skip()] * len(shown), views.stats_html(run_stats, note=note), *[gr.skip()] * len(finished)
            if not timed or not timed[0]:  # Stop, or the click's budget, ended the timing
                yield *[gr.skip()] * len(shown), views.stats_html(run_stats, note=STOPPED, done=True), *[gr.skip()] * len(finished)
                return
            ar_runs, method_runs = timed
            measured = spread(speeds(method_runs), speeds(ar_runs))
            timed_stats, ar_stats = stats(*median_run(method_runs)), stats(*median_run(ar_runs))
            shown_stats = {**run_stats, "tokens_per_s": median(speeds(method_runs))}
            table = views.stats_html(shown_stats, measured, median(speeds(ar_runs)), done=True)
            yield *[gr.skip()] * len(shown), table, why_html(timed_stats, ar_stats, events, measured) + verdict, *[gr.skip()] * (len(finished) - 1)
        except SpecDemoError as error:  # a sentence for the person, not a traceback
            raise gr.Error(str(error)) from error
        finally:
            stop.set()  # whatever ended the click (its end, Stop, an error), no pass of it runs on

    def on_step(self, history, step):
        """Step through: step n shows the answer after the n-th target pass, that pass's tokens
        outlined, its beats (draft, verify, accept) and sentence; step 0 is before the first pass."""
        events, summary, decode, decode_tokens = history or ([], None, str, None)
        if not events:
            return "", *view_updates(views.method_pictures([], decode)), "Generate an answer first, then walk through it step by step here."
        step = max(0, min(int(step), len(events)))  # the slider counts passes from 1, the events from 0
        if step == 0:
            before = "<p>Step 0: before the first target pass. Nothing is committed yet; press Play or Next to watch each pass.</p>"
            return "", *view_updates(views.before_pictures(events, decode)), before
        event = events[step - 1]
        shown = view_updates(views.method_pictures(events[:step], decode))
        # as HTML, escaped: a token such as '*' or '_' would be Markdown's formatting
        explained = views.beats_html(event, decode) + f"<p>{html.escape(views.explain_step(event, decode))}</p>"
        return views.stream_html(events[:step], decode, decode_tokens, current=True), *shown, explained

    def on_race(self, model_name, precision, prompt, methods, max_new_tokens, replay_speed="real time"):
        """The race, as the page calls it: decoded and timed in one GPU call (`race`), then replayed
        and drawn outside it, so a GPU's time is spent on decoding alone."""
        try:
            names = ["ar", *race_methods(methods)]
        except SpecDemoError as error:
            raise gr.Error(str(error)) from error
        plan = plan_for(len(names), int(max_new_tokens), RACE_MEASURE_S, LIMITS.gpu_max_s)
        outcome = None
        for item in with_cpu_fallback(self.race_on_gpu, self.race, plan, model_name, precision, prompt, names, max_new_tokens):
            if isinstance(item, RaceOutcome):
                outcome = item
            else:
                yield item
        if outcome is None:
            return
        decode_tokens = self.targets(model_name, precision).decode
        decode = lambda token: decode_tokens([token])  # noqa: E731
        slow = REPLAY_SPEEDS.get(replay_speed, 1.0) if isinstance(replay_speed, str) else 1.0
        for frame in views.replay_frames(list(zip(names, outcome.medians)), REPLAY_EVERY_S * slow):
            yield gr.skip(), views.race_grid([(label, views.stream_html(events, decode, decode_tokens)) for label, events in frame]), gr.skip()
            time.sleep(REPLAY_EVERY_S)
        answers = views.race_grid([(m, views.stream_html(events, decode, decode_tokens)) for m, events in zip(names, outcome.medians)])
        yield views.race_table(outcome.rows), plan_html(plan) + outcome.quality + answers, views.race_figure(outcome.results)

    def race(self, plan: GpuPlan, model_name, precision, prompt, names, max_new_tokens):
        """AR and each of `names`' methods, timed alike in rounds (`live.timing_rounds`, undrawn),
        each checked against its reference; yields the table while timing, then a `RaceOutcome`.
        All within the click's budget; Stop ends the race between two passes."""
        stop = click_budget(plan)
        try:
            base = Request(text("prompt", prompt or ""), "ar", min(whole("max_new_tokens", max_new_tokens), plan.max_new_tokens))
            target = planned(self.targets(model_name, precision), plan)
            decode = decoder(target)
            timed = []
            requests = [Request(base.prompt, m, base.max_new_tokens) for m in names]
            for round_, rounds, done, timed in timing_rounds(target, requests, stop, plan.measure_s, RACE_MIN_ROUNDS):  # noqa: B007
                order = names if round_ % 2 else names[::-1]  # timing_rounds reverses every other round
                running = order[done] if done < len(names) else ""
                note = f"Timing every method the same way, without drawing: round {round_} of {rounds}, {done} of {len(names)} runs done; {running} running."
                yield views.race_table([views.race_note(m, note if m == running else "") for m in names]), "", gr.skip()
            if not timed or not timed[0]:
                yield views.race_table([views.race_note(m, STOPPED) for m in names]), "", None
                return
            medians = [median_run(runs) for runs in timed]
            kept(target, medians[0][1])
            ar_speeds, (_, baseline_summary) = speeds(timed[0]), medians[0]
            rows, results = [], []
            for method, runs, (events, summary) in zip(names, timed, medians):
                measured = spread(speeds(runs), ar_speeds)
                results.append({"method": method, "speedup": measured, "tokens_per_pass": [stats(*r)["tokens_per_forward"] for r in runs]})
                shown = {**stats(events, summary), "tokens_per_s": median(speeds(runs))}
                if method == "ar":
                    rows.append(race_row(method, shown, None, None, summary, decode, measured=measured))
                    continue
                request = Request(base.prompt, method, base.max_new_tokens)
                reference = own_reference(target, request, stop)
                own_differs = first_difference(summary.tokens, reference.tokens) if reference else None
                why = difference_note(target, request, summary, reference or baseline_summary, decode)
                differs = first_difference(summary.tokens, baseline_summary.tokens)
                rows.append(race_row(method, shown, None, differs, summary, decode, reference, own_differs, why, measured=measured))
            quality = views.cllm_quality_html(cllm_quality(target, Request(base.prompt, "cllm", base.max_new_tokens))) if "cllm" in names else ""
            yield RaceOutcome([events for events, _ in medians], rows, results, quality)
        except SpecDemoError as error:
            raise gr.Error(str(error)) from error
        finally:
            stop.set()  # whatever ended the race (its end, Stop, an error), no pass of it runs on

    @staticmethod
    def on_tick(step, history):
        """Autoplay: the next step, or the end of the answer, where the timer stops. A tick never
        turns the timer on: one answered after Pause would undo it."""
        total = len(history[0]) if history and history[0] else 0
        step = int(step or 0)
        if step >= total:
            return gr.skip(), gr.Timer(active=False)
        return step + 1, (gr.skip() if step + 1 < total else gr.Timer(active=False))

    @staticmethod
    def on_play(step, history):
        """Play from the current step (from step 0 when at the end); nothing to play without an answer."""
        total = len(history[0]) if history and history[0] else 0
        return (0 if int(step or 0) >= total else gr.skip()), gr.Timer(active=total > 0)


def difference_note(target: LoadedModel, request: Request, summary, reference_summary, decode) -> str:
    """Why a greedy answer that should equal its reference's does not: one sentence, or ''."""
    if METHODS[request.method].other_answer:
        return ""
    found = divergence_from(target, request, summary.tokens, reference_summary.tokens)
    dtype = str(target.dtype).removeprefix("torch.")
    return views.divergence_sentence(found, dtype, decode, SUSPECT_MARGIN) if found else ""


def budget_note(summary) -> str:
    """Why a run ended before its answer did: Stop, or the click's budget (`specdemo.app.limits`)."""
    return f"<p><i>{html.escape(STOPPED.capitalize())}.</i></p>" if summary.finish_reason == "stopped" else ""


def same_as_ar_html(target: LoadedModel, request: Request, summary, baseline_summary, decode) -> str:
    """Generate's verdict: does the answer equal AR's, and if not, why (methods that should)."""
    if request.method == "ar" or METHODS[request.method].other_answer:
        return ""
    if decoded_model(request.method, target) is not target.model:  # a changed model (cllm): is it still a good one?
        return views.cllm_quality_html(cllm_quality(target, request))
    if request.sampling.do_sample:
        return "<p><b>Same answer as AR?</b> Not expected: this run samples.</p>"
    if first_difference(summary.tokens, baseline_summary.tokens) is None:
        return "<p><b>Same answer as AR?</b> Yes, token for token.</p>"
    return f"<p><b>Same answer as AR?</b> No. {html.escape(difference_note(target, request, summary, baseline_summary, decode))}</p>"


def race_row(method, run_stats, baseline_stats, differs, summary, decode, reference=None, own_differs=None, why="", measured: Spread | None = None) -> str:
    """One row of the race table. A method on other weights (cllm) is checked against AR on its
    own weights (`reference`); beside it, whether its answer also equals the target's AR; `why`
    explains a difference (`difference_note`). `measured`: the speedup over timed runs (else
    one run's against `baseline_stats`). AR's own row says the baseline's noise."""
    if measured is not None:
        gain = f"{measured.median:.2f}x ({measured.low:.2f} to {measured.high:.2f})"
    else:
        gain = f"{speedup(run_stats, baseline_stats)}x"
    if method == "ar":
        return (f"| {method} | {run_stats['tokens_per_s']:.1f} | {run_stats['tokens_per_forward']} | {gain} | "
                f"{views.memory_cell(run_stats.get('origins'))} | the baseline: its range is the timing's noise |")
    same = same_tokens(differs if reference is None else own_differs, summary, decode)
    if why:
        same = f"{same}. " + why.replace("|", "\\|")  # a | would end the table's cell
    if METHODS[method].other_answer:
        same = f"{same} ({METHODS[method].other_answer})"
    if reference is not None:
        same = f"as its own AR: {same}; as the target's AR: {same_tokens(differs, summary, decode)} (a fine-tuned copy may answer differently)"
    speed = f"{run_stats['tokens_per_s']:.1f}" if isinstance(run_stats["tokens_per_s"], float) else run_stats["tokens_per_s"]
    return f"| {method} | {speed} | {run_stats['tokens_per_forward']} | {gain} | {views.memory_cell(run_stats.get('origins'))} | {same} |"


def same_tokens(differs: int | None, summary, decode) -> str:
    if differs is None:
        return "yes"
    if differs < len(summary.tokens):
        token = repr(decode(summary.tokens[differs])).replace("|", "\\|")  # a | would end the table's cell
        return f"no: first differs at token {differs} ({token})"
    return f"no: differs at token {differs}"


def api_generate_for(targets: Targets):
    def decode(plan: GpuPlan, prompt, method, max_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty, seed, model,
               no_repeat_ngram_size, precision) -> tuple[str, dict]:
        stop = click_budget(plan)
        try:
            sampling = sampling_from(do_sample, temperature, top_k, top_p, repetition_penalty, seed, no_repeat_ngram_size)
            request = Request(text("prompt", prompt or ""), text("method", method), min(whole("max_new_tokens", max_new_tokens), plan.max_new_tokens), sampling)
            target = planned(targets(text("model", model or ""), text("precision", precision or "")), plan)
            events, summary = collect(run(target, request, stop))
            kept(target, summary)
            return target.decode(list(summary.tokens)), {**stats(events, summary), **({"note": plan.note} if plan.note else {})}
        except SpecDemoError as error:
            raise gr.Error(str(error)) from error
        finally:
            stop.set()

    decode_on_gpu = gpu_call(decode)

    def generate(prompt: str, method: str = "ar", max_new_tokens: int = 64, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int = -1, model: str = "",
                 no_repeat_ngram_size: int = 0, precision: str = "") -> tuple[str, dict]:
        """Decode `prompt` with `method`; returns the answer and its stats. `model`: a preset name (default: the page's model);
        `precision`: "exact (float32)" or the fast one the page offers (default: the page's)."""
        try:
            plan = plan_for(1, whole("max_new_tokens", max_new_tokens), 0.0, LIMITS.gpu_max_s)
        except SpecDemoError as error:
            raise gr.Error(str(error)) from error
        return call_with_cpu_fallback(decode_on_gpu, decode, plan, prompt, method, max_new_tokens, do_sample, temperature, top_k, top_p,
                                      repetition_penalty, seed, model, no_repeat_ngram_size, precision)

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
