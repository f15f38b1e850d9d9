"""The web page: layout and event wiring only. What the events do is `specdemo.app.handlers`'s, running a method
`specdemo.app.live`'s, drawing `specdemo.app.views`'; this module places the Gradio components and connects them: one
builder per tab returns its components (`lesson_tab`, `generate_tab`, `step_through_tab`, `race_tab`, and `header`
above them), one function per group of events wires them (`wire_generate`, `wire_race`, `wire_controls`,
`wire_step_through`), and `build_app` composes the two in the page's order. A handler's updates are keyed by name;
each event is wired with its outputs by those names (`specdemo.app.wiring`)."""

import functools
from dataclasses import dataclass
from types import MappingProxyType

import gradio as gr
from gradio.events import Dependency

from specdemo.app import lesson, one_run, ui_offload, views
from specdemo.app.drawing import EXPORTS_KEPT_S, PLOTS
from specdemo.app.handlers import GENERATE_INPUTS, NO_ANSWER, REPLAY_SPEEDS, Handlers, Targets, api_generate_for
from specdemo.app.limits import LIMITS
from specdemo.app.live import MAX_NEW_TOKENS, let_workers_go
from specdemo.app.ui_settings import SETTING_WIDTH, method_settings
from specdemo.app.wiring import Outputs, wire
from specdemo.app.zerogpu import on_zerogpu
from specdemo.defaults import Defaults, defaults_for
from specdemo.methods import METHODS
from specdemo.models import LoadedModel
from specdemo.presets import Preset, available_presets

EXAMPLES = list(lesson.EXAMPLES)

PLOT_LABELS = {"timeline": "Tokens per pass", "detail": "More of the method", "trajectory": "Jacobi trajectory",
               "tree": "The latest pass's candidate tree",
               "best": "The pass that committed the most"}
FIRST = lesson.LESSON[1]  # the first screen's ready example: the lesson's speculative step, a gain that shows at once
# method-neutral: it stays on the page while a lesson step or a person changes the method
START_HERE = ("**Try it:** press Generate to watch the chosen method answer this prompt, its guesses in colour (see "
              "the legend below); or open the **Lesson** tab for a guided 15-minute tour.")
# One generation at a time on this model: every event that decodes shares one queue slot,
# so Gradio's queue tells each waiting visitor how many are ahead.
ONE_AT_A_TIME = MappingProxyType(dict(concurrency_id="model", concurrency_limit=1))


def body_class_js(name: str) -> str:
    """Browser-side: the checkbox's value toggles a class of the page's body (no round trip)."""
    return f"(on) => {{ document.body.classList.toggle('{name}', on); return []; }}"


def how_for(method: str) -> str:
    spec = METHODS.get(method)
    return views.how_html(spec.plain, spec.description) if spec else ""


def processing_methods() -> list[str]:
    return [m for m, spec in METHODS.items() if spec.processors]


def sampling_label() -> str:
    """The sampling accordion's title, from the registry: who samples, who takes the processors."""
    exact = " and ".join(m for m, spec in METHODS.items() if spec.samples)
    opt_in = "; ".join(f"{m} only with {spec.samples_when.replace('_', ' ')}"
                       for m, spec in METHODS.items() if spec.samples_when)
    return (f"Sampling ({exact} exactly; {opt_in}; the others decode greedily). Repetition penalty and n-gram "
            f"blocking: {', '.join(processing_methods())}, with the answer AR would give under them")


@dataclass(frozen=True)
class Header:
    """The controls above the tabs: the model, its precision and the two display switches."""
    model: gr.Dropdown
    model_about: gr.Markdown
    precision: gr.Radio
    answer_only: gr.Checkbox
    large_text: gr.Checkbox


