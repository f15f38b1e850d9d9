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
- The lesson note stays over a run only when the run is the chosen step's (its method and prompt)."""

import gradio as gr

from specdemo.app import lesson

GENERATE = "Generate"
RUNNING = "Running… (Stop ends it)"
STOPPING = "Stopping the answer that is running, to set up the step chosen…"
STOPPED_FOR_STEP = "Stopped the answer that was running, to set up this step."
EXAMPLE_REFUSED = "An answer is running: the prompt stays its own. Press Stop first to try an example."
LAST_RUN_SIZE = 11  # the outputs `cleared` empties, in the page's order (`ui.GenerateTab.last_run`)


def cleared() -> list:
    """The run's outputs emptied: the answer, the method's plots (all but the first hidden), its
    HTML, the speed plot, the statistics, "why" with the verdict, and the events' download."""
    return ["", gr.Plot(value=None), *[gr.Plot(value=None, visible=False) for _ in range(4)], "", None, "", "", None]


def said(sentence: str) -> gr.HTML:
    """The status line beside Generate: `sentence`, or hidden when there is none (it takes no room)."""
    return gr.HTML(f'<p class="specdemo-status">{sentence}</p>' if sentence else "", visible=bool(sentence))


def locked(locking: bool) -> list:
    """The prompt, method and length, locked while a run of them is on and unlocked after."""
    return [gr.Textbox(interactive=not locking), gr.Dropdown(interactive=not locking), gr.Number(interactive=not locking)]


def is_steps_run(title: str | None, method: str, prompt: str) -> bool:
    if title not in lesson.TITLES:
        return False
    chosen = lesson.step_named(title)
    return (chosen.method, chosen.prompt) == (method, prompt)


def start(title: str | None, method: str, prompt: str) -> tuple:
    """A Generate click, before its run is queued: Generate says the run is on, its settings lock,
    the last run's outputs and the status line clear, the lesson note stays only over its own step.
    Outputs: generate, prompt, method, max_new_tokens, status, lesson_note, busy, *last_run."""
    note = gr.skip() if is_steps_run(title, method, prompt) else ""
    return (gr.Button(RUNNING, interactive=False), *locked(True), said(""), note, True, *cleared())


def finish() -> tuple:
    """The run ended (its end, Stop, a lesson step, an error): Generate and the settings open again.
    Outputs: generate, prompt, method, max_new_tokens, busy."""
    return (gr.Button(GENERATE, interactive=True), *locked(False), False)


def set_up(title: str, status: str) -> tuple:
    """Lesson step `title` on Generate: its method, prompt and length, what to look at, the last
    answer cleared, `status` beside Generate, and the tab the step opens (Race for the race's step).
    Outputs: method, prompt, max_new_tokens, lesson_note, tabs, status, shown_step, *last_run."""
    chosen = lesson.step_named(title)
    return (chosen.method or gr.skip(), chosen.prompt, chosen.max_new_tokens, lesson.notice_html(chosen), step_tab(chosen), said(status), title,
            *cleared())


def step_tab(chosen: lesson.Step) -> gr.Tabs:
    return gr.Tabs(selected="race-tab" if not chosen.method else "generate")


def lesson_setup(title: str, busy: bool) -> tuple:
    """A lesson step chosen. With no run on, it is set up at once (`set_up`). With a run on, the
    page stops the run (the event cancels it) and says so; the step is set up by `settle` once the
    run has ended, so no late update of the stopped run can land beside the new step.
    Outputs: as `set_up`'s."""
    if title not in lesson.TITLES:
        return gr.skip(), gr.skip(), gr.skip(), "", gr.skip(), gr.skip(), gr.skip(), *[gr.skip()] * LAST_RUN_SIZE
    if busy:
        return *[gr.skip()] * 4, step_tab(lesson.step_named(title)), said(STOPPING), gr.skip(), *[gr.skip()] * LAST_RUN_SIZE
    return set_up(title, "")


def settle(title: str | None, shown_step: str | None) -> tuple:
    """After a run ended: a lesson step chosen while it ran, and not yet on screen, is set up now,
    saying that the run was stopped for it. Outputs: as `set_up`'s."""
    if title not in lesson.TITLES or title == shown_step:
        return *[gr.skip()] * 7, *[gr.skip()] * LAST_RUN_SIZE
    button = "Generate" if lesson.step_named(title).method else "Race (on the Race tab)"
    return set_up(title, f"{STOPPED_FOR_STEP} Press {button} to run it.")


def method_chosen(how: str) -> tuple:
    """A new method: how it works (`how`), and the last run's outputs cleared.
    Outputs: how, *last_run."""
    return how, *cleared()


def example_chosen(example: str, busy: bool) -> tuple:
    """An example clicked: the prompt, and the last answer cleared; during a run, nothing but a
    sentence saying why. Outputs: prompt, status, *last_run."""
    if busy:
        return gr.skip(), said(EXAMPLE_REFUSED), *[gr.skip()] * LAST_RUN_SIZE
    return example, said(""), *cleared()
