"""The page's model with its layers on disk, and the pass-cost picture: drawn from a tiny model's
measured passes (no browser), measured by the Measure button's handler, and the model on disk
giving AR's answer through the page's handlers (float32)."""

from types import SimpleNamespace

import pytest
import torch
from test_ui import handler

from specdemo import passcost, placement
from specdemo.app import clicks, handlers, lesson, one_run, views
from specdemo.app.limits import Deadline, budget
from specdemo.app.ui import build_app

from conftest import make_tiny_model, page_inputs

WIDTHS = (1, 4, 8)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A tiny model's passes by width, in memory and with both its layers on disk (accelerate reads them in)."""
    on_disk = placement.dispatch(make_tiny_model(), placement.disk_map(make_tiny_model(), torch.device("cpu")),
                                 tmp_path_factory.mktemp("offload"))
    return {where: passcost.pass_costs(model, WIDTHS, context=8, repeats=1)
            for where, model in (("in memory", make_tiny_model()), ("offloaded", on_disk))}


def test_the_pass_cost_picture_draws_each_line_against_its_own_one_token_pass(measured):
    figure = views.pass_cost_figure(measured)
    lines = {trace.name: trace for trace in figure.data}
    assert list(lines) == ["in memory", "offloaded"]
    for where, line in lines.items():
        ms = measured[where]
        assert list(line.x) == list(WIDTHS) and line.y[0] == 1.0
        assert list(line.y) == pytest.approx([ms[w] / ms[1] for w in WIDTHS])
        assert list(line.customdata) == pytest.approx([ms[w] for w in WIDTHS])  # the milliseconds, on hover
    assert "nearly free when the line is flat" in figure.layout.title.text
    assert figure.layout.xaxis.title.text == "tokens checked in one pass"
    assert figure.layout.yaxis.title.text == "cost against a 1-token pass"


def test_the_pass_cost_sentence_says_how_far_and_then_what_it_found():
    costs = {"in memory": {1: 10.0, 16: 30.0}, "offloaded": {1: 100.0, 16: 110.0}}
    assert "2 of 5 widths done" in views.pass_cost_sentence(costs, (1, 4, 8, 16, 32), "cpu, float32", False)
    done = views.pass_cost_sentence(costs, (1, 16), "cpu, float32", True)
    assert "checking 16 tokens costs 3.0x a 1-token pass in memory, and 1.1x a 1-token pass offloaded" in done
    assert "ran out after 2 of 3" in views.pass_cost_sentence(costs, (1, 16, 32), "cpu", True)
    assert "before a pass was measured" in views.pass_cost_sentence({"in memory": {}}, (1,), "cpu", True)


def test_measuring_yields_a_record_a_width_and_stops_at_the_clicks_deadline(monkeypatch):
    monkeypatch.setattr(clicks, "PASS_WIDTHS", (1, 2))
    monkeypatch.setattr(clicks, "PASS_CONTEXT", 8)
    monkeypatch.setattr(clicks, "PASS_REPEATS", 1)
    tiny = SimpleNamespace(model=make_tiny_model(), device=torch.device("cpu"), dtype=torch.float32)
    records = list(clicks.pass_cost_records({"in memory": tiny, "again": tiny}, budget(60)))
    assert [sorted(r.costs["again"]) for r in records] == [[1], [1, 2], [1, 2]] and records[-1].done
    assert records[0].device == "cpu" and records[0].dtype == "float32"
    ended = Deadline(0.0)  # a click whose time is up: nothing measured, the last record says so
    assert [(r.costs, r.done) for r in clicks.pass_cost_records({"in memory": tiny}, ended)] == [({"in memory": {}},
                                                                                                   True)]


@pytest.fixture(scope="module")
def page(embedded):
    """The page's handlers on the embedded model (float32), which offer it again with its layers on disk."""
    return handlers.Handlers(handlers.Targets(embedded, ()))


def test_the_measure_button_draws_the_picture_on_this_machine(embedded, page, monkeypatch):
    assert len(handler(build_app(embedded, presets=()), "on_measure")) == 1  # the button's event
    monkeypatch.setattr(clicks, "PASS_WIDTHS", (1, 4))
    monkeypatch.setattr(clicks, "PASS_CONTEXT", 8)
    monkeypatch.setattr(clicks, "PASS_REPEATS", 1)
    updates = list(page.on_measure())
    drawn = [update for update in updates if "pass_cost_plot" in update]
    assert len(drawn) == 3  # after each width, then done
    lines = {trace.name: list(trace.x) for trace in drawn[-1]["pass_cost_plot"].data}
    assert lines == {"in memory": [1, 4], "offloaded": [1, 4]}
    assert "Measured on this machine (cpu, float32)" in drawn[-1]["pass_cost_note"]


def test_the_model_on_disk_is_offered_and_gives_ars_answer(page, monkeypatch):
    targets = page.targets
    assert targets.names == [targets.start_name, lesson.ON_DISK] and "on disk" in targets.about(lesson.ON_DISK)
    monkeypatch.setattr(clicks, "MARGIN_S", 10_000.0)  # no timing rounds: the answer and its verdict only
    updates = list(page.on_generate(*page_inputs("Name a fruit.", "speculative", 8, model=lesson.ON_DISK)))
    assert "Same answer as AR?</b> Yes, token for token" in updates[-1]["why"]  # AR's on the model on disk
    generate = handlers.api_generate_for(targets)
    expected = generate("Name a fruit.", "ar", 8)[0]  # AR's on the model in memory
    assert generate("Name a fruit.", "speculative", 8, model=lesson.ON_DISK)[0] == expected
    assert targets.resident.placed and targets(lesson.ON_DISK) is targets.resident  # loaded once, held


def test_a_lesson_step_sets_its_model_and_the_others_the_start():
    models = ("embedded", lesson.ON_DISK)
    on_disk = next(step for step in lesson.LESSON if step.model == lesson.ON_DISK)
    assert on_disk.prompt == lesson.LESSON[1].prompt and on_disk.method == "speculative"  # step 2 on the model on disk
    assert one_run.set_up(on_disk.title, "", models)["model"] == lesson.ON_DISK
    assert one_run.set_up(lesson.TITLES[1], "", models)["model"] == "embedded"
    assert one_run.set_up(on_disk.title, "", ("embedded",))["model"] == "embedded"  # a page without it: the start
    assert "model" not in one_run.set_up(on_disk.title, "")
