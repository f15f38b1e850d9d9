"""The page's handler streams a growing answer from the embedded model (no browser needed)."""

import gradio as gr
import pytest

from specdemo.app.drawing import race_row
from specdemo.app.handlers import stream_answer
from specdemo.app.ui import START_HERE, build_app
from specdemo.core.events import Summary, final_summary
from specdemo.methods import METHODS, ar

from conftest import page_inputs, time_one_round


def test_stream_answer_grows_to_the_full_answer(embedded):
    texts = list(stream_answer(embedded, "Say hello.", max_new_tokens=12))
    input_ids = embedded.encode_chat("Say hello.")
    summary = final_summary(ar.generate(embedded.model, input_ids, max_new_tokens=12,
                                        eos_token_ids=embedded.eos_token_ids))
    assert len(texts) == summary.target_forwards  # one update per target pass
    assert texts[-1] == embedded.decode(summary.tokens) and texts[-1].strip()
    assert len(texts[0]) < len(texts[-1])


def test_build_app(embedded):
    app = build_app(embedded)
    assert isinstance(app, gr.Blocks)
    titles = [block.value for block in app.blocks.values() if isinstance(block, gr.Markdown)
              and "SpecDemo:" in str(block.value)]
    assert len(titles) == 1 and "a language model on a CPU" in titles[0]  # words a class reads, not torch's "cpu"
    # the first screen's hint stays while a lesson step or a person changes the method: it names none
    assert "press Generate" in START_HERE and not [name for name in METHODS if name in START_HERE]


def test_stream_answer_with_speculative_ends_on_the_ar_answer(embedded):
    ar_text = list(stream_answer(embedded, "Name three colors.", max_new_tokens=16))[-1]
    speculative_texts = list(stream_answer(embedded, "Name three colors.", max_new_tokens=16, method="speculative"))
    assert speculative_texts[-1] == ar_text
    assert len(speculative_texts) < 16  # several tokens per target pass


def test_method_views_follow_the_method(embedded):
    from specdemo.app.live import Request, collect, run
    from specdemo.app.views import method_pictures as method_view

    decode = lambda token: embedded.decode([token])  # noqa: E731
    expected = {"jacobi": {"timeline", "trajectory"}, "speculative": {"timeline", "detail", "tree"},
                "lookahead": {"timeline", "detail"}}
    for method, plots in expected.items():
        events, _ = collect(run(embedded, Request("Name three colors.", method, 12)))
        view = method_view(events, decode)
        assert {name for name in ("timeline", "detail", "trajectory", "tree") if view[name] is not None} == plots
        assert ("Candidates verified" in view["html"]) == (method == "lookahead")


def test_why_panel_predicts_from_the_runs_own_numbers():
    from specdemo.app.drawing import why_html

    run_stats = {"forward_passes": 10, "wall_s": 0.5, "tokens_per_forward": 2.0, "draft_forwards": 20,
                 "tokens_per_s": 40.0}
    ar_stats = {"forward_passes": 20, "wall_s": 0.8, "tokens_per_forward": 1.0, "draft_forwards": 0,
                "tokens_per_s": 25.0}
    text = why_html(run_stats, ar_stats, [])
    assert "50.0 ms" in text and "40.0 ms" in text and "1.60x" in text and "faster" in text


def test_race_checks_cllm_against_its_own_ar(embedded):
    """The race row of a fine-tuned copy says whether it equals its own AR, and apart from that
    whether it equals the target's AR (a difference there is expected, not a failure)."""
    from specdemo.app.drawing import race_row
    from specdemo.core.events import Summary

    summary = Summary("cllm", (5, 6, 7), "length", 2, 2)
    numbers = {"tokens_per_s": 30.0, "tokens_per_forward": 1.5}
    row = race_row("cllm", numbers, {"tokens_per_s": 20.0}, 1, summary, str, reference=summary, own_differs=None)
    assert "as its own AR: yes" in row and "as the target's AR: no: first differs at token 1" in row and "1.5x" in row
    assert "own AR" not in race_row("jacobi", numbers, {"tokens_per_s": 20.0}, None, summary, str)


def model_picker(app) -> dict:
    return next(c["props"] for c in app.config["components"] if c["props"].get("elem_id") == "model")


