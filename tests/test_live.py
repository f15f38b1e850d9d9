"""Running methods for the app: request checks, stats, the AR baseline cache, the wall-time stop."""

import threading

import pytest
import torch

from specdemo import SpecDemoError
from specdemo.app import clicks, limits, live
from specdemo.app.live import Baselines, Request, first_difference, speedup, stats, timed_events
from specdemo.app.zerogpu import unplanned
from specdemo.core.events import StepEvent, Summary
from specdemo.core.sampling import SamplingConfig


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(prompt="   "), "empty"),
        (dict(prompt="x" * (live.MAX_PROMPT_CHARS + 1)), "at most"),
        (dict(prompt="hi", method="beam9"), "unknown method"),
        (dict(prompt="hi", max_new_tokens=0), "max_new_tokens"),
        (dict(prompt="hi", max_new_tokens=live.MAX_NEW_TOKENS + 1), "max_new_tokens"),
        (dict(prompt="hi", method="jacobi", sampling=SamplingConfig(do_sample=True)), "does not sample"),
        (dict(prompt="hi", method="contrastive", sampling=SamplingConfig(do_sample=True)), "does not sample"),
        (dict(prompt="hi", method="contrastive", sampling=SamplingConfig(no_repeat_ngram_size=3)), "n-gram blocking"),
        (dict(prompt="hi", method="beam", settings={"gamma": 3}), "no setting gamma"),
        (dict(prompt="hi", method="jacobi", settings={"gamma": 3}), "no setting gamma"),
    ],
)
def test_bad_requests_are_refused_with_a_sentence(kwargs, message):
    with pytest.raises(SpecDemoError, match=message):
        Request(**kwargs)


def events_of(method, sizes, accepted_sizes, step_s=0.1):
    return [
        StepEvent(method, step=i, committed=tuple(range(n)), proposed=(0,) * 2, accepted=tuple(range(a)),
                  target_forwards=i + 1, elapsed_s=step_s * (i + 1))
        for i, (n, a) in enumerate(zip(sizes, accepted_sizes))
    ]


def test_stats_and_speedup():
    run = events_of("speculative", [3, 1, 2], [2, 0, 1])
    summary = Summary("speculative", tokens=(0,) * 6, finish_reason="length", steps=3, target_forwards=3, elapsed_s=0.3)
    numbers = stats(run, summary)
    assert numbers["tokens"] == 6 and numbers["forward_passes"] == 3 and numbers["tokens_per_forward"] == 2.0
    assert numbers["tokens_per_s"] == 20.0 and numbers["acceptance_rate"] == 0.5 \
        and numbers["finish_reason"] == "length"
    baseline = stats(events_of("ar", [1] * 6, [0] * 6))
    assert baseline["tokens_per_s"] == 10.0 and speedup(numbers, baseline) == 2.0


def test_first_difference():
    assert first_difference((1, 2, 3), (1, 2, 3)) is None
    assert first_difference((1, 5, 3), (1, 2, 3)) == 1
    assert first_difference((1, 2), (1, 2, 3)) == 2


def test_timed_events_ends_with_every_event_and_the_summary():
    summary = Summary("ar", tokens=(0,), finish_reason="eos", steps=1, target_forwards=1)
    stop = threading.Event()
    updates = list(timed_events(iter([*events_of("ar", [1, 1], [0, 0]), summary]), 0.01, stop))
    # a run that ended by itself leaves the click's stop event alone: the click's next run (the method after AR) goes on
    assert updates[-1][1] is summary and len(updates[-1][0]) == 2 and not stop.is_set()


def test_timed_events_hands_on_the_methods_error():
    def failing():
        yield from events_of("ar", [1], [0])
        raise SpecDemoError("bad setting")

    with pytest.raises(SpecDemoError, match="bad setting"):
        list(timed_events(failing(), 0.01, threading.Event()))


def test_closing_the_updates_stops_the_decoding(embedded):
    stop = threading.Event()
    updates = timed_events(live.run(embedded, Request("Count to a hundred.", "ar", 200), stop), 0.01, stop)
    first_events, _ = next(updates)
    updates.close()  # what Gradio does when Stop cancels the handler
    assert stop.is_set() and len(first_events) < 200


def test_run_stops_at_the_end_of_its_budget(embedded, monkeypatch):
    monkeypatch.setattr(live, "budget", lambda: limits.budget(0.0))
    events, summary = live.collect(live.run(embedded, Request("Count to a hundred.", "ar", 64)))
    assert summary.finish_reason == "stopped" and len(events) < 64


