"""Beam search: the answer equals transformers' beam search; events stream the certain prefix
and describe every step's beams consistently; the tree view draws them."""

import threading

import pytest
import torch

from specdemo.app.views.trees import beam_figure, beam_nodes
from specdemo.core.errors import SpecDemoError
from specdemo.core.events import StepEvent, Summary, final_summary
from specdemo.core.sampling import SamplingConfig
from specdemo.core.steps import BeamStep
from specdemo.methods import ar, beam

EOS_IDS = (20, 62, 70)  # tokens the tiny model emits among its beams: hypotheses finish early


def hf_beam(model, input_ids, num_beams, max_new_tokens, eos=None, **kwargs):
    output = model.generate(
        input_ids, num_beams=num_beams, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, **kwargs
    )
    return output[0, input_ids.shape[1] :].tolist()


def run(model, input_ids, num_beams, max_new_tokens, eos=None, **kwargs):
    eos_token_ids = () if eos is None else [eos] if isinstance(eos, int) else eos
    items = list(
        beam.generate(model, input_ids, num_beams=num_beams, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                      **kwargs)
    )
    return items[:-1], items[-1]


@pytest.mark.parametrize("num_beams", [2, 4])
@pytest.mark.parametrize("early_stopping", [False, True, "never"])
@pytest.mark.parametrize("length_penalty", [1.0, 2.0, -0.5])
def test_equals_transformers_on_tiny_model(tiny_model, prompt_ids, num_beams, early_stopping, length_penalty):
    settings = dict(length_penalty=length_penalty, early_stopping=early_stopping)
    for max_new_tokens, eos in [(1, None), (9, None), (30, None), *((30, eos) for eos in EOS_IDS)]:
        _, summary = run(tiny_model, prompt_ids, num_beams, max_new_tokens, eos, **settings)
        expected = hf_beam(tiny_model, prompt_ids, num_beams, max_new_tokens, eos, **settings)
        assert list(summary.tokens) == expected, (max_new_tokens, eos)
        assert summary.finish_reason == ("eos" if expected[-1] == eos else "length")


def test_early_stopping_and_length_penalty_change_the_answer(tiny_model, prompt_ids):
    """The settings above are not idle: with EOS 62 and 2 beams each rule picks another answer."""
    answers = {}
    for early_stopping in (False, True, "never"):
        for length_penalty in (1.0, -0.5):
            _, summary = run(tiny_model, prompt_ids, 2, 30, 62, early_stopping=early_stopping,
                             length_penalty=length_penalty)
            answers[early_stopping, length_penalty] = summary.tokens
            assert summary.finish_reason == "eos"
    assert len({answers[es, 1.0] for es in (False, True, "never")}) == 3
    assert answers[False, 1.0] != answers[False, -0.5]


@pytest.mark.parametrize("num_beams", [2, 4])
@pytest.mark.parametrize("processing",
                         [dict(no_repeat_ngram_size=2), dict(no_repeat_ngram_size=3, repetition_penalty=1.3)])
def test_processors_equal_transformers(tiny_model, prompt_ids, num_beams, processing):
    _, summary = run(tiny_model, prompt_ids, num_beams, 30, sampling=SamplingConfig(**processing))
    assert list(summary.tokens) == hf_beam(tiny_model, prompt_ids, num_beams, 30, **processing)
    _, plain = run(tiny_model, prompt_ids, num_beams, 30)
    assert summary.tokens != plain.tokens  # the processors changed the answer


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(repetition_penalty=1.3, no_repeat_ngram_size=3)])
@pytest.mark.parametrize("settings", [{}, dict(early_stopping="never", length_penalty=2.0)])
def test_one_beam_is_greedy_ar(tiny_model, prompt_ids, sampling, settings):
    greedy = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=30, sampling=sampling, eos_token_ids=()))
    for eos in (None, greedy.tokens[8]):
        _, summary = run(tiny_model, prompt_ids, 1, 30, eos, sampling=sampling, **settings)
        expected = greedy.tokens if eos is None else greedy.tokens[: greedy.tokens.index(eos) + 1]
        assert summary.tokens == expected


def test_one_event_per_batched_forward_pass(tiny_model, prompt_ids):
    calls = []
    hook = tiny_model.register_forward_pre_hook(lambda module, args: calls.append(tuple(args[0].shape)))
    try:
        events, summary = run(tiny_model, prompt_ids, 4, 20, 62)
    finally:
        hook.remove()
    assert all(isinstance(event, StepEvent) for event in events) and isinstance(summary, Summary)
    assert len(events) == len(calls) == summary.target_forwards == summary.steps
    # the prompt once, then the 4 beams together
    assert calls[0] == (1, prompt_ids.shape[1]) and set(calls[1:]) == {(4, 1)}
    assert [event.step for event in events] == list(range(len(events)))
    assert summary.tokens == tuple(token for event in events for token in event.committed)
    assert not any(event.proposed or event.accepted or event.rejected for event in events)