def test_the_model_picker_shows_gpu_presets_only_when_offered(embedded):
    """available_presets() offers the GPU presets only with CUDA; the embedded model is offered
    again with its layers on disk, on any device; the page shows the picker when it offers more than one."""
    from dataclasses import replace

    from specdemo.app.lesson import ON_DISK
    from specdemo.presets import EMBEDDED_PRESET, GPU_PRESETS

    picker = model_picker(build_app(embedded, presets=(EMBEDDED_PRESET,)))
    assert picker["visible"] is True and [choice[0] for choice in picker["choices"]] == [EMBEDDED_PRESET.name, ON_DISK]
    picker = model_picker(build_app(embedded, presets=(*GPU_PRESETS, EMBEDDED_PRESET)))
    assert picker["visible"] is True
    assert picker["value"] == EMBEDDED_PRESET.name
    assert [choice[0] for choice in picker["choices"]] == [EMBEDDED_PRESET.name, *(p.name for p in GPU_PRESETS),
                                                           ON_DISK]
    another = replace(embedded, spec="some/folder")  # a start that is not the embedded model: nothing else to offer
    assert model_picker(build_app(another, presets=()))["visible"] is False


def test_switching_to_a_gpu_preset_loads_its_target_or_says_why_not(embedded):
    from specdemo.app.handlers import Targets
    from specdemo.core.errors import SpecDemoError
    from specdemo.presets import EMBEDDED_PRESET, GPU_PRESETS

    targets = Targets(embedded, (*GPU_PRESETS, EMBEDDED_PRESET))
    assert targets(EMBEDDED_PRESET.name) is embedded and targets(None) is embedded
    with pytest.raises(SpecDemoError, match=GPU_PRESETS[0].target):  # offline here: the Hub cannot serve it
        targets(GPU_PRESETS[0].name)
    with pytest.raises(SpecDemoError, match="unknown model preset"):
        targets("no such preset")


def handler(app, name):
    """The handlers behind the page's events of that name: their updates keyed by name, as `ui.wire` takes them."""
    return [f.fn.__wrapped__ for f in app.fns.values() if getattr(f.fn, "__name__", "") == name]


def test_step_through_follows_every_run_and_stops_at_its_last_step(embedded):
    """Next at the last step stays there (the slider refuses a value past its maximum, and then
    every later one), and each run ends by showing its own last step even when the slider's value
    does not change (two runs of 128 passes both end on step 128)."""
    app = build_app(embedded, presets=())
    forward = next(f.fn for f in app.fns.values() if [getattr(b, "elem_id", None) for b in f.inputs] == ["step", None])
    ten_steps = ([object()] * 10, None, str, None)
    # steps count passes from 1; 0 is before the first
    assert forward(10, ten_steps) == 10 and forward(3, ten_steps) == 4 and forward(0, None) == 0
    assert len(handler(app, "on_step")) == 2  # on the slider's change, and after every run


def test_a_cpu_target_is_offered_no_gpu_presets(embedded, monkeypatch):
    """On a CUDA machine with the app started on the CPU (--device cpu), a 7B preset would load on the CPU."""
    import torch

    from specdemo.app.lesson import ON_DISK
    from specdemo.presets import EMBEDDED_PRESET

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    picker = model_picker(build_app(embedded))  # the embedded model runs on the CPU in the tests
    assert [choice[0] for choice in picker["choices"]] == [EMBEDDED_PRESET.name, ON_DISK]


def test_a_bar_in_a_token_stays_in_its_race_cell():
    summary = Summary("speculative", (1, 2), "length", 2, 2)
    row = race_row("speculative", {"tokens_per_s": 3.0, "tokens_per_forward": 1.5}, {"tokens_per_s": 2.0}, 1, summary,
                   {2: " | x"}.get)
    assert row.replace("\\|", "").count("|") == 7  # six cells


def test_the_app_refuses_a_model_it_cannot_load_with_a_sentence():
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "app.py", "--model", "no/such-model"], capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode != 0 and "no/such-model" in result.stderr and "Traceback" not in result.stderr


