"""Lookahead decoding: the attention layout against a brute-force reference, the n-gram pool,
equality with greedy AR, and several tokens a pass where the window can find them."""

import numpy as np
import pytest
import torch

from specdemo import SpecDemoError
from specdemo.core.attention import additive_mask, chain_positions, sees_from_parents
from specdemo.core.events import StepEvent, final_summary
from specdemo.core.sampling import SamplingConfig
from specdemo.core.verify import fed_parents
from specdemo.methods import ar, lookahead
from specdemo.methods.lookahead import NgramPool, choose_candidates
from specdemo.methods.prompt_lookup import copied_branch, copy_from_text

from test_jacobi import make_bigram_model


def reference_sees(pending, candidate_lengths, levels, window):
    """Who sees whom, written out from the rules of the module docstring."""
    names = [("pending", i) for i in range(pending)]
    names += [("candidate", g, j) for g, length in enumerate(candidate_lengths) for j in range(length)]
    names += [("window", level, column) for level in range(levels) for column in range(window)]

    def visible(a, b):
        if b[0] == "pending":
            return a[0] != "pending" or b[1] <= a[1]
        if a[0] == "candidate" and b[0] == "candidate":
            return a[1] == b[1] and b[2] <= a[2]
        if a[0] == "window" and b[0] == "window":
            (_, level_a, column_a), (_, level_b, column_b) = a, b
            return (level_b == 0 and column_b <= column_a) or (column_b == column_a and 0 < level_b <= level_a)
        return False

    return np.array([[visible(a, b) for b in names] for a in names], dtype=bool).reshape(len(names), len(names))


@pytest.mark.parametrize(
    "pending,candidate_lengths,levels,window",
    [(1, [], 1, 1), (1, [3, 3], 3, 4), (3, [6, 2, 2], 2, 5), (2, [4], 4, 3), (1, [1, 5], 2, 2)]
)
def test_layout_matches_the_reference(pending, candidate_lengths, levels, window):
    tried = [tuple(range(length)) for length in candidate_lengths]
    proposal = lookahead.proposal(tried, ["pool"] * len(tried), [[0] * window for _ in range(levels)])
    sees = sees_from_parents(list(fed_parents(pending, proposal)))
    assert np.array_equal(sees, reference_sees(pending, candidate_lengths, levels, window))
    positions = chain_positions(sees, 10).tolist()
    candidate_starts = [pending + sum(candidate_lengths[:g]) for g in range(len(candidate_lengths))]
    start = pending + sum(candidate_lengths)
    for level in range(levels):
        for column in range(window):  # column c of level l sits c + l + 1 after the last pending token
            assert positions[start + level * window + column] == 10 + pending + column + level
    for first, length in zip(candidate_starts, candidate_lengths):
        assert positions[first : first + length] == list(range(10 + pending, 10 + pending + length))


def test_additive_mask_shape_and_values():
    sees = np.array([[True, False], [True, True]])
    mask = additive_mask(sees, 3, torch.float32)
    assert mask.shape == (1, 1, 2, 5)
    assert (mask[0, 0, :, :3] == 0).all() and mask[0, 0, 0, 4] == torch.finfo(torch.float32).min \
        and mask[0, 0, 1, 4] == 0


def test_ngram_pool_insert_lookup_and_bounds():
    pool = NgramPool(n=3, per_key=2, max_keys=2)
    pool.insert([1, 2, 3])
    pool.insert([1, 4, 5])
    pool.insert([1, 2, 3])  # a repeat moves to the front, not in twice
    assert pool.lookup(1) == [(2, 3), (4, 5)]
    pool.insert([1, 6, 7])  # at most 2 continuations a key: the oldest goes
    assert pool.lookup(1) == [(6, 7), (2, 3)]
    pool.insert([8, 9, 9])
    pool.insert([5, 5, 5])  # at most 2 keys: the least recently touched (1) goes
    assert pool.lookup(1) == [] and pool.lookup(8) == [(9, 9)] and len(pool) == 2
    pool.insert_text([4, 4, 4, 4])
    assert pool.lookup(4) == [(4, 4)]
    with pytest.raises(ValueError):
        pool.insert([1, 2])


def test_copy_from_text_takes_the_latest_longest_match():
    text = [5, 1, 2, 3, 9, 9, 1, 2, 4, 8, 7, 1, 2]
    assert copy_from_text(text, 3) == (4, 8, 7)  # "1 2" last seen before "4 8 7"
    assert copy_from_text(text, 3, longest_match=1) == (4, 8, 7)
    assert copy_from_text([5, 1, 2, 3, 9, 3, 1, 2], 2) == (3, 9)
    assert copy_from_text([6, 1, 7, 2], 4) == ()  # 2 never occurred before
    assert copy_from_text([1, 1, 1], 5) == (1,)  # the continuation runs into the text's own end
    assert copy_from_text([5, 1, 2, 3, 9, 3], 2, shortest_match=2) == ()  # only "3" repeats


def test_a_copied_branch_needs_a_repeat_of_two_and_stops_at_eos():
    assert copied_branch([5, 1, 2, 3, 9, 2, 6, 1, 2], 3, eos=(9,)) == [3, 9]  # after "1 2": "3 9 2", cut after the EOS
    assert copied_branch([5, 1, 2, 3, 9, 2, 6, 1, 2], 3, eos=()) == [3, 9, 2]
    assert copied_branch([5, 1, 2, 3, 9, 3], 4, eos=()) == []  # "3" alone repeats: too short a match to trust
    assert copied_branch([5, 1, 2, 3, 9, 1, 2], 0, eos=()) == []