def test_answer_streams_before_the_end(embedded):
    input_ids = embedded.encode_chat("Write a haiku about the sea.")
    events, summary = run(embedded.model, input_ids, 2, 24, embedded.eos_token_ids)
    assert sum(len(event.committed) for event in events[:-1]) > 0  # certain tokens came before the last pass
    assert summary.tokens == tuple(token for event in events for token in event.committed)


@pytest.mark.parametrize("num_beams, eos, length_penalty", [(2, 62, 1.0), (4, 20, 2.0), (4, None, 1.0), (3, 70, -0.5)])
def test_events_describe_the_beams_consistently(tiny_model, prompt_ids, num_beams, eos, length_penalty):
    events, summary = run(tiny_model, prompt_ids, num_beams, 25, eos, length_penalty=length_penalty)
    previous = {0: []}  # tokens of each beam of the previous step: the prompt at first
    for event in events:
        data = event.data
        candidates = data.beams
        assert data.num_beams == num_beams and len(candidates) == 2 * num_beams
        assert [c["log_prob"] for c in candidates] == sorted((c["log_prob"] for c in candidates), reverse=True)
        for c in candidates:
            assert c["tokens"] == previous[c["parent"]] + [c["token"]]
            assert c["score"] == pytest.approx(c["log_prob"] / len(c["tokens"]) ** length_penalty, rel=1e-5)
            assert (c["status"] == "kept") == (c["beam"] is not None)
            assert c["status"] != "finished" or c["token"] == eos or len(c["tokens"]) == 25
        kept = [c for c in candidates if c["status"] == "kept"]
        if event is not events[-1]:
            assert [c["beam"] for c in kept] == list(range(num_beams))
        finished = data.finished
        assert len(finished) <= num_beams and [h["score"] for h in finished] == sorted((h["score"] for h in finished),
                                                                                       reverse=True)
        previous = {c["beam"]: c["tokens"] for c in kept}
    assert events[-1].data.chosen == list(summary.tokens) == events[-1].data.finished[0]["tokens"]
    assert all(event.data.chosen is None for event in events[:-1])