def test_the_ar_baseline_streams_first_then_the_run_is_compared_with_it(embedded, monkeypatch):
    """The first run of a prompt streams AR before the method, drawn as the method is; the next run
    of the same prompt reuses it and streams the method at once. Once timed, the speed plot shows the
    timed runs."""
    time_one_round(monkeypatch)  # the streams' order and views are checked, not the timing's numbers
    on_generate = handler(build_app(embedded, presets=()), "on_generate")[0]
    inputs = page_inputs("Name a colour.", "speculative", 8)
    updates = list(on_generate(*inputs))
    baseline = [u for u in updates if "First the AR baseline" in u.get("answer", "")]
    # no statistics nor verdict beside the streaming baseline
    assert all((u["stats"], u["why"]) == ("", "") for u in baseline)
    assert baseline and '<span class="tok" data-origin="ar"' in baseline[-1]["answer"]
    streamed = [u["answer"] for u in updates if "answer" in u]
    assert "data-speedup" in updates[-1]["stats"] and "data-done" in updates[-1]["stats"]
    assert '<span class="tok" data-origin="ar"' not in streamed[-1]
    # the last update holds the method's whole view again: a page that lost a streamed one ends on it
    assert updates[-1]["answer"] == streamed[-1] and updates[-1]["tree"].visible, updates[-1].keys()
    # the speed plot ends on the timed runs the speedup comes from, not on the streams the page drew
    assert "as streamed" in baseline[-1]["speed_plot"].layout.title.text
    timed = updates[-1]["speed_plot"]
    assert "timed run of median speed" in timed.layout.title.text
    assert [trace.name for trace in timed.data] == ["speculative", "ar baseline"]
    again = list(on_generate(*inputs))
    assert not any("First the AR baseline" in u.get("answer", "") for u in again)


def test_a_step_explanation_shows_tokens_as_written(embedded):
    """The sentence is HTML-escaped text: a token like '<b>' or '**' is shown, not rendered."""
    from specdemo.core.events import StepEvent

    on_step = handler(build_app(embedded, presets=()), "on_step")[0]
    history = ([StepEvent("ar", step=0, committed=(5,))], None, {5: "<b>**"}.get, None)
    explained = on_step(history, 1)["explanation"]
    assert "&lt;b&gt;**" in explained and "<b>" not in explained


def test_an_answer_that_differs_from_ar_is_explained(embedded):
    """Generate's verdict and the race's cell say why an answer parts from AR's: in float32 any
    difference is a possible bug, and the sentence names the token and the margin."""
    from specdemo.app.clicks import checks
    from specdemo.app.drawing import difference_note, same_as_ar_html
    from specdemo.app.limits import budget
    from specdemo.app.live import Request

    request = Request("Name a colour.", "speculative", 6)
    ar_summary = final_summary(ar.generate(embedded.model, embedded.encode_chat(request.prompt), max_new_tokens=6,
                                           eos_token_ids=embedded.eos_token_ids))
    wrong = list(ar_summary.tokens)
    wrong[2] = (wrong[2] + 1) % 49152
    other = Summary("speculative", tuple(wrong), "length", 6, 6)
    decode = lambda t: embedded.decode([t])  # noqa: E731
    found = checks(embedded, request, other, ar_summary, budget())
    note = difference_note(found.divergence, "float32", decode)
    assert "At token 2" in note and "bug" in note
    assert "No." in same_as_ar_html(request, other, ar_summary, found, "float32", decode)
    same = checks(embedded, request, ar_summary, ar_summary, budget())
    assert "Yes, token for token" in same_as_ar_html(request, ar_summary, ar_summary, same, "float32", decode)
    row = race_row("speculative", {"tokens_per_s": 3.0, "tokens_per_forward": 1.5}, {"tokens_per_s": 2.0}, 2, other,
                   decode, why=note)
    assert "At token 2" in row and row.replace("\\|", "").count("|") == 7