@dataclass(frozen=True)
class GenerateTab:
    """The Generate tab: the prompt and its run's buttons, the lesson note, how the method works,
    the examples, what a run draws (`run_view`: the answer, the method's plots and HTML, the speed
    plot, the statistics and "why", by the names of `handlers.on_generate`'s updates), the sampling and method
    settings (`settings`, by their GENERATE_INPUTS names) and the run's events to download."""
    prompt: gr.Textbox
    generate: gr.Button
    stop: gr.Button
    run_status: gr.HTML
    method: gr.Dropdown
    max_new_tokens: gr.Number
    lesson_note: gr.HTML
    how: gr.Markdown
    examples: gr.Dataset
    run_view: Outputs
    settings: dict[str, gr.components.Component]
    download: gr.File

    @property
    def last_run(self) -> Outputs:
        """What a new run, a lesson step or a new method clears (`one_run.cleared`)."""
        return {**self.run_view, "download": self.download}

    @property
    def locked(self) -> Outputs:
        """Generate and the settings a run locks while it is on (`one_run.start`, `one_run.finish`)."""
        return {"generate": self.generate, "prompt": self.prompt, "method": self.method,
                "max_new_tokens": self.max_new_tokens}


@dataclass(frozen=True)
class StepThroughTab:
    """The Step through tab: the step slider, its buttons and autoplay, and the step drawn (`outputs`:
    its answer so far, plots, HTML and explanation, by the names of `handlers.on_step`'s updates)."""
    step: gr.Slider
    back: gr.Button
    forward: gr.Button
    play: gr.Button
    pause: gr.Button
    pace: gr.Slider
    timer: gr.Timer
    outputs: Outputs

    @property
    def autoplay(self) -> Outputs:
        """What Play and the timer's tick change (`handlers.on_play`, `handlers.on_tick`)."""
        return {"step": self.step, "timer": self.timer}


@dataclass(frozen=True)
class RaceTab:
    """The Race tab: the methods raced, its buttons and replay speed, and the race drawn."""
    choice: gr.CheckboxGroup
    button: gr.Button
    stop: gr.Button
    replay_speed: gr.Radio
    table: gr.Markdown
    plot: gr.Plot
    streams: gr.HTML

    @property
    def outputs(self) -> Outputs:
        """The race drawn, by the names of `handlers.on_race`'s updates."""
        return {"table": self.table, "streams": self.streams, "plot": self.plot}


@dataclass(frozen=True)
class Page:
    """Every component the events read or write: the header, each tab's, and what the page remembers (`history`: the
    last run's events, for the step-through; `busy`: a run of this page waits or decodes, so a lesson step then stops it
    before it is set up; `shown_step`: the lesson step whose method and prompt were last set up)."""
    header: Header
    tabs: gr.Tabs
    lesson_step: gr.Radio
    generate: GenerateTab
    step_through: StepThroughTab
    race: RaceTab
    history: gr.State
    busy: gr.State
    shown_step: gr.State

    def generate_inputs(self) -> list:
        """The Generate event's inputs, by name: the handler reads them back by the same names."""
        run = self.generate
        named = dict(model=self.header.model, precision=self.header.precision, prompt=run.prompt, method=run.method,
                     max_new_tokens=run.max_new_tokens, **run.settings)
        return [named[name] for name in GENERATE_INPUTS]

    @property
    def lesson_shown(self) -> Outputs:
        """What setting up a lesson step writes (`one_run.set_up`)."""
        run = self.generate
        return {"method": run.method, "model": self.header.model, "prompt": run.prompt,
                "max_new_tokens": run.max_new_tokens, "lesson_note": run.lesson_note, "tabs": self.tabs,
                "run_status": run.run_status, "shown_step": self.shown_step, **run.last_run}


