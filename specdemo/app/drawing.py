"""How the page draws a click: Generate's records as the page's updates (`GenerateDrawing`), the
verdicts on an answer, the race's rows, and the numbers that explain a speed. Pure drawing: what
it draws was decoded elsewhere (`specdemo.app.clicks`, in a GPU call on ZeroGPU)."""

import html
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import gradio as gr

from specdemo.app import clicks, views, zerogpu
from specdemo.app.limits import LIMITS
from specdemo.app.live import SUSPECT_MARGIN, Baselines, Request, Spread, first_difference, speedup, spread, stats
from specdemo.app.zerogpu import GpuPlan
from specdemo.core.events import StepEvent
from specdemo.methods import METHODS
from specdemo.models import LoadedModel


def plan_html(plan: GpuPlan) -> str:
    return f"<p><i>{html.escape(plan.note[0].upper() + plan.note[1:])}.</i></p>" if plan.note else ""


def preparing_html(record: clicks.Preparing) -> str:
    """What a GPU call is doing before its first pass, while the visitor waits."""
    return f"<p><i>Getting the GPU ready: {html.escape(record.what)}…</i></p>"


PLOTS = ("timeline", "detail", "trajectory", "tree", "best")
WIDE = "specdemo-wide"  # the CSS class of a plot that keeps a computer's width on a phone (views/html.py)


def view_updates(view: dict) -> dict:
    """Updates for the method's plots (hidden when the method has none of that kind) and its HTML, by
    name; a plot whose figure needs a computer's width (`views.needs_width`) scrolls sideways on a phone."""
    plots = {name: gr.Plot(value=view[name], visible=view[name] is not None,
                           elem_classes=[WIDE] if views.needs_width(view[name]) else []) for name in PLOTS}
    return {**plots, "method_html": view["html"]}


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
        f"against {ar_pass_ms:.1f} ms for AR's one-token pass, and committed {run_stats['tokens_per_forward']:.2f} "
        f"tokens against 1. Those predict {run_stats['tokens_per_forward']:.2f} × {ar_pass_ms:.1f} / {pass_ms:.1f} = "
        f"<b>{predicted:.2f}x</b>; measured: {said}.</p>"
    )


EXPORTS = Path(tempfile.gettempdir()) / "specdemo-runs"


EXPORTS_KEPT_S = 3600  # an export older than this is deleted when the next one is written


def export_events(events: list[StepEvent], summary) -> str:
    """The run's events as a JSON file for download. Exports older than an hour are deleted
    first (Gradio serves its own copy, which its `delete_cache` removes), so files never pile up."""
    EXPORTS.mkdir(exist_ok=True)
    for old in EXPORTS.glob("specdemo-run-*.json"):
        if time.time() - old.stat().st_mtime > EXPORTS_KEPT_S:
            old.unlink(missing_ok=True)
    payload = {"events": [e.as_dict() for e in events],
               "summary": {**vars(summary), "tokens": list(summary.tokens)} if summary else None}
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="specdemo-run-", dir=EXPORTS, delete=False) as handle:
        json.dump(payload, handle, default=list)
        return handle.name


BASELINE_NOTE = ("<p><i>First the AR baseline on this prompt (once per prompt and settings); the chosen method runs "
                 "next.</i></p>")


NOT_TIMED = ("Not timed again: the {left:.0f} s left of this click's time hold no more round of AR and this method, so "
             "the speed is the streamed runs' above (one run each, drawn as they ran; no spread). A shorter answer "
             "gets timed rounds.")


TIMING = ("Timing the speed: AR and this method run again, alternately and without drawing, as many rounds as fit a "
          "few seconds.")


STOPPED = (f"stopped: Stop was pressed, or the click's {LIMITS.budget_s:.0f} s (loading, AR and every method together) "
           "ran out")


def decoder(target: LoadedModel):
    return lambda token: target.decode([token])