def test_the_precision_switch_offers_exact_and_the_fast_dtype(embedded, monkeypatch):
    """Exact is float32; fast is the dtype the device multiplies fastest, offered only where that
    is not float32; each precision is its own loaded model (so its own AR baseline)."""
    import pytest

    from specdemo import SpecDemoError
    from specdemo.app import handlers
    from specdemo.app import targets as offered
    from specdemo.app.live import Baselines, Request
    from specdemo.app.targets import EXACT

    monkeypatch.setattr(offered, "fast_dtype", lambda device: "bfloat16")
    targets = handlers.Targets(embedded, ())
    assert list(targets.precisions) == [EXACT, "fast (bfloat16)"] and targets.start_precision == EXACT
    # the switch is unlabelled in the header's row: what it does is said once the start's precision is left
    assert not targets.shows_about(targets.start_name, EXACT) and not targets.about(targets.start_name, "")
    assert targets.shows_about(targets.start_name, "fast (bfloat16)")
    assert "near-tie" in targets.about(targets.start_name, "fast (bfloat16)")
    assert targets(None, EXACT) is embedded and targets(None, "") is embedded
    fast = targets(None, "fast (bfloat16)")
    assert str(fast.dtype) == "torch.bfloat16" and fast.spec == embedded.spec
    baselines, request = Baselines(), Request("Name a colour.", "ar", 4)
    baselines.put(embedded, request, ([], None))
    # same model and prompt, another precision
    assert baselines.known(embedded, request) and not baselines.known(fast, request)
    with pytest.raises(SpecDemoError, match="precision must be one of"):
        targets(None, "fastest")
    monkeypatch.setattr(offered, "fast_dtype", lambda device: "float32")  # an AVX2 CPU: nothing faster than float32
    assert list(handlers.Targets(embedded, ()).precisions) == [EXACT]
    radio = next(c["props"] for c in build_app(embedded, presets=()).config["components"]
                 if c["props"].get("elem_id") == "precision")
    assert radio["visible"] is False


def test_an_answer_the_clicks_budget_cannot_time_again_says_so(embedded, monkeypatch):
    """When not one more round of AR and the method fits what is left of the click's budget, the
    page shows the streamed runs' speed, says it was not timed again, and gives no range."""
    from specdemo.app import clicks

    monkeypatch.setattr(clicks, "MARGIN_S", 10_000.0)  # as if the budget were nearly spent
    on_generate = handler(build_app(embedded, presets=()), "on_generate")[0]
    inputs = page_inputs("Name a fruit.", "speculative", 6)
    table = list(on_generate(*inputs))[-1]["stats"]
    assert "Not timed again" in table and "one drawn run each: no range" in table and "data-done" in table


def test_an_autoplay_tick_never_turns_the_timer_back_on():
    """Pause turns the timer off; a tick already sent and answered after it must not turn it on
    again. A tick moves one step on and leaves the timer alone, and the last step stops it."""
    from specdemo.app.handlers import Handlers

    history = [[object()] * 3]
    ticked = Handlers.on_tick(1, history)
    assert ticked["step"] == 2 and "timer" not in ticked  # unnamed: the timer stays as Play or Pause left it
    ticked = Handlers.on_tick(2, history)
    assert ticked["step"] == 3 and isinstance(ticked["timer"], gr.Timer) and ticked["timer"].active is False
    assert Handlers.on_tick(3, history)["timer"].active is False


def test_the_retrieve_box_reaches_every_method_that_guesses_from_earlier_answers():
    """Unchecked, speculative decoding, Medusa, lookahead and CLLM run without the datastore; other methods get no
    such setting."""
    from specdemo.app.handlers import GENERATE_INPUTS, request_from

    for method in ("speculative", "medusa", "lookahead", "cllm"):
        assert request_from(dict(zip(GENERATE_INPUTS,
                                     page_inputs("Hi.", method, 8, retrieve=False)))).settings["retrieve"] is False
        assert request_from(dict(zip(GENERATE_INPUTS, page_inputs("Hi.", method, 8)))).settings["retrieve"] is True
    assert "retrieve" not in request_from(dict(zip(GENERATE_INPUTS,
                                                   page_inputs("Hi.", "jacobi", 8, retrieve=False)))).settings