def header(targets: Targets, target: LoadedModel) -> Header:
    """The page's style and title; the model menu and precision switch unlabelled in the display switches' row, one line
    at 1280 px (what a model or precision does is said once another than the start's is chosen, or with GPU presets)."""
    gr.HTML(views.PAGE_STYLE)
    # the precision switch says the dtype where there is one: a header saying float32 would be wrong after a switch
    dtype = "" if len(targets.precisions) > 1 else f" ({str(target.dtype).removeprefix('torch.')})"
    device = {"cuda": "a GPU", "cpu": "a CPU"}.get(target.device.type, target.device.type)  # words a class reads
    gr.Markdown(f"## SpecDemo: see and measure faster decoding of a language model on {device}{dtype}")
    with gr.Row(equal_height=True):
        model = gr.Dropdown(targets.names, value=targets.start_name, label="Model", show_label=False, container=False,
                            scale=1, elem_id="model", visible=len(targets.names) > 1)
        precision = gr.Radio(list(targets.precisions), value=targets.start_precision, elem_id="precision",
                             label="Precision", show_label=False, container=False, scale=0, min_width=280,
                             visible=len(targets.precisions) > 1)
        answer_only = gr.Checkbox(False, label="Answer only: hide drafts and colours", elem_id="answer-only", scale=1)
        large_text = gr.Checkbox(False, label="Large text (projector)", elem_id="large-text", scale=1)
    model_about = gr.Markdown(targets.about(targets.start_name), visible=targets.shows_about(targets.start_name))
    return Header(model, model_about, precision, answer_only, large_text)


def lesson_tab(targets: Targets) -> tuple[gr.Radio, ui_offload.PassCostBox | None]:
    """The Lesson tab: the glossary and the steps, each of which sets up Generate (or Race); the pass-cost box."""
    with gr.Tab("Lesson", id="lesson"):
        gr.Markdown("A 15-minute lesson: take the steps in order. Each one sets the method and a prompt on which its "
                    "gain shows, then opens Generate; choosing a step stops an answer still running.\n\n"
                    + lesson.GLOSSARY)
        lesson_step = gr.Radio(lesson.TITLES, label="Lesson step", elem_id="lesson-step")
        gr.HTML(views.legend_html())
        return lesson_step, ui_offload.pass_cost_box(bool(targets.on_disk))


def generate_tab(defaults: Defaults) -> GenerateTab:
    """The Generate tab, ready with the lesson's first example; its method settings start at the
    device's `defaults`."""
    with gr.Tab("Generate", id="generate"):
        with gr.Row():
            with gr.Column(scale=3):
                gr.Markdown(START_HERE, elem_id="start-here")
                prompt = gr.Textbox(FIRST.prompt, label="Prompt", elem_id="prompt", lines=2,
                                    placeholder="Ask something...")
                with gr.Row():
                    generate = gr.Button(one_run.GENERATE, variant="primary", elem_id="generate", scale=3)
                    stop = gr.Button("Stop", elem_id="stop", scale=1)
                # shown when it has something to say
                run_status = gr.HTML(elem_id="run-status", padding=False, visible=False)
                stream = gr.HTML(elem_id="stream")
            with gr.Column(scale=2):
                with gr.Row():
                    method = gr.Dropdown(list(METHODS), value=FIRST.method, label="Method", elem_id="method",
                                         min_width=140)
                    max_new_tokens = gr.Number(FIRST.max_new_tokens, minimum=1, maximum=MAX_NEW_TOKENS, step=1,
                                               precision=0, label="Max new tokens", elem_id="max-new-tokens",
                                               min_width=120)
                view_plot = gr.Plot(label=PLOT_LABELS["timeline"], elem_id="method-plot")
        lesson_note = gr.HTML(elem_id="lesson-note")
        how = gr.Markdown(how_for(FIRST.method), elem_id="how")
        # a dataset, not gr.Examples: a click during a run leaves the run's prompt alone (`one_run.example_chosen`)
        examples = gr.Dataset(components=[prompt], samples=[[example] for example in EXAMPLES], type="index",
                              label="Examples", elem_id="examples")
        gr.HTML(views.legend_html())
        with gr.Row():
            with gr.Column():
                trajectory_plot = gr.Plot(label=PLOT_LABELS["trajectory"], elem_id="trajectory-plot", visible=False)
                tree_plot = gr.Plot(label=PLOT_LABELS["tree"], elem_id="tree-plot", visible=False)
                best_plot = gr.Plot(label=PLOT_LABELS["best"], elem_id="best-plot", visible=False)
                detail_plot = gr.Plot(label=PLOT_LABELS["detail"], elem_id="detail-plot", visible=False)
                view_html = gr.HTML(elem_id="method-view")
            with gr.Column():
                run_stats = gr.HTML(elem_id="stats")
                why = gr.HTML(elem_id="why")
                speed_plot = gr.Plot(label="Tokens over time, against AR on this prompt", elem_id="speedup-plot")
        settings = {**sampling_settings(), **method_settings(defaults)}
        download = gr.File(label="This run's events (JSON)", elem_id="export")
    run_view = dict(answer=stream, timeline=view_plot, detail=detail_plot, trajectory=trajectory_plot, tree=tree_plot,
                    best=best_plot, method_html=view_html, speed_plot=speed_plot, stats=run_stats, why=why)
    return GenerateTab(prompt, generate, stop, run_status, method, max_new_tokens, lesson_note, how, examples, run_view,
                       settings, download)


