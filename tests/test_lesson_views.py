"""The lesson's pictures and numbers, driven by a tiny model's events (no browser): the statistics
table, the step's beats, the best pass, Jacobi's initial guess, the race's replay and chart, the
timing rounds and their spread, and the lesson's data."""

import re
import threading

import pytest

from specdemo.app import lesson, live, views
from specdemo.app.limits import Deadline, budget, time_left
from specdemo.app.live import Spread, rounds_for, spread
from specdemo.core.events import StepEvent, Summary
from specdemo.methods import METHODS, ar, jacobi, lookahead, medusa, speculative
from specdemo.methods.draft import Draft

from conftest import make_tiny_model
from test_medusa import random_heads

TOKENS = 20


@pytest.fixture(scope="module")
def target():
    return make_tiny_model()


def events_of(generate, model, **options):
    import torch

    items = list(generate(model, torch.tensor([[5, 17, 42, 8, 63, 21]]), max_new_tokens=TOKENS, **options))
    return [item for item in items if isinstance(item, StepEvent)], items[-1]


@pytest.fixture(scope="module")
def runs(target):
    """Each kind of proposer's events on the tiny model: a draft's tree, Medusa's heads, lookahead's n-grams,
    Jacobi's block, and AR."""
    right = Draft("target", target)  # the target as its own draft: every guess right, so passes commit several tokens
    return {
        "ar": events_of(ar.generate, target),
        "speculative": events_of(speculative.generate, target, draft=right, gamma=3, draft_tree_size=6),
        "medusa": events_of(medusa.generate, target, heads=random_heads(target), tree="dynamic", tree_size=8),
        "lookahead": events_of(lookahead.generate, target, window=3, ngram=3, candidates=3),
        "jacobi": events_of(jacobi.generate, target, block_size=5),
    }


decode = lambda token: f"<{token}>"  # noqa: E731 (a token's text, visibly escaped)


def stats_of(events, summary):
    return live.stats(events, summary)


def test_the_statistics_table_defines_each_number_so_none_contradicts_another(runs):
    events, summary = runs["speculative"]
    numbers = stats_of(events, summary)
    table = views.stats_html(numbers, Spread(1.31, 1.2, 1.4, 5), 20.0, done=True)
    rows = dict(re.findall(r"<tr><th>([^<]+)</th><td>(.*?)</td>", table))
    assert rows["Tokens committed"] == str(numbers["tokens"]) \
        and rows["Target passes"] == str(numbers["forward_passes"])
    assert float(rows["Tokens per target pass"]) == pytest.approx(numbers["tokens"] / numbers["forward_passes"],
                                                                  abs=0.01)
    # tokens per pass = accepted per pass + the target's own token each pass: the two read together
    accepted_per_pass = float(rows["Accepted per pass"])
    assert accepted_per_pass == pytest.approx(numbers["accepted"] / numbers["forward_passes"], abs=0.01)
    assert float(rows["Tokens per target pass"]) == pytest.approx(1 + accepted_per_pass, abs=0.06)
    assert rows["Guesses accepted"].startswith(f"{numbers['accepted']} (")
    assert "1.31x" in rows["Speedup against AR"] and "1.20x to 1.40x" in rows["Speedup against AR"]
    assert 'data-method="speculative"' in table and "data-done" in table and 'data-low="1.2000"' in table
    assert "accepted ÷ checked" in table and "tokens committed ÷ target passes" in table  # each number says what it is
    ar_table = views.stats_html(stats_of(*runs["ar"]))  # no guesses: no acceptance rows, no speed yet
    assert "Guesses" not in ar_table and "Speedup" not in ar_table and "data-done" not in ar_table


@pytest.mark.parametrize(("method", "who"), [("speculative", "The draft model"), ("medusa", "Medusa's heads"),
                                             ("lookahead", "Lookahead's n-grams"), ("jacobi", "The Jacobi block")])
def test_a_step_shows_draft_verify_and_accept_as_three_beats(runs, method, who):
    events, _ = runs[method]
    event = next(e for e in events if e.proposed)
    beats = views.beats_html(event, decode)
    titles = re.findall(r"<h4>([^<]+)</h4>", beats)
    assert titles == ["1. Draft", "2. Verify", "3. Accept"]
    assert who in beats and "one pass" in beats
    guessed = re.findall(r'data-origin="guess">([^<]*)<', beats)
    assert guessed == [decode(t).replace("<", "&lt;").replace(">", "&gt;") for t in event.proposed]
    assert beats.count('class="tok" data-origin="accepted"') == len(event.accepted) \
        and beats.count('class="tok" data-origin="rejected"') == len(event.rejected)
    assert f'data-step="{event.step + 1}"' in beats


def test_a_step_without_guesses_is_one_beat(runs):
    beats = views.beats_html(runs["ar"][0][3], decode)
    assert re.findall(r"<h4>([^<]+)</h4>", beats) == ["Pass"] and "Draft" not in beats