def test_stop_signal_ends_generation(tiny_model, prompt_ids):
    stop = threading.Event()
    events = []
    for item in beam.generate(tiny_model, prompt_ids, num_beams=3, max_new_tokens=40, eos_token_ids=(), stop=stop):
        if isinstance(item, StepEvent):
            events.append(item)
            if len(events) == 12:
                stop.set()
        else:
            summary = item
    _, full = run(tiny_model, prompt_ids, 3, 40)
    assert summary.finish_reason == "stopped" and len(events) == summary.target_forwards == 12
    assert 0 < len(summary.tokens) < len(full.tokens)
    assert summary.tokens == full.tokens[: len(summary.tokens)]  # what was committed is the answer's start


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(num_beams=0), "num_beams"),
        (dict(num_beams=-2), "num_beams"),
        (dict(num_beams=2.0), "num_beams"),
        (dict(num_beams=True), "num_beams"),
        (dict(early_stopping="sometimes"), "early_stopping"),
        (dict(length_penalty=float("nan")), "length_penalty"),
        (dict(sampling=SamplingConfig(do_sample=True)), "sampling"),
        (dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_refuses_bad_settings(tiny_model, prompt_ids, settings, message):
    with pytest.raises(SpecDemoError, match=message):
        next(beam.generate(tiny_model, prompt_ids, **settings))


def test_grad_mode_does_not_leak_to_the_caller(tiny_model, prompt_ids):
    events = beam.generate(tiny_model, prompt_ids, max_new_tokens=3)
    next(events)
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("num_beams, processing", [(2, {}), (4, {}), (4, dict(no_repeat_ngram_size=3))])
def test_equals_transformers_on_embedded_model(embedded, num_beams, processing):
    input_ids = embedded.encode_chat("What is the capital of France? Explain briefly.")
    eos = list(embedded.eos_token_ids)
    _, summary = run(embedded.model, input_ids, num_beams, 24, eos, sampling=SamplingConfig(**processing))
    assert list(summary.tokens) == hf_beam(embedded.model, input_ids, num_beams, 24, eos, **processing)
    assert embedded.decode(summary.tokens).strip()


# The tree view

def test_figure_draws_kept_pruned_and_the_chosen_path(tiny_model, prompt_ids):
    events, summary = run(tiny_model, prompt_ids, 2, 12, 62)
    figure = beam_figure(events, decode=lambda token: f"t{token}")
    traces = {trace.name: trace for trace in figure.data if trace.name}
    statuses = [c["status"] for e in events for c in e.data.beams]
    for status in ("kept", "pruned"):
        assert len(traces[status].x) == statuses.count(status) > 0
    assert traces["pruned"].marker.symbol == "circle-open" != traces["kept"].marker.symbol
    path = traces["chosen path"]
    assert len(path.x) == len(summary.tokens) and list(path.x) == list(range(1, len(summary.tokens) + 1))
    assert "done" in figure.layout.title.text


def test_a_long_runs_figure_shows_its_last_steps_so_its_labels_stay_apart(tiny_model, prompt_ids):
    from specdemo.app.views.trees import BEAM_STEPS_SHOWN

    events, _ = run(tiny_model, prompt_ids, 2, 24, 62)
    assert len(events) > BEAM_STEPS_SHOWN
    figure = beam_figure(events, decode=str)
    low, high = figure.layout.xaxis.range
    assert high - low == BEAM_STEPS_SHOWN + 1 and low < len(events) - BEAM_STEPS_SHOWN + 1 and high > len(events)
    assert f"{len(events)} steps<br><sup>the last {BEAM_STEPS_SHOWN} shown" in figure.layout.title.text
    assert beam_figure(events[:BEAM_STEPS_SHOWN], decode=str).layout.xaxis.range is None  # a short run: all of it


def test_a_beam_figures_words_stop_before_the_next_step_and_hover_whole(tiny_model, prompt_ids):
    from specdemo.app.views.trees import BEAM_STEPS_SHOWN, TREE_CHARACTERS

    events, _ = run(tiny_model, prompt_ids, 2, 24, 62)
    word = lambda token: f" word{token:05d}"  # noqa: E731  longer than a column holds
    figure = beam_figure(events, decode=word)
    first = len(events) - BEAM_STEPS_SHOWN + 1
    room = TREE_CHARACTERS // (BEAM_STEPS_SHOWN + 1)
    nodes = [(x, text, hover[0]) for trace in figure.data if trace.name in ("kept", "pruned", "finished")
             for x, text, hover in zip(trace.x, trace.text, trace.customdata, strict=True)]
    assert {x for x, _, _ in nodes} >= {first - 1, first}
    for x, text, whole in nodes:
        assert whole.startswith(" word")  # the hover: the whole word
        if x < first:  # left of the first step shown its word would reach into the plot
            assert text == ""
        else:
            assert len(text) == room and text.endswith("…") and whole.strip().startswith(text[:-1])


def test_figure_of_a_run_in_progress_has_no_chosen_path(tiny_model, prompt_ids):
    events, _ = run(tiny_model, prompt_ids, 2, 12, 62)
    figure = beam_figure(events[:4], decode=str)
    traces = {trace.name: trace for trace in figure.data if trace.name}
    assert len(traces["chosen path"].x) == 0 and "done" not in figure.layout.title.text
    assert beam_figure([], decode=str).data  # an empty run draws just the prompt


def test_nodes_hang_under_their_parent_beams():
    def event(step, beams, **more):
        return StepEvent("beam", step, (), data=BeamStep(**{"num_beams": 2, "beams": beams, "finished": [], **more}))

    def node(tokens, parent, beam, status):
        return {"token": tokens[-1], "tokens": tokens, "log_prob": -1.0, "score": -1.0, "parent": parent, "beam": beam,
                "status": status}

    events = [
        event(0, [node([1], 0, 0, "kept"), node([2], 0, 1, "kept"), node([3], 0, None, "pruned")]),
        event(1, [node([2, 5], 1, None, "finished"), node([1, 4], 0, None, "pruned")], chosen=[2, 5]),
    ]
    nodes = beam_nodes(events)
    places = [(n["x"], n["y"], n["parent_xy"]) for n in nodes]
    assert places == [(1, 0, (0, 0)), (1, -1, (0, 0)), (1, -2, (0, 0)), (2, 0, (1, -1)), (2, -1, (1, 0))]
    assert [n["on_path"] for n in nodes] == [False, True, False, True, False]
    traces = {trace.name: trace for trace in beam_figure(events, decode=str).data if trace.name}
    assert list(traces["finished"].text) == ["5"] and list(traces["pruned"].text) == ["3", "4"]