def test_choose_candidates_puts_the_copy_first_and_drops_prefixes():
    pool = NgramPool(n=3, per_key=3)
    pool.insert_text([2, 4, 8, 2, 4, 6, 2, 5, 5])
    tokens = [1, 2, 4, 8, 7, 3, 1, 2]
    candidates, sources = choose_candidates(pool, tokens, limit=3, copy_length=3)
    # (4, 8) is the copy's prefix
    assert candidates == [(4, 8, 7), (5, 5), (4, 6)] and sources == ["copy", "pool", "pool"]
    assert choose_candidates(pool, tokens, limit=2, copy_length=0) == ([(5, 5), (4, 6)], ["pool", "pool"])


@pytest.mark.parametrize("window,ngram,candidates", [(1, 2, 1), (4, 3, 2), (5, 4, 5), (3, 5, 0)])
def test_lookahead_equals_ar_on_tiny_model(tiny_model, prompt_ids, window, ngram, candidates):
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=48, eos_token_ids=())).tokens
    summary = final_summary(
        lookahead.generate(tiny_model, prompt_ids, max_new_tokens=48, window=window, ngram=ngram, candidates=candidates,
                           eos_token_ids=())
    )
    assert summary.tokens == expected


def test_lookahead_with_repetition_penalty_equals_ar(tiny_model, prompt_ids):
    sampling = SamplingConfig(repetition_penalty=1.3)
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=30, sampling=sampling,
                                         eos_token_ids=())).tokens
    assert final_summary(lookahead.generate(tiny_model, prompt_ids, max_new_tokens=30, sampling=sampling,
                                            eos_token_ids=())).tokens == expected


def counting_events(prompt, text_ngrams, max_new_tokens=40):
    model = make_bigram_model({t: t + 1 for t in range(63)}, default=0)
    events = lookahead.generate(
        model, torch.tensor([prompt]), max_new_tokens=max_new_tokens, window=4, ngram=4, candidates=2,
        text_ngrams=text_ngrams, eos_token_ids=()
    )
    return [e for e in events if isinstance(e, StepEvent)]


def test_the_window_iterates_and_its_ngrams_get_accepted():
    """A model that counts (t -> t+1). Each pass the window gains a level (the successor of its
    last level) and drops its oldest; its columns are counting n-grams ahead of the answer (the
    window starts from the prompt's 12), and once the answer reaches them a pass commits N = 4
    tokens, although neither prompt nor answer text feeds the pool here."""
    events = counting_events([12, 5], text_ngrams=False)
    assert [t for e in events for t in e.committed] == list(range(6, 46))
    for before, after in zip(events, events[1:]):
        assert before.data.new_level == [t + 1 for t in before.data.window[-1]]
        assert after.data.window == before.data.window[1:] + [before.data.new_level]
    assert max(len(e.committed) for e in events) == 4 and len(events) < 40
    for e in events:
        assert e.committed[: len(e.accepted)] == e.accepted
        if e.data.best_candidate is not None:
            assert e.data.accept_length == max(e.data.candidate_accept_lengths)


def test_ngrams_of_the_prompt_are_verified_from_the_first_pass():
    events = counting_events([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 5], text_ngrams=True, max_new_tokens=8)
    # the copy: what followed the prompt's earlier 5, six tokens long; then 12 from the target
    assert events[0].data.candidates[0] == [6, 7, 8, 9, 10, 11] and events[0].data.candidate_sources[0] == "copy"
    assert events[0].committed == (6, 7, 8, 9, 10, 11, 12) and events[0].accepted == (6, 7, 8, 9, 10, 11)


def test_eos_inside_an_accepted_ngram():
    model = make_bigram_model({t: t + 1 for t in range(63)}, default=0)
    summary = final_summary(lookahead.generate(model, torch.tensor([[1, 5]]), max_new_tokens=40, text_ngrams=False,
                                               eos_token_ids=[30]))
    assert list(summary.tokens) == list(range(6, 31)) and summary.finish_reason == "eos"


def test_bad_settings_are_refused(tiny_model, prompt_ids):
    with pytest.raises(SpecDemoError, match="ngram"):
        next(lookahead.generate(tiny_model, prompt_ids, ngram=1))
    with pytest.raises(SpecDemoError, match="greedily"):
        next(lookahead.generate(tiny_model, prompt_ids, sampling=SamplingConfig(do_sample=True)))


@pytest.mark.parametrize("prompt",
                         ["Summarize: The cat sat on the mat. The cat was happy.", "Write a short poem about rain."])
def test_lookahead_equals_ar_on_embedded_model(embedded, prompt):
    input_ids = embedded.encode_chat(prompt)
    expected = final_summary(ar.generate(embedded.model, input_ids, max_new_tokens=48,
                                         eos_token_ids=embedded.eos_token_ids)).tokens
    summary = final_summary(lookahead.generate(embedded.model, input_ids, max_new_tokens=48,
                                               eos_token_ids=embedded.eos_token_ids))
    assert summary.tokens == expected


def test_the_first_window_is_drawn_on_the_cpu_whatever_the_default_device():
    """The trainers set a default device (CUDA when present); the window's seeded draw stays on the
    CPU, where its generator is, and gives the same tokens."""
    from specdemo.methods.lookahead import initial_window

    input_ids = torch.tensor([[5, 6, 7, 8, 9]])
    expected = initial_window(input_ids, 3, 2)
    with torch.device("meta"):  # any other device: CUDA, where the GPU run met it
        assert initial_window(input_ids, 3, 2) == expected
