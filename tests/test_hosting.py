"""Hosting for a classroom (docs/hosting.md): limits from the environment, one budget per click,
ZeroGPU durations, a hostile race bounded, and Stop ending a race."""


from pathlib import Path

import pytest

from specdemo import SpecDemoError
from specdemo.app import drawing, handlers, limits, live, ui
from specdemo.app import targets as offered
from specdemo.app.targets import EXACT
from specdemo.methods import METHODS

from conftest import page_inputs

real_run = live.run  # the tests below wrap it


def test_limits_come_from_the_environment_with_a_sentence_for_a_bad_value():
    assert limits.limits_from({}) == limits.Limits()
    custom = limits.limits_from({"SPECDEMO_BUDGET_S": "30", "SPECDEMO_QUEUE_SIZE": "100", "SPECDEMO_PRESETS": "0",
                                 "SPECDEMO_MAX_NEW_TOKENS": "64"})
    assert (custom.budget_s, custom.queue_size, custom.presets, custom.max_new_tokens) == (30.0, 100, False, 64)
    for name, value in [("SPECDEMO_BUDGET_S", "soon"), ("SPECDEMO_QUEUE_SIZE", "-3"), ("SPECDEMO_PRESETS", "maybe")]:
        with pytest.raises(SpecDemoError, match=name):
            limits.limits_from({name: value})


def test_a_budget_is_a_deadline_that_comes_when_its_seconds_have_passed():
    stop = limits.budget(0.05)
    assert not stop.is_set() and stop.wait(5)


def handler(app, name: str):
    """The handler behind one of the page's events (`on_generate`, `on_race`...): its updates keyed by name."""
    return next(block.fn.__wrapped__ for block in app.fns.values() if getattr(block.fn, "__name__", "") == name)


def test_a_race_takes_known_methods_once_each():
    # the page's order, each once
    assert live.race_methods(["jacobi", "speculative"] * 300) == ["speculative", "jacobi"]
    assert live.race_methods(list(METHODS)) == [m for m in METHODS if m != "ar"]
    for bad, says in [("speculative", "list of method names"), ([["ar"]], "list of method names"),
                      (["nope"], "unknown method"), (["ar"], "at least one")]:
        with pytest.raises(SpecDemoError, match=says):
            live.race_methods(bad)


def test_a_hostile_race_runs_each_method_once(embedded, monkeypatch):
    """The race posted with its method list repeated 300 times races each method once a round."""
    monkeypatch.setattr(handlers, "RACE_MEASURE_S", 0.0)  # the fewest rounds: 2
    runs = []
    monkeypatch.setattr(live, "run", lambda target, request, stop=None:
                        runs.append(request.method) or real_run(target, request, stop))
    race = handler(ui.build_app(embedded, presets=()), "on_race")
    table = list(race(None, None, "Say yes.", ["jacobi", "lookahead"] * 300, 4))[-1]["table"]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert [row.split("|")[1].strip() for row in rows] == ["ar", "lookahead", "jacobi"]
    assert runs == ["ar", "lookahead", "jacobi", "jacobi", "lookahead", "ar"]


def test_stop_ends_a_race_between_two_passes(embedded, monkeypatch):
    """Stop cancels the race's generator (as Gradio does): the method running then stops at its
    next pass, and no later method starts."""
    summaries = []

    started = []

    def recorded(target, request, stop=None):
        started.append(request.method)
        for item in real_run(target, request, stop):
            if isinstance(item, live.Summary):
                summaries.append((request.method, item))
            yield item

    monkeypatch.setattr(live, "run", recorded)
    monkeypatch.setattr(live, "TICK_S", 0.01)
    race = handler(ui.build_app(embedded, presets=()), "on_race")
    updates = race(None, None, "Count from one to two hundred, one number a line.", ["jacobi", "lookahead"], 120)
    for update in updates:
        # a tick while lookahead runs, after ar's run
        if started == ["ar", "lookahead"] and "lookahead running" in update.get("table", ""):
            break
    updates.close()  # what the Stop button does
    assert [method for method, _ in summaries] == ["ar", "lookahead"]  # jacobi never started
    assert summaries[-1][1].finish_reason == "stopped" and len(summaries[-1][1].tokens) < 120