def test_step_through_outlines_the_current_steps_tokens(runs):
    events, _ = runs["speculative"]
    shown = views.stream_html(events[:3], decode, current=True)
    current = re.findall(r'<span class="tok" data-origin="(\w+)" data-current', shown)
    assert len(current) == len(views.token_origins(events[2])) \
        and "data-current title" not in views.stream_html(events[:3], decode)


@pytest.mark.parametrize("method", ["speculative", "medusa"])
def test_the_tree_methods_show_the_pass_that_committed_the_most(runs, method):
    events, _ = runs[method]
    best = max(events, key=lambda e: len(e.committed))
    pictures = views.method_pictures(events, decode)
    title = pictures["best"].layout.title.text
    assert title.startswith(views.BEST) and f"step {best.step + 1}, {len(best.committed)} tokens" in title
    assert views.best_event(events) is best \
        and events.index(best) == min(i for i, e in enumerate(events) if len(e.committed) == len(best.committed))


def test_jacobi_shows_the_block_of_its_best_pass_and_lookahead_its_window(runs):
    events, _ = runs["jacobi"]
    best = views.best_event([e for e in events if e.proposed])
    figure = views.method_pictures(events, decode)["best"]
    block = next(b for b in views.jacobi_blocks(events) if best in b)
    assert len(figure.data[0].z) == len(block) and f"step {best.step + 1}" in figure.layout.title.text
    html = views.method_pictures(runs["lookahead"][0], decode)["html"]
    assert html.index(views.BEST) < html.index("The latest pass")


def test_jacobis_initial_guess_is_step_0(runs):
    events, _ = runs["jacobi"]
    pictures = views.before_pictures(events, decode)
    figure = pictures["trajectory"]
    heatmap = figure.data[0]
    # one row: the guess, nothing checked yet
    assert [list(row) for row in heatmap.z] == [[0] * len(events[0].data.state)]
    assert list(heatmap.text[0]) == [decode(t) for t in events[0].data.state]
    assert "before any pass" in figure.layout.title.text and figure.layout.yaxis.ticktext == ("initial guess",)
    after = views.trajectory_figure(views.jacobi_blocks(events)[0], decode)
    assert after.layout.yaxis.ticktext[:2] == ("initial guess", "after pass 1")
    assert views.before_pictures(runs["ar"][0], decode)["trajectory"] is None


def test_jacobis_guesses_are_not_drawn_as_failures(runs):
    names = {bar.name for bar in views.step_timeline_figure(runs["jacobi"][0]).data}
    assert views.REFINED in names and "rejected" not in names
    assert "rejected" in {bar.name for bar in views.step_timeline_figure(runs["speculative"][0]).data
                          if any(bar.y)} | {"rejected"}


def test_a_replay_shows_each_run_as_it_was_at_each_moment(runs):
    raced = [("ar", runs["ar"][0]), ("speculative", runs["speculative"][0])]
    frames = list(views.replay_frames(raced, every_s=0.0005))
    assert len(frames) >= 2
    for before, after in zip(frames, frames[1:]):
        for (_, shown_before), (_, shown_after) in zip(before, after):
            assert shown_after[: len(shown_before)] == shown_before  # a frame only adds
    last = frames[-1]
    assert [shown for _, shown in last] == [events for _, events in raced] \
        and all(", done" in label for label, _ in last)
    end = max(events[-1].elapsed_s for _, events in raced)
    for _, shown in frames[0]:
        assert all(e.elapsed_s <= min(0.0005, end) for e in shown)


def test_the_race_ends_in_bars_with_their_spreads(runs):
    """The race's chart from the tiny model's runs, as the race builds it: a speedup with its
    range against AR's runs, and tokens per pass over the runs."""
    timed = {"ar": [runs["ar"]] * 3, "speculative": [runs["speculative"]] * 3}
    results = [{"method": m, "speedup": spread(live.speeds(r), live.speeds(timed["ar"])),
                "tokens_per_pass": [stats_of(*run)["tokens_per_forward"] for run in r]}
               for m, r in timed.items()]
    figure = views.race_figure(results)
    speed, per_pass = figure.data
    gain = results[1]["speedup"]
    assert list(speed.x) == ["ar", "speculative"] and list(speed.y) == pytest.approx([1.0, gain.median])
    assert list(speed.error_y.array) == pytest.approx([0, gain.high - gain.median]) \
        and list(speed.error_y.arrayminus) == pytest.approx([0, gain.median - gain.low])
    assert list(per_pass.y) == pytest.approx([1.0, stats_of(*runs["speculative"])["tokens_per_forward"]]) \
        and per_pass.y[1] > 1
    assert "3 timed runs" in figure.layout.title.text
    uneven = views.race_figure([{"method": "ar", "speedup": Spread(1.0, 0.9, 1.1, 1), "tokens_per_pass": [1.0]},
                                {"method": "medusa", "speedup": Spread(1.4, 1.3, 1.5, 1),
                                 "tokens_per_pass": [2.2, 2.0, 2.1]}])
    assert list(uneven.data[1].error_y.array) == pytest.approx([0, 0.1]) \
        and list(uneven.data[1].error_y.arrayminus) == pytest.approx([0, 0.1])
    assert "1 timed run of" in uneven.layout.title.text