def test_the_window_slider_at_0_leaves_each_method_its_own_window():
    """Lookahead's window is 2 columns, the CLLM's 1 (`cllm.WINDOW`): the shared slider's 0 sends none, so each keeps
    its own; any other value reaches both."""
    import inspect

    from specdemo.app.handlers import GENERATE_INPUTS, request_from
    from specdemo.methods import cllm, lookahead

    assert inspect.signature(cllm.generate).parameters["window"].default == cllm.WINDOW != lookahead.WINDOW
    for method in ("lookahead", "cllm"):
        assert "window" not in request_from(dict(zip(GENERATE_INPUTS, page_inputs("Hi.", method, 8)))).settings
        assert request_from(dict(zip(GENERATE_INPUTS, page_inputs("Hi.", method, 8, window=3)))).settings["window"] == 3


def test_a_run_locks_its_settings_and_clears_the_last_runs_outputs():
    """Generate says the run is on and locks the prompt, method and length; the last answer,
    statistics, "why" and verdict are emptied; the lesson note stays only over its own step's run."""
    from specdemo.app import lesson, one_run

    settings = ("prompt", "method", "max_new_tokens")
    started = one_run.start(lesson.TITLES[1], "speculative", lesson.CODE)
    button, locks = started["generate"], [started[name] for name in settings]
    assert button.interactive is False and button.value == one_run.RUNNING \
        and all(lock.interactive is False for lock in locks)
    assert (started["run_status"].visible, started["busy"], started["answer"]) == (False, True, "")
    assert "lesson_note" not in started
    last_run = one_run.start(lesson.TITLES[1], "medusa", lesson.CODE)
    assert [last_run[name] for name in ("stats", "why", "download")] == ["", "", None]
    assert set(one_run.LAST_RUN) <= last_run.keys()
    assert last_run["lesson_note"] == ""  # step 2's note never stands over a Medusa run
    finished = one_run.finish()
    button, locks = finished["generate"], [finished[name] for name in settings]
    assert button.interactive is True and button.value == one_run.GENERATE and all(lock.interactive for lock in locks)
    assert finished["busy"] is False


def test_a_lesson_step_during_a_run_is_set_up_only_once_the_run_has_ended():
    """Chosen while a run is on, a step changes nothing but the status line and the tab (the page
    cancels the run); after the run, `settle` sets it up, clears the run's outputs and says the run
    was stopped for it. Chosen with no run on, it is set up at once; `settle` then leaves it."""
    from specdemo.app import lesson, one_run

    medusa = lesson.TITLES[2]
    set_up = ("method", "prompt", "max_new_tokens")
    during = one_run.lesson_setup(medusa, True)
    assert during.keys() == {"tabs", "run_status"}
    assert one_run.STOPPING in during["run_status"].value
    settled = one_run.settle(medusa, lesson.TITLES[1])
    assert [settled[name] for name in (*set_up, "shown_step")] == ["medusa", lesson.CODE, 64, medusa]
    assert lesson.TITLES[2] in settled["lesson_note"]
    status = settled["run_status"]
    assert one_run.STOPPED_FOR_STEP in status.value and status.visible
    assert settled["answer"] == "" and set(one_run.LAST_RUN) <= settled.keys()
    at_once = one_run.lesson_setup(medusa, False)
    assert [at_once[name] for name in set_up] == ["medusa", lesson.CODE, 64]
    assert one_run.settle(medusa, medusa) == {}
    # the race's step opens the Race tab
    assert "Press Race" in one_run.settle(lesson.TITLES[-1], medusa)["run_status"].value


def test_an_example_during_a_run_leaves_the_runs_prompt_alone():
    from specdemo.app import lesson, one_run

    refused = one_run.example_chosen(lesson.LIST, True)
    assert refused.keys() == {"run_status"} and one_run.EXAMPLE_REFUSED in refused["run_status"].value
    chosen = one_run.example_chosen(lesson.LIST, False)
    assert chosen["prompt"] == lesson.LIST and not chosen["run_status"].visible
    assert chosen["answer"] == "" and set(one_run.LAST_RUN) <= chosen.keys()


def test_the_race_tab_says_which_prompt_it_races_on(embedded):
    """The Race tab has no prompt of its own: it races Generate's, and says so where its methods are chosen."""
    props = next(c["props"] for c in build_app(embedded, presets=()).config["components"]
                 if c["props"].get("elem_id") == "race-methods")
    assert "prompt" in props["info"] and "Generate tab" in props["info"]