def test_the_presets_can_be_turned_off(embedded, monkeypatch):
    monkeypatch.setattr(ui, "LIMITS", limits.Limits(presets=False))
    monkeypatch.setattr(ui, "available_presets", lambda cuda: pytest.fail("presets were offered"))
    ui.build_app(embedded)


def test_exports_do_not_pile_up(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(drawing, "EXPORTS", tmp_path)
    old = tmp_path / "specdemo-run-old.json"
    old.write_text("{}")
    os.utime(old, (0, 0))
    fresh = drawing.export_events([], None)
    assert not old.exists() and os.path.exists(fresh)


def test_nan_in_a_slider_or_an_api_value_is_answered_with_a_sentence(embedded):
    """A raw event can carry NaN (JSON clients cannot, but a hand-made request can): the handlers
    answer it with a sentence naming the setting, as they answer every bad value."""
    import gradio as gr

    app = ui.build_app(embedded, presets=())
    with pytest.raises(gr.Error, match="temperature must be a number"):
        list(handler(app, "on_generate")(*page_inputs("Name a colour.", "ar", 8, do_sample=True,
                                                      temperature=float("nan"))))
    with pytest.raises(gr.Error, match="block_size must be a number"):
        list(handler(app, "on_generate")(*page_inputs("Name a colour.", "ar", 8, do_sample=True,
                                                      block_size=float("nan"))))
    generate = handlers.api_generate_for(handlers.Targets(embedded, ()))
    with pytest.raises(gr.Error, match="top_p must be a number"):
        generate("hi", "ar", 8, True, 1.0, 0, float("nan"))
    assert generate("Say hi.", "ar", 4)[1]["tokens"] >= 1


def test_one_preset_is_resident_at_a_time(embedded, monkeypatch):
    """Asking for another preset (or precision) evicts the one loaded before, and frees its
    memory, before loading the next; the start model always stays."""
    from types import SimpleNamespace

    from specdemo.presets import Preset

    loaded, evicted = [], []

    def load(spec, dtype, device, device_map=None):
        model = SimpleNamespace(spec=spec, dtype=dtype)
        loaded.append((model, targets.resident))  # what was resident while it loaded
        return model

    monkeypatch.setattr(offered, "load_model", load)
    monkeypatch.setattr(offered, "free_memory", lambda: evicted.append(targets.resident))
    targets = handlers.Targets(embedded, (Preset("A", "org/a"), Preset("B", "org/b")))
    a = targets("A", EXACT)
    assert targets("A", EXACT) is a and evicted == []  # resident: not loaded again
    b = targets("B", EXACT)
    assert evicted == [None] and loaded == [(a, None), (b, None)]  # A dropped, its memory freed, then B loaded
    assert targets(None, EXACT) is embedded and targets.resident is b  # the start is never evicted


def test_a_space_starts_without_the_gpu_presets_and_its_readme_preloads_the_model_and_asks_for_zerogpu():
    assert limits.limits_from({}).presets and not limits.limits_from({"SPACE_ID": "someone/specdemo"}).presets
    assert limits.limits_from({"SPACE_ID": "someone/specdemo", "SPECDEMO_PRESETS": "1"}).presets
    front = Path(__file__).resolve().parents[1].joinpath("README.md").read_text().split("---")[1]
    assert "preload_from_hub:\n  - HuggingFaceTB/SmolLM2-135M-Instruct" in front \
        and "models:\n  - HuggingFaceTB/SmolLM2-135M-Instruct" in front
    # ZeroGPU's hardware name on the Hub, so that a teacher's duplicate of the Space is offered it
    assert "\nsuggested_hardware: zero-a10g\n" in front