def difference_note(found, dtype: str, decode) -> str:
    """Why a greedy answer that should equal its reference's does not (`clicks.divergence`): one sentence, or ''."""
    return views.divergence_sentence(found, dtype, decode, SUSPECT_MARGIN) if found else ""


def budget_note(summary) -> str:
    """Why a run ended before its answer did: Stop, or the click's budget (`specdemo.app.limits`)."""
    return f"<p><i>{html.escape(STOPPED.capitalize())}.</i></p>" if summary.finish_reason == "stopped" else ""


def verdict_html(request: Request, answered: clicks.Answered, decode, decode_tokens) -> str:
    """Generate's verdict on a finished answer: does it equal AR's, and why not; for contrastive
    decoding, its answer beside the expert's and the amateur's own."""
    verdict = same_as_ar_html(request, answered.summary, answered.baseline_summary, answered.checks, answered.dtype,
                              decode)
    if answered.checks.amateur is None:
        return verdict
    answers = {"contrastive (expert − amateur)": answered.summary.tokens,
               "expert alone (greedy AR)": answered.baseline_summary.tokens,
               "amateur alone (greedy)": answered.checks.amateur}
    return verdict + views.answers_html(answers, decode_tokens)


def same_as_ar_html(request: Request, summary, baseline_summary, checks: clicks.Checks, dtype: str, decode) -> str:
    """Does the answer equal AR's, and if not, why (methods that should); a CLLM's stored quality instead."""
    if request.method == "ar" or METHODS[request.method].other_answer:
        return ""
    if checks.own_weights:  # a changed model (cllm): is it still a good one?
        return views.cllm_quality_html(checks.quality)
    if request.sampling.do_sample:
        return "<p><b>Same answer as AR?</b> Not expected: this run samples.</p>"
    if first_difference(summary.tokens, baseline_summary.tokens) is None:
        return "<p><b>Same answer as AR?</b> Yes, token for token.</p>"
    return f"<p><b>Same answer as AR?</b> No. {html.escape(difference_note(checks.divergence, dtype, decode))}</p>"