def sampling_settings() -> dict[str, gr.components.Component]:
    """The sampling accordion: its settings by their GENERATE_INPUTS names."""
    with gr.Accordion(sampling_label(), open=False), gr.Row():
        return dict(
            do_sample=gr.Checkbox(False, label="Sample", min_width=SETTING_WIDTH),
            temperature=gr.Slider(0.05, 2.0, value=1.0, label="Temperature", min_width=SETTING_WIDTH),
            top_k=gr.Slider(0, 200, value=0, step=1, label="Top-k (0: off)", min_width=SETTING_WIDTH),
            top_p=gr.Slider(0.05, 1.0, value=1.0, label="Top-p", min_width=SETTING_WIDTH),
            repetition_penalty=gr.Slider(0.5, 2.0, value=1.0, label="Repetition penalty", min_width=SETTING_WIDTH),
            seed=gr.Number(-1, label="Seed (-1: random)", precision=0, min_width=SETTING_WIDTH),
            no_repeat_ngram_size=gr.Slider(0, 6, value=0, step=1, min_width=SETTING_WIDTH, label="No repeated n-grams "
                                           f"of size (0: off; {', '.join(processing_methods())})"))


def step_through_tab() -> StepThroughTab:
    """The Step through tab: the last answer, one target pass at a time."""
    with gr.Tab("Step through", id="step-through"):
        gr.Markdown("Walk through the last generated answer one target pass at a time; step 0 is before the first "
                    "pass.")
        with gr.Row(equal_height=True):
            # step n is the n-th target pass, as the sentences say; 0 is before the first
            step = gr.Slider(0, MAX_NEW_TOKENS, value=0, step=1, label="Step", elem_id="step", scale=4)
            back = gr.Button("◀ Back", min_width=80)
            forward = gr.Button("Next ▶", min_width=80)
            play = gr.Button("▶ Play", elem_id="play", variant="primary", min_width=80)
            pause = gr.Button("❚❚ Pause", elem_id="pause", min_width=80)
            pace = gr.Slider(0.3, 3.0, value=1.2, step=0.1, label="Seconds per step (autoplay)", elem_id="pace",
                             min_width=SETTING_WIDTH)
        timer = gr.Timer(1.2, active=False)
        explanation = gr.HTML(NO_ANSWER, elem_id="explanation")  # until the page's first answer
        stream = gr.HTML(elem_id="step-stream")
        gr.HTML(views.legend_html())
        # titled as on Generate, not "Plot"
        plots = {name: gr.Plot(label=PLOT_LABELS[name], visible=False) for name in PLOTS}
        html = gr.HTML()
    return StepThroughTab(step, back, forward, play, pause, pace, timer,
                          outputs={"answer": stream, **plots, "method_html": html, "explanation": explanation})


RACE_ON = "They race on the prompt and the max new tokens set in the Generate tab."


