"""Jacobi decoding: converges to the greedy AR answer for any block size; the trajectory payload."""

import pytest
import torch

from specdemo import SpecDemoError
from specdemo.core.events import StepEvent, final_summary
from specdemo.core.sampling import SamplingConfig
from specdemo.methods import ar, jacobi

from conftest import make_tiny_model


def make_bigram_model(successor: dict[int, int], default: int) -> torch.nn.Module:
    """A tiny Llama whose greedy next token depends only on the current token: `successor`
    maps a token to the next one, every other token maps to `default`. Attention and MLP
    outputs are zeroed, so the last hidden state is the token's (one-hot) embedding."""
    model = make_tiny_model(seed=3)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(model.config.vocab_size, hidden))
        head = torch.zeros(model.config.vocab_size, hidden)
        for token in range(hidden):
            head[successor.get(token, default), token] = 10.0
        model.lm_head.weight.copy_(head)
    return model


def steps(events):
    return [e for e in events if isinstance(e, StepEvent)]


@pytest.mark.parametrize("block_size", [1, 2, 5, 16])
def test_jacobi_equals_ar_on_tiny_model(tiny_model, prompt_ids, block_size):
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=40, eos_token_ids=())).tokens
    summary = final_summary(jacobi.generate(tiny_model, prompt_ids, max_new_tokens=40, block_size=block_size,
                                            eos_token_ids=()))
    assert summary.tokens == expected and summary.finish_reason == "length"
    assert summary.target_forwards <= 40  # at least one token a pass


def test_jacobi_with_repetition_penalty_equals_ar(tiny_model, prompt_ids):
    sampling = SamplingConfig(repetition_penalty=1.3)
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=30, sampling=sampling,
                                         eos_token_ids=())).tokens
    summary = final_summary(jacobi.generate(tiny_model, prompt_ids, max_new_tokens=30, sampling=sampling,
                                            eos_token_ids=()))
    assert summary.tokens == expected


def test_jacobi_stops_at_eos_inside_a_block(tiny_model, prompt_ids):
    greedy = list(final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=30, eos_token_ids=())).tokens)
    eos = greedy[6]
    summary = final_summary(jacobi.generate(tiny_model, prompt_ids, max_new_tokens=30, block_size=16,
                                            eos_token_ids=[eos]))
    assert list(summary.tokens) == greedy[: greedy.index(eos) + 1] and summary.finish_reason == "eos"


def test_block_positions_after_an_eos_never_settle():
    """Successor 7 -> 7 with 7 the EOS: the first pass accepts the whole guessed block, but the
    answer ends at its first token, so no later position is reported settled or fast-forwarded."""
    model = make_bigram_model({7: 7}, default=7)
    events = steps(jacobi.generate(model, torch.tensor([[1, 7]]), max_new_tokens=10, block_size=6, eos_token_ids=(7,)))
    assert [e.committed for e in events] == [(7,)]
    assert events[0].data.correct_since == [0, None, None, None, None, None]
    assert events[0].data.fast_forwarded == [] and events[0].data.fixed_early == []


def test_trajectory_of_one_token_a_pass():
    """Successor t -> t+1, block of 4 after token 10: the fixed point is 11 12 13 14, and
    each pass settles exactly one more position: nothing is fast-forwarded."""
    model = make_bigram_model({t: t + 1 for t in range(60)}, default=0)
    events = steps(jacobi.generate(model, torch.tensor([[3, 10]]), max_new_tokens=4, block_size=4, eos_token_ids=()))
    assert [e.committed for e in events] == [(11,), (12,), (13,), (14,)]
    assert [e.data.state for e in events] == [[10, 10, 10, 10], [11, 11, 11, 11], [11, 12, 12, 12], [11, 12, 13, 13]]
    assert events[-1].data.next_state == [11, 12, 13, 14]
    assert events[-1].data.correct_since == [1, 2, 3, 4]
    assert all(e.data.fast_forwarded == [] and e.data.fixed_early == [] for e in events)
    assert [e.rejected for e in events] == [(10, 10, 10, 10), (11, 11, 11), (12, 12), (13,)]


def test_trajectory_with_fast_forwarding():
    """Successor 10 -> 20, everything else -> 30, block of 4 after 10: the fixed point is
    20 30 30 30. The second pass turns every unsettled guess into 30 at once, so the third
    pass accepts them all: positions 2 and 3 became correct with position 1 (fast-forwarded)."""
    model = make_bigram_model({10: 20}, default=30)
    events = steps(jacobi.generate(model, torch.tensor([[3, 10]]), max_new_tokens=4, block_size=4, eos_token_ids=()))
    assert [e.data.state for e in events] == [[10, 10, 10, 10], [20, 20, 20, 20], [20, 30, 30, 30]]
    assert [e.committed for e in events] == [(20,), (30,), (30, 30)]
    assert [e.data.accept_length for e in events] == [0, 0, 2]
    assert events[-1].data.correct_since == [1, 2, 2, 2]
    assert events[-1].data.fast_forwarded == [2, 3]
    assert [e.target_forwards for e in events] == [1, 2, 3]


def test_sampling_is_refused_with_a_reason(tiny_model, prompt_ids):
    with pytest.raises(SpecDemoError, match="greedily"):
        next(jacobi.generate(tiny_model, prompt_ids, sampling=SamplingConfig(do_sample=True)))
    with pytest.raises(SpecDemoError, match="block_size"):
        next(jacobi.generate(tiny_model, prompt_ids, block_size=0))


@pytest.mark.slow
def test_jacobi_equals_ar_on_embedded_model(embedded):
    input_ids = embedded.encode_chat("List three uses of a paperclip.")
    expected = final_summary(ar.generate(embedded.model, input_ids, max_new_tokens=32,
                                         eos_token_ids=embedded.eos_token_ids)).tokens
    summary = final_summary(jacobi.generate(embedded.model, input_ids, max_new_tokens=32,
                                            eos_token_ids=embedded.eos_token_ids))
    assert summary.tokens == expected