class GenerateDrawing:
    """The page's updates for one Generate click's records (`specdemo.app.clicks`), each keyed by the
    name of what it changes: the answer, the method's pictures (`view_updates`), "speed_plot", "stats",
    "why" (the verdict), the step-through's "history", the "download" and the "step" slider. What an
    update does not name stays as it is."""

    def __init__(self, target: LoadedModel, request: Request, baselines: Baselines):
        self.target, self.request, self.baselines = target, request, baselines
        self.decode = decoder(target)
        self.plan = zerogpu.unplanned(request.max_new_tokens, 0.0)
        self.shown, self.finished, self.verdict, self.pending = {}, {}, "", False
        self.answered: clicks.Answered | None = None

    def draw(self, record) -> dict | None:
        return getattr(self, f"on_{type(record).__name__.lower()}")(record)

    def pictures(self, events: list[StepEvent], baseline: list[StepEvent] | None) -> dict:
        return {"answer": views.stream_html(events, self.decode, self.target.decode),
                **view_updates(views.method_pictures(events, self.decode)),
                "speed_plot": views.speed_figure(events, baseline)}

    def after_answer(self, table: str, last: bool = False) -> dict:
        """The table, with the answer's last picture and its verdict the first time after the answer;
        the `last` update of a click holds its whole view again, so a page that missed or misapplied a
        streamed update still ends on the answer's view."""
        if self.pending:
            self.pending = False
            return {**self.shown, "stats": table, **self.finished}
        return {**(self.shown if last else {}), "stats": table}

    def on_gpuplan(self, plan: GpuPlan) -> None:
        """The click's plan, as its call decodes it: its baseline is kept as long as the plan made it."""
        self.plan = plan
        self.request = replace(self.request, max_new_tokens=plan.max_new_tokens)

    @staticmethod
    def on_preparing(record: clicks.Preparing) -> dict:
        return {"answer": preparing_html(record), "stats": "", "why": ""}

    def on_streaming(self, record: clicks.Streaming) -> dict:
        if record.baseline is None:  # the AR baseline: no statistics nor verdict while it streams
            pictures = self.pictures(record.events, None)
            return {**pictures, "answer": BASELINE_NOTE + pictures["answer"], "stats": "", "why": ""}
        self.shown = self.pictures(record.events, record.baseline)
        # no verdict while the answer streams
        return {**self.shown, "stats": views.stats_html(stats(record.events)), "why": "", "step": gr.Slider()}

    def on_baseline(self, record: clicks.Baseline) -> None:
        if not self.plan.on_cpu:  # a CPU twin's run is no baseline for the page's model
            self.baselines.put(self.target, self.request, (record.events, record.summary))

    def on_answered(self, record: clicks.Answered) -> dict | None:
        self.answered, self.shown = record, self.pictures(record.events, record.baseline_events)
        self.verdict = (plan_html(self.plan) + verdict_html(self.request, record, self.decode, self.target.decode)
                        + budget_note(record.summary))
        steps = max(len(record.events), 1)
        self.finished = {"why": self.verdict,
                         "history": (record.events, record.summary, self.decode, self.target.decode),
                         "download": export_events(record.events, record.summary),
                         "step": gr.Slider(maximum=steps, value=steps)}
        self.pending = True
        return (self.after_answer(views.stats_html(self.run_stats, done=True))
                if record.summary.finish_reason == "stopped" else None)

    @property
    def run_stats(self) -> dict:
        return stats(self.answered.events, self.answered.summary)

    def on_untimed(self, record: clicks.Untimed) -> dict:
        ar_speed = stats(self.answered.baseline_events, self.answered.baseline_summary)["tokens_per_s"]
        single = spread([self.run_stats["tokens_per_s"]], [ar_speed])
        note = NOT_TIMED.format(left=record.left_s)
        return self.after_answer(views.stats_html(self.run_stats, single, ar_speed, note=note, done=True, drawn=True),
                                 last=True)

    def on_timing(self, record: clicks.Timing) -> dict:
        return self.after_answer(views.stats_html(self.run_stats, note=f"{TIMING} Round {record.round_} of "
                                                  f"{record.rounds}: {record.done} of 2 runs done."))

    def on_stopped(self, record: clicks.Stopped) -> dict:
        return self.after_answer(views.stats_html(self.run_stats, note=STOPPED, done=True), last=True)

    def on_timed(self, record: clicks.Timed) -> dict:
        """The measured speedup, and the speed plot redrawn from the runs it was measured on."""
        table = views.stats_html({**self.run_stats, "tokens_per_s": record.method_speed}, record.measured,
                                 record.ar_speed, done=True)
        why = why_html(record.method_stats, record.ar_stats, self.answered.events, record.measured)
        self.shown["speed_plot"] = views.speed_figure(record.method_events, record.ar_events, timed=True)
        return {**self.after_answer(table, last=True), "why": why + self.verdict}  # the last update: all of `shown`


def race_row(method, run_stats, baseline_stats, differs, summary, decode, reference=None, own_differs=None, why="",
             measured: Spread | None = None) -> str:
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
        same = (f"as its own AR: {same}; as the target's AR: {same_tokens(differs, summary, decode)} (a fine-tuned "
                "copy may answer differently)")
    speed = (f"{run_stats['tokens_per_s']:.1f}" if isinstance(run_stats["tokens_per_s"], float)
             else run_stats["tokens_per_s"])
    return (f"| {method} | {speed} | {run_stats['tokens_per_forward']} | {gain} | "
            f"{views.memory_cell(run_stats.get('origins'))} | {same} |")


def same_tokens(differs: int | None, summary, decode) -> str:
    if differs is None:
        return "yes"
    if differs < len(summary.tokens):
        token = repr(decode(summary.tokens[differs])).replace("|", "\\|")  # a | would end the table's cell
        return f"no: first differs at token {differs} ({token})"
    return f"no: differs at token {differs}"