def race_tab() -> RaceTab:
    """The Race tab: the chosen methods against AR on Generate's prompt and length."""
    with gr.Tab("Race", id="race-tab"):
        choice = gr.CheckboxGroup([m for m in METHODS if m != "ar"],
                                  value=[m for m, spec in METHODS.items() if m != "ar" and not spec.other_answer],
                                  label="Methods against ar", elem_id="race-methods", info=RACE_ON)
        with gr.Row(equal_height=True):
            button = gr.Button("Race", variant="primary", elem_id="race")
            stop = gr.Button("Stop", elem_id="race-stop")
            replay_speed = gr.Radio(list(REPLAY_SPEEDS), value="real time", label="Replay speed",
                                    elem_id="replay-speed")
        table = gr.Markdown(elem_id="race-table")
        plot = gr.Plot(label="Speedup and tokens per pass, with their spreads", elem_id="race-plot")
        gr.HTML(views.legend_html())
        streams = gr.HTML(elem_id="race-streams")
    return RaceTab(choice, button, stop, replay_speed, table, plot, streams)


def wire_generate(page: Page, handlers: Handlers) -> Dependency:
    """Generate and Enter in the prompt: the run, then the page opened again and the step-through
    shown. Returns the run's event, for what cancels it."""
    run, shown = page.generate, page.step_through
    # one run on screen at a time (`one_run`): Generate says the run is on and locks its settings, off the queue, then
    # the run waits its turn; whatever ends it (its end, Stop, a lesson step, an error) opens them again
    clicked = functools.partial(gr.on, [run.generate.click, run.prompt.submit])
    cheap = dict(api_visibility="private", queue=False, show_progress="hidden")
    started = {**run.locked, "run_status": run.run_status, "lesson_note": run.lesson_note, "busy": page.busy,
               **run.last_run}
    starting = wire(clicked, one_run.start, started, inputs=[page.lesson_step, run.method, run.prompt],
                    trigger_mode="once", **cheap)
    drawn = {**run.run_view, "history": page.history, "download": run.download, "step": shown.step}
    running = wire(starting.then, handlers.on_generate, drawn, inputs=page.generate_inputs(), api_visibility="private",
                   **ONE_AT_A_TIME)
    ended = wire(running.then, one_run.finish, {**run.locked, "busy": page.busy}, **cheap)
    settle = functools.partial(one_run.settle, models=tuple(handlers.targets.names))
    wire(ended.then, settle, page.lesson_shown, inputs=[page.lesson_step, page.shown_step], **cheap)
    # the slider fires no change when a new run ends on the same step number as the last one
    wire(running.then, handlers.on_step, shown.outputs, inputs=[page.history, shown.step], api_visibility="private")
    return running


def wire_race(page: Page, handlers: Handlers, running: Dependency) -> None:
    """Race, and the two Stop buttons, each of which ends a run or a race."""
    run, race = page.generate, page.race
    inputs = [page.header.model, page.header.precision, run.prompt, race.choice, run.max_new_tokens, race.replay_speed]
    racing = wire(race.button.click, handlers.on_race, race.outputs, inputs=inputs, api_visibility="private",
                  trigger_mode="once", **ONE_AT_A_TIME)
    # closing the generator ends the decoding loop between passes
    run.stop.click(None, cancels=[running, racing], queue=False)
    race.stop.click(None, cancels=[running, racing], queue=False)


def wire_controls(page: Page, targets: Targets, running: Dependency) -> None:
    """The cheap events: the display switches, a method, a lesson step, an example, a model."""
    header, run = page.header, page.generate
    # in the browser alone: every stream on the page shows the answer only, or with its drafts; the page's text grows
    header.answer_only.change(None, inputs=header.answer_only, js=body_class_js("specdemo-answer-only"), queue=False)
    header.large_text.change(None, inputs=header.large_text, js=body_class_js("specdemo-large"), queue=False)
    # cheap events never wait behind a decode: off the queue, answered at once
    wire(run.method.change, lambda chosen: one_run.method_chosen(how_for(chosen)), {"how": run.how, **run.last_run},
         inputs=run.method, api_visibility="private", queue=False, show_progress="hidden")
    wire(page.lesson_step.change, functools.partial(one_run.lesson_setup, models=tuple(targets.names)),
         page.lesson_shown, inputs=[page.lesson_step, page.busy], api_visibility="private", queue=False,
         cancels=[running], show_progress="hidden")
    wire(run.examples.click, lambda index, busy: one_run.example_chosen(EXAMPLES[index], busy),
         {"prompt": run.prompt, "run_status": run.run_status, **run.last_run}, inputs=[run.examples, page.busy],
         api_visibility="private", queue=False, show_progress="hidden")
    gr.on([header.model.change, header.precision.change], lambda name, precision: gr.Markdown(
        targets.about(name, precision), visible=targets.shows_about(name, precision)),
        inputs=[header.model, header.precision], outputs=header.model_about, api_visibility="private", queue=False)


