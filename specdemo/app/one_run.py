"""One run on screen at a time: what a Generate click, the end of its run, a lesson step, a
change of method and an example do to the page. Events only; the layout is `specdemo.app.ui`'s.

Rules:
- While a run waits in the queue or decodes, Generate is disabled and says the run is on, and the
  prompt, method and length it started with are locked: no second click is dropped unseen, and
  the controls always describe the answer below them.
- A run clears the last run's answer, pictures, statistics, "why" and verdict as it starts.
- A lesson step stops the run in progress (the page says so), then, once the run has ended, sets
  the step's method, prompt and length and clears the last answer; a new method clears it too.
  So the page never shows one run's lesson note, prompt or method beside another run's answer,
  statistics or verdict.
- An example chosen during a run leaves the run's prompt alone, and says so; chosen after, it
  replaces the prompt and clears the last answer.
- The lesson note stays over a run only when the run is the chosen step's (its method and prompt).

Each function returns a dict of updates keyed by the name of what it changes (the names of
`ui.GenerateTab`'s and `ui.Page`'s fields, the last run's by `LAST_RUN`); what it does not name stays as it is."""

import gradio as gr

from specdemo.app import lesson
from specdemo.app.drawing import PLOTS

GENERATE = "Generate"
RUNNING = "Running… (Stop ends it)"
STOPPING = "Stopping the answer that is running, to set up the step chosen…"
STOPPED_FOR_STEP = "Stopped the answer that was running, to set up this step."
EXAMPLE_REFUSED = "An answer is running: the prompt stays its own. Press Stop first to try an example."
LAST_RUN = ("answer", *PLOTS, "method_html", "speed_plot", "stats", "why", "download")  # what `cleared` empties


def cleared() -> dict:
    """The run's outputs emptied: the answer, the method's plots (all but the first hidden), its
    HTML, the speed plot, the statistics, "why" with the verdict, and the events' download."""
    first, *others = PLOTS
    return {"answer": "", first: gr.Plot(value=None), **{name: gr.Plot(value=None, visible=False) for name in others},
            "method_html": "", "speed_plot": None, "stats": "", "why": "", "download": None}


def said(sentence: str) -> gr.HTML:
    """The status line beside Generate: `sentence`, or hidden when there is none (it takes no room)."""
    return gr.HTML(f'<p class="specdemo-status">{sentence}</p>' if sentence else "", visible=bool(sentence))


def locked(locking: bool) -> dict:
    """The prompt, method and length, locked while a run of them is on and unlocked after."""
    return {"prompt": gr.Textbox(interactive=not locking), "method": gr.Dropdown(interactive=not locking),
            "max_new_tokens": gr.Number(interactive=not locking)}


def is_steps_run(title: str | None, method: str, prompt: str) -> bool:
    if title not in lesson.TITLES:
        return False
    chosen = lesson.step_named(title)
    return (chosen.method, chosen.prompt) == (method, prompt)


def start(title: str | None, method: str, prompt: str) -> dict:
    """A Generate click, before its run is queued: Generate says the run is on, its settings lock,
    the last run's outputs and the status line clear, the lesson note stays only over its own step.
    Names: generate, prompt, method, max_new_tokens, run_status, lesson_note, busy and `LAST_RUN`."""
    note = {} if is_steps_run(title, method, prompt) else {"lesson_note": ""}
    return {"generate": gr.Button(RUNNING, interactive=False), **locked(True), "run_status": said(""), **note,
            "busy": True, **cleared()}


def finish() -> dict:
    """The run ended (its end, Stop, a lesson step, an error): Generate and the settings open again.
    Names: generate, prompt, method, max_new_tokens, busy."""
    return {"generate": gr.Button(GENERATE, interactive=True), **locked(False), "busy": False}


def set_up(title: str, status: str, models: tuple[str, ...] = ()) -> dict:
    """Lesson step `title` on Generate: its method, prompt and length, what to look at, the last
    answer cleared, `status` beside Generate, and the tab the step opens (Race for the race's step).
    With the page's model menu (`models`, the start first), the step's model too: its own where
    the menu offers it, else the start. Names: method (but for the race's step), model (with
    `models`), prompt, max_new_tokens, lesson_note, tabs, run_status, shown_step and `LAST_RUN`."""
    chosen = lesson.step_named(title)
    model = {"model": chosen.model if chosen.model in models else models[0]} if models else {}
    return {**({"method": chosen.method} if chosen.method else {}), **model, "prompt": chosen.prompt,
            "max_new_tokens": chosen.max_new_tokens, "lesson_note": lesson.notice_html(chosen),
            "tabs": step_tab(chosen), "run_status": said(status), "shown_step": title, **cleared()}


def step_tab(chosen: lesson.Step) -> gr.Tabs:
    return gr.Tabs(selected="race-tab" if not chosen.method else "generate")


def lesson_setup(title: str, busy: bool, models: tuple[str, ...] = ()) -> dict:
    """A lesson step chosen. With no run on, it is set up at once (`set_up`). With a run on, the
    page stops the run (the event cancels it) and says so; the step is set up by `settle` once the
    run has ended, so no late update of the stopped run can land beside the new step.
    Names: among `set_up`'s."""
    if title not in lesson.TITLES:
        return {"lesson_note": ""}
    if busy:
        return {"tabs": step_tab(lesson.step_named(title)), "run_status": said(STOPPING)}
    return set_up(title, "", models)


def settle(title: str | None, shown_step: str | None, models: tuple[str, ...] = ()) -> dict:
    """After a run ended: a lesson step chosen while it ran, and not yet on screen, is set up now,
    saying that the run was stopped for it. Names: among `set_up`'s."""
    if title not in lesson.TITLES or title == shown_step:
        return {}
    button = "Generate" if lesson.step_named(title).method else "Race (on the Race tab)"
    return set_up(title, f"{STOPPED_FOR_STEP} Press {button} to run it.", models)


def method_chosen(how: str) -> dict:
    """A new method: how it works (`how`), and the last run's outputs cleared.
    Names: how and `LAST_RUN`."""
    return {"how": how, **cleared()}


def example_chosen(example: str, busy: bool) -> dict:
    """An example clicked: the prompt, and the last answer cleared; during a run, nothing but a
    sentence saying why. Names: prompt, run_status and `LAST_RUN`."""
    if busy:
        return {"run_status": said(EXAMPLE_REFUSED)}
    return {"prompt": example, "run_status": said(""), **cleared()}
