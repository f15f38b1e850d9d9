"""AR decoding: greedy equals transformers' generate; sampling is seeded; events follow the protocol."""

import threading

import pytest
import torch

from specdemo.core.errors import SpecDemoError
from specdemo.core.events import StepEvent, Summary, final_summary
from specdemo.core.sampling import SamplingConfig
from specdemo.methods import ar


def hf_greedy(model, input_ids, max_new_tokens, **kwargs):
    output = model.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return output[0, input_ids.shape[1] :].tolist()


@pytest.mark.parametrize("max_new_tokens", [1, 7, 40])
def test_greedy_equals_transformers_on_tiny_model(tiny_model, prompt_ids, max_new_tokens):
    summary = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=max_new_tokens, eos_token_ids=()))
    assert list(summary.tokens) == hf_greedy(tiny_model, prompt_ids, max_new_tokens)
    assert summary.finish_reason == "length"


def test_greedy_with_repetition_penalty_equals_transformers(tiny_model, prompt_ids):
    sampling = SamplingConfig(repetition_penalty=1.3)
    summary = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=30, sampling=sampling, eos_token_ids=()))
    assert list(summary.tokens) == hf_greedy(tiny_model, prompt_ids, 30, repetition_penalty=1.3)


@pytest.mark.parametrize("n", [2, 3])
def test_greedy_with_no_repeat_ngram_equals_transformers(tiny_model, prompt_ids, n):
    sampling = SamplingConfig(no_repeat_ngram_size=n)
    summary = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=30, sampling=sampling, eos_token_ids=()))
    assert list(summary.tokens) == hf_greedy(tiny_model, prompt_ids, 30, no_repeat_ngram_size=n)
    assert list(summary.tokens) != hf_greedy(tiny_model, prompt_ids, 30)  # the ban changed the answer


@pytest.mark.parametrize("n", [-1, 1.5, True])
def test_no_repeat_ngram_size_must_be_a_whole_number(n):
    with pytest.raises(SpecDemoError, match="no_repeat_ngram_size"):
        SamplingConfig(no_repeat_ngram_size=n)


def test_sampling_equals_transformers_under_the_same_seed(tiny_model, prompt_ids):
    """Same processors in the same order, same RNG stream: the very tokens generate() samples."""
    settings = dict(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.2)
    sampling = SamplingConfig(do_sample=True, seed=123, **settings)
    summary = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=25, sampling=sampling, eos_token_ids=()))
    torch.manual_seed(123)
    output = tiny_model.generate(prompt_ids, max_new_tokens=25, do_sample=True, **settings)
    assert list(summary.tokens) == output[0, prompt_ids.shape[1] :].tolist()


def test_sampling_is_reproducible_by_seed(tiny_model, prompt_ids):
    def sample(seed):
        sampling = SamplingConfig(do_sample=True, temperature=1.5, seed=seed)
        return final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=30, sampling=sampling)).tokens

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_top_k_one_is_greedy(tiny_model, prompt_ids):
    sampling = SamplingConfig(do_sample=True, top_k=1, seed=3)
    sampled = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=20, sampling=sampling)).tokens
    assert list(sampled) == hf_greedy(tiny_model, prompt_ids, 20)


def test_one_event_per_forward_pass(tiny_model, prompt_ids):
    calls = []
    hook = tiny_model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        items = list(ar.generate(tiny_model, prompt_ids, max_new_tokens=12))
    finally:
        hook.remove()
    events, summary = items[:-1], items[-1]
    assert all(isinstance(event, StepEvent) for event in events) and isinstance(summary, Summary)
    assert len(events) == len(calls) == summary.target_forwards == 12
    assert [event.step for event in events] == list(range(12))
    assert [event.target_forwards for event in events] == list(range(1, 13))
    assert all(len(event.committed) == 1 and not event.proposed for event in events)
    assert summary.tokens == tuple(token for event in events for token in event.committed)
    assert summary.tokens_per_forward == 1.0 and summary.draft_forwards == 0
    assert events[-1].elapsed_s >= events[0].elapsed_s > 0


def test_stops_at_eos(tiny_model, prompt_ids):
    greedy = hf_greedy(tiny_model, prompt_ids, 20)
    eos = greedy[5]
    summary = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=20, eos_token_ids=[eos]))
    assert summary.finish_reason == "eos"
    assert list(summary.tokens) == greedy[: greedy.index(eos) + 1]


def test_stop_signal_ends_generation(tiny_model, prompt_ids):
    stop = threading.Event()
    tokens = []
    for item in ar.generate(tiny_model, prompt_ids, max_new_tokens=50, stop=stop):
        if isinstance(item, StepEvent):
            tokens += item.committed
            if len(tokens) == 3:
                stop.set()
        else:
            summary = item
    assert summary.finish_reason == "stopped" and len(summary.tokens) == 3


def test_grad_mode_does_not_leak_to_the_caller(tiny_model, prompt_ids):
    events = ar.generate(tiny_model, prompt_ids, max_new_tokens=3)
    next(events)
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("prompt", ["Write a haiku about the sea.", "What is the capital of France? Explain briefly."])
def test_greedy_equals_transformers_on_embedded_model(embedded, embedded_ar, prompt):
    input_ids = embedded.encode_chat(prompt)
    tokens = embedded_ar(prompt, 48)  # `ar.generate`'s answer, which the other methods' tests compare with
    expected = hf_greedy(embedded.model, input_ids, 48, eos_token_id=list(embedded.eos_token_ids))
    assert list(tokens) == expected
    assert embedded.decode(tokens).strip()