def wire_step_through(page: Page, handlers: Handlers) -> None:
    """The step slider, Back and Next, and autoplay: Play, Pause, its pace and its timer."""
    shown, history = page.step_through, page.history
    off_queue = dict(api_visibility="private", queue=False)
    wire(shown.step.change, handlers.on_step, shown.outputs, inputs=[history, shown.step], **off_queue)
    shown.back.click(lambda s: max(0, s - 1), inputs=shown.step, outputs=shown.step, **off_queue)
    # the slider refuses a value past its maximum, and would then refuse every later one too
    shown.forward.click(lambda s, h: min(s + 1, len(h[0])) if h and h[0] else 0, [shown.step, history], shown.step,
                        **off_queue)
    wire(shown.play.click, handlers.on_play, shown.autoplay, inputs=[shown.step, history], **off_queue)
    shown.pause.click(lambda: gr.Timer(active=False), outputs=shown.timer, **off_queue)
    shown.pace.change(lambda seconds: gr.Timer(value=seconds), inputs=shown.pace, outputs=shown.timer, **off_queue)
    wire(shown.timer.tick, handlers.on_tick, shown.autoplay, inputs=[shown.step, history], **off_queue)


def build_app(target: LoadedModel, presets: tuple[Preset, ...] | None = None) -> gr.Blocks:
    """The page: controls, the streamed answer, the method's view, live speed, race and step-through.
    `presets`: the models a person may switch to (default: those this machine can run)."""
    # the presets of the device the model runs on: a CPU run on a CUDA machine gets no 7B presets; none on ZeroGPU,
    # whose every call would load one anew
    zero = on_zerogpu()
    if presets is None:  # SPECDEMO_PRESETS=0 (a public Space): only the model the app started with
        presets = available_presets(cuda=target.device.type == "cuda") if LIMITS.presets and not zero else ()
    handlers = Handlers(Targets(target, presets, preload=zero))
    # analytics off; Gradio's copies of exports are deleted after an hour (checked every hour)
    with gr.Blocks(title="SpecDemo", analytics_enabled=False, delete_cache=(EXPORTS_KEPT_S, EXPORTS_KEPT_S)) as app:
        top = header(handlers.targets, target)
        with gr.Tabs(selected="generate") as tabs:
            (lesson_step, pass_cost), generate = lesson_tab(handlers.targets), generate_tab(defaults_for(target.device))
            step_through, race = step_through_tab(), race_tab()
        page = Page(top, tabs, lesson_step, generate, step_through, race, history=gr.State(None), busy=gr.State(False),
                    shown_step=gr.State(None))
        running = wire_generate(page, handlers)
        wire_race(page, handlers, running)
        wire_controls(page, handlers.targets, running)
        wire_step_through(page, handlers)
        ui_offload.wire_pass_cost(pass_cost, handlers, ONE_AT_A_TIME)
        gr.api(api_generate_for(handlers.targets), api_name="generate", **ONE_AT_A_TIME)
    return app


def serve(app: gr.Blocks, **launch) -> None:
    """Queue and launch the page with the limits of `specdemo.app.limits`: decodes wait in one queue of
    LIMITS.queue_size (one runs at a time, `ONE_AT_A_TIME`; each visitor sees their place in it),
    cheap events skip it, and uploads are capped. This thread, which loaded the model, only serves
    from now on: its OpenMP workers go (`live.let_workers_go`)."""
    let_workers_go()
    app.queue(max_size=LIMITS.queue_size).launch(max_file_size=LIMITS.max_upload, **launch)