def test_one_budget_covers_every_run_of_a_click(embedded):
    """The baseline, the method and a reference run share the click's deadline: once it has
    passed, none of them decodes, and a cut-short AR run is not handed to the page as a baseline."""
    stop = limits.budget(0.0)
    stop.wait(1)
    request = Request("Count to a hundred.", "cllm", 32)
    records = list(clicks.generate_records(embedded, None, request, unplanned(32, 0.0), stop))
    assert not any(isinstance(record, clicks.Baseline | clicks.Answered) for record in records)
    _, summary = live.collect(live.run(embedded, Request("Count to a hundred.", "ar", 32), stop))
    assert summary.finish_reason == "stopped" and not summary.tokens
    assert live.greedy_answer(embedded.model, embedded, request, stop).finish_reason == "stopped"


def test_a_kept_baseline_serves_every_method_on_its_prompt_and_settings(embedded):
    """Generate decodes AR once per prompt and settings: a kept run is handed in and not decoded again."""
    baselines = Baselines()
    request = Request("Say yes.", "lookahead", 8)
    first = live.collect(live.run(embedded, Baselines.ar_request(request)))
    baselines.put(embedded, request, first)
    assert baselines.known(embedded, Request("Say yes.", "jacobi", 8)) is first  # same prompt and settings
    assert baselines.known(embedded, Request("Say no.", "jacobi", 8)) is None
    assert baselines.known(embedded, Request("Say yes.", "ar", 8, SamplingConfig(do_sample=True))) is None
    records = list(clicks.generate_records(embedded, first, request, unplanned(8, 0.0), limits.budget(60.0)))
    answered = next(record for record in records if isinstance(record, clicks.Answered))
    assert not any(isinstance(record, clicks.Baseline) for record in records)
    assert all(record.baseline is first[0] for record in records if isinstance(record, clicks.Streaming))
    assert answered.baseline_summary is first[1]


def test_a_baseline_is_kept_for_the_device_and_length_it_was_decoded_at(embedded):
    """A click ZeroGPU refused runs on the CPU: its speed is never compared with the GPU's AR run. A
    click its plan shortened keeps its baseline as long as it was decoded, not as it was asked."""
    from dataclasses import replace

    from specdemo.app.drawing import GenerateDrawing
    from specdemo.app.zerogpu import GpuPlan

    baselines, request = Baselines(), Request("Say yes.", "speculative", 64)
    on_gpu = replace(embedded, device=torch.device("cuda"))
    drawing = GenerateDrawing(on_gpu, request, baselines)
    drawing.draw(GpuPlan(8.0, 16, 0.0))  # the plan shortened the answer to 16 new tokens
    drawing.draw(clicks.Baseline([], None))
    assert baselines.known(on_gpu, replace(request, max_new_tokens=16)) and not baselines.known(on_gpu, request)
    assert not baselines.known(embedded, replace(request, max_new_tokens=16))  # the CPU's twin: none of the GPU's


def test_stop_signal_ends_the_run(embedded):
    stop = threading.Event()
    stop.set()
    events, summary = live.collect(live.run(embedded, Request("Hello", "speculative", 16), stop))
    assert events == [] and summary.finish_reason == "stopped"


def test_beam_takes_its_settings_and_n_gram_blocking():
    request = Request("hi", "beam", settings={"num_beams": 2, "length_penalty": 0.5, "early_stopping": True},
                      sampling=SamplingConfig(no_repeat_ngram_size=2))
    assert request.settings["num_beams"] == 2


@pytest.mark.parametrize("method", ["medusa", "lookahead", "jacobi", "cllm"])
def test_greedy_methods_take_a_repetition_penalty_and_n_gram_blocking(embedded, method):
    """They verify each prefix as one-token AR with the same processors would, so the app lets a
    person set both, and the answer is AR's under them (cllm: AR's on its own weights; float32)."""
    from specdemo.core.events import final_summary
    from specdemo.methods import ar, decoded

    prompt, sampling = "List three fruits, then three more.", SamplingConfig(repetition_penalty=1.3,
                                                                             no_repeat_ngram_size=3)
    _, summary = live.collect(live.run(embedded, Request(prompt, method, 24, sampling)))
    reference = ar.generate(decoded(method, embedded)[0], embedded.encode_chat(prompt), max_new_tokens=24,
                            sampling=sampling, eos_token_ids=embedded.eos_token_ids)
    assert summary.tokens == final_summary(reference).tokens