def test_a_speedup_is_a_median_with_the_range_of_every_pairing():
    measured = spread([30.0, 33.0, 36.0], [20.0, 22.0, 24.0])
    assert measured.median == pytest.approx(1.5) and measured.low == pytest.approx(30 / 24) \
        and measured.high == pytest.approx(36 / 20)
    itself = spread([21.0, 23.5, 22.0, 22.4, 21.7], [22.1, 21.9, 23.0, 21.2, 22.6])
    assert itself.contains(1.0) and itself.runs == 5
    assert spread([], [1.0]) is None and spread([1.0], [0.0]) is None
    assert rounds_for(0.5) == live.MAX_ROUNDS and rounds_for(30.0) == live.MIN_ROUNDS \
        and rounds_for(2.0, measure_s=8.0) == 4


def test_timing_rounds_alternate_the_order_and_keep_whole_rounds(monkeypatch):
    """Every request runs once a round, the order reversed every other round (a slow spell hits
    both alike); a run that Stop cut short ends the timing with whole rounds only."""
    order, cut_after = [], []

    def fake_run(target, request, stop=None):
        order.append(request.method)
        if cut_after and len(order) > cut_after[0]:
            yield Summary(request.method, (), "stopped", 0, 0)
            return
        yield StepEvent(request.method, step=0, committed=(1,), target_forwards=1, elapsed_s=0.001)
        yield Summary(request.method, (1,), "length", 1, 1, elapsed_s=0.001)

    monkeypatch.setattr(live, "run", fake_run)
    requests = [live.Request("a", "ar", 1), live.Request("a", "speculative", 1)]
    reports = list(live.timing_rounds(None, requests, threading.Event(), measure_s=0.0, least=3))
    assert order == ["ar", "speculative", "speculative", "ar", "ar", "speculative"]
    rounds = [(r, p, d) for r, p, d, _ in reports]
    assert rounds == [(1, 3, 1), (1, 3, 2), (2, 3, 1), (2, 3, 2), (3, 3, 1), (3, 3, 2)]
    assert [len(runs) for runs in reports[-1][3]] == [3, 3]
    order.clear()
    cut_after.append(3)  # the 4th run is stopped: round 2 is dropped
    reports = list(live.timing_rounds(None, requests, threading.Event(), measure_s=0.0, least=3))
    assert [len(runs) for runs in reports[-1][3]] == [1, 1]


def test_the_lesson_takes_the_methods_in_order_with_prompts():
    assert [step.method for step in lesson.LESSON] == ["ar", "speculative", "medusa", "jacobi", "lookahead",
                                                       "speculative", ""]
    assert all(step.prompt and step.notice and step.max_new_tokens > 0 for step in lesson.LESSON)
    for word in ("Target", "Pass", "Draft"):
        assert f"**{word}**" in lesson.GLOSSARY
    assert lesson.step_named(lesson.TITLES[1]).method == "speculative"


def test_every_method_has_a_plain_sentence_with_its_math_folded_away():
    for name, spec in METHODS.items():
        assert spec.plain.endswith(".") \
            and not any(jargon in spec.plain for jargon in ("min(1", "KV", "EAGLE", "α", "logit", "p/q")), name
        how = views.how_html(spec.plain, spec.description)
        assert how.startswith(spec.plain) and "<details>" in how and spec.description in how.split("<details>")[1]


def test_timing_never_plans_more_rounds_than_the_clicks_budget_holds(monkeypatch):
    """With little of the click's budget left, fewer rounds than the least are planned rather
    than a round that Stop would cut short."""
    import time

    def slow_run(target, request, stop=None):
        time.sleep(0.05)
        yield StepEvent(request.method, step=0, committed=(1,), target_forwards=1, elapsed_s=0.05)
        yield Summary(request.method, (1,), "length", 1, 1, elapsed_s=0.05)

    monkeypatch.setattr(live, "run", slow_run)
    monkeypatch.setattr(live, "MARGIN_S", 0.0)
    stop = Deadline(time.monotonic() + 0.25)  # room for the first round (0.1 s) and one more
    requests = [live.Request("a", "ar", 1), live.Request("a", "speculative", 1)]
    reports = list(live.timing_rounds(None, requests, stop, measure_s=10.0, least=3))
    assert reports[-1][1] == 2 and [len(runs) for runs in reports[-1][3]] == [2, 2]
    assert time_left(threading.Event()) == float("inf") and 0 < time_left(budget(30)) <= 30


def test_a_speed_not_timed_again_says_it_has_no_range(runs):
    events, summary = runs["speculative"]
    table = views.stats_html(stats_of(events, summary), spread([30.0], [20.0]), 20.0, note="Not timed again", done=True,
                             drawn=True)
    assert "1.50x" in table and "one drawn run each: no range" in table and "data-done" in table
