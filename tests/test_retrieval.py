"""The datastore of earlier answers (`retrieval`, REST): its guesses against a brute-force
reference, its file, and speculative decoding, Medusa and lookahead with it: AR's answer, fewer passes."""

import random
from collections import Counter

import numpy as np
import pytest
import torch
from test_draft_tree import RunnerUpDraft

from specdemo.core.errors import SpecDemoError
from specdemo.core.events import StepEvent, committed_by_origin, final_summary
from specdemo.core.steps import LookaheadStep, TreeStep
from specdemo.core.verify import Proposal
from specdemo.methods import ar, draft_tree, lookahead, medusa, speculative
from specdemo.methods.draft import Draft
from specdemo.methods.retrieval import (
    MOST_OCCURRENCES,
    SHORTEST_MATCH,
    Datastore,
    answers_of,
    guessed_branch,
    load_datastore,
)


def brute_force(answers: list[list[int]], text: list[int], length: int, width: int,
                least_share: float = 0.0) -> tuple[int, ...]:
    """The guess by its definition: the longest suffix of `text` (width down to SHORTEST_MATCH tokens)
    found inside an answer; then, among the occurrences that agreed so far, the most common next
    token (ties: the smallest), until an answer ends, fewer than `least_share` of them agree, or
    `length` tokens."""
    return walked(answers, found_after(answers, text, width), length, least_share)


def found_after(answers: list[list[int]], text: list[int], width: int) -> list[tuple[int, int]]:
    """(answer, index) after each occurrence of the longest suffix of `text` that occurs, by search."""
    for k in range(min(width, len(text)), SHORTEST_MATCH - 1, -1):
        suffix = text[len(text) - k :]
        found = [(a, i + k) for a, answer in enumerate(answers) for i in range(len(answer) - k + 1)
                 if answer[i : i + k] == suffix]
        if found:
            return found
    return []


def next_tokens(answers: list[list[int]], found: list[tuple[int, int]]) -> Counter:
    return Counter(answers[a][i] if i < len(answers[a]) else None for a, i in found)  # None: the answer ended


def walked(answers: list[list[int]], found: list[tuple[int, int]], length: int, least_share: float) -> tuple[int, ...]:
    guessed = []
    for _ in range(length if found else 0):
        following = next_tokens(answers, found)
        best = max(following.values())
        token = min((t for t, n in following.items() if n == best), key=lambda t: float("inf") if t is None else t)
        if token is None or best < least_share * len(found):
            break
        guessed.append(token)
        found = [(a, i + 1) for a, i in found if i < len(answers[a]) and answers[a][i] == token]
    return tuple(guessed)


def brute_force_branches(answers: list[list[int]], text: list[int], length: int, width: int, branches: int,
                         least_share: float) -> list[tuple[int, ...]]:
    """The guesses by their definition: the `branches` next tokens most occurrences hold (ties: the
    smaller; an answer's end counts, as the largest), less the end and those fewer than
    `least_share` of them hold, each then walked as `brute_force` walks among those that hold it."""
    found = found_after(answers, text, width) if length else []
    following = next_tokens(answers, found)
    ranked = sorted(following, key=lambda t: (-following[t], float("inf") if t is None else t))[:branches]
    return [(t, *walked(answers, [(a, i + 1) for a, i in found if i < len(answers[a]) and answers[a][i] == t],
                         length - 1, least_share))
            for t in ranked if t is not None and following[t] >= least_share * len(found)]


@pytest.mark.parametrize("vocab_size", [5, 9, 70_000])  # 70,000: 17 bits a token, 3 tokens a key
def test_guesses_equal_the_brute_force_reference(vocab_size):
    rng = random.Random(vocab_size)
    small = min(vocab_size, 5)  # few distinct tokens, so suffixes repeat and ties happen
    answers = [[rng.randrange(small) for _ in range(rng.randrange(0, 30))] for _ in range(40)]
    store = Datastore.of_answers(answers, vocab_size)
    assert store.width == 64 // vocab_size.bit_length()
    for _ in range(300):
        text = [rng.randrange(small) for _ in range(rng.randrange(1, 8))]
        length, share = rng.randrange(0, 10), rng.choice([0.0, 0.3, 0.5, 0.9])
        assert store.continuation(text, length, share) == \
            brute_force(answers, text, length, store.width, share), (text, length, share)


def test_several_guesses_equal_the_brute_force_reference():
    """`continuations`: a guess for each of the next tokens most occurrences hold, most first (REST's
    trie, one branch a first token); one of them is `continuation`'s guess."""
    rng = random.Random(3)
    answers = [[rng.randrange(4) for _ in range(rng.randrange(0, 30))] for _ in range(40)]
    store = Datastore.of_answers(answers, 9)
    for _ in range(300):
        text = [rng.randrange(4) for _ in range(rng.randrange(1, 8))]
        length, share, branches = rng.randrange(0, 10), rng.choice([0.0, 0.3, 0.5]), rng.randrange(1, 5)
        guesses = store.continuations(text, length, branches, share)
        assert guesses == brute_force_branches(answers, text, length, store.width, branches, share)
        first = store.continuation(text, length, share)
        assert store.continuations(text, length, 1, share) == ([first] if first else [])
        assert len({guess[0] for guess in guesses}) == len(guesses)  # one a first token


def test_a_guess_never_runs_past_an_answer_and_needs_a_repeat_of_two():
    store = Datastore.of_answers([[1, 2, 3, 4], [7, 1, 2, 3, 9, 9], [1, 2, 3, 4, 5]], vocab_size=10)
    # "1 2": 3 in all three, then 4 in two of them, then 5 (the answer without it ended)
    assert store.continuation([0, 1, 2], 8) == (3, 4, 5)
    assert store.continuation([7, 1], 2) == (2, 3)
    assert store.continuation([8, 2], 5) == ()  # "8 2" never occurs, and one token is too short a match to trust
    assert store.continuation([3, 4, 5], 5) == ()  # "4 5" ends an answer: nothing follows it
    assert store.continuation([1, 2], 0) == ()
    assert store.continuation([0, 1, 2], 8, least_share=0.6) == (3, 4)  # two of three go on with 4, one of two with 5
    # a token the datastore cannot hold (another vocabulary) matches nothing
    assert store.continuation([12, 1, 2], 3) == ()


def test_a_frequent_suffix_is_followed_in_a_spread_of_its_occurrences():
    """Keys sort a suffix's occurrences by what follows them, so taking the first MOST_OCCURRENCES
    would see only the smallest continuations: the majority must still win."""
    answers = [[1, 2, 3]] * MOST_OCCURRENCES + [[1, 2, 8]] * (3 * MOST_OCCURRENCES)
    assert Datastore.of_answers(answers, vocab_size=10).continuation([1, 2], 1) == (8,)


def test_the_datastore_file_round_trips_and_belongs_to_one_vocabulary(tmp_path):
    answers = [[5, 6, 7], [], [9, 0, 1, 2]]
    Datastore.of_answers(answers, vocab_size=11).save(tmp_path / "store", {"made_by": "a test"})
    loaded = load_datastore(tmp_path / "store", 11)
    assert [a.tolist() for a in answers_of(loaded.tokens, loaded.end)] == answers and loaded.answers == 3
    assert np.load(tmp_path / "store" / "answers.npy").dtype == np.uint16
    with pytest.raises(SpecDemoError, match="vocabulary"):
        load_datastore(tmp_path / "store", 12)
    with pytest.raises(SpecDemoError, match="cannot read"):
        load_datastore(tmp_path / "nowhere", 11)
    with pytest.raises(SpecDemoError, match="outside the vocabulary"):
        Datastore.of_answers([[3, 11]], vocab_size=11)


def test_the_text_comes_first_then_the_datastore():
    store = Datastore.of_answers([[4, 5, 6, 7, 2, 8]], vocab_size=10)
    assert guessed_branch([1, 2, 3, 9, 1, 2], 3, (), store) == ([3, 9, 1], "copy")  # the text repeats "1 2"
    assert guessed_branch([0, 4, 5], 3, (), store) == ([6, 7, 2], "retrieved")
    assert guessed_branch([0, 4, 5], 3, (7,), store) == ([6, 7], "retrieved")  # up to and including an EOS
    assert guessed_branch([0, 4, 5], 3, (), None) == ([], "copy")


def test_a_guess_below_the_likeliest_branch():
    """`extend_likeliest` hangs the guess below the draft's best leaf, reading the text and that
    branch; nothing below a leaf with children or an EOS."""
    tree = Proposal((4, 6, 5), (-1, -1, 0), ("draft",) * 3, scores=(-0.1, -2.0, -0.3))
    store = Datastore.of_answers([[3, 4, 5, 1, 1, 9]], vocab_size=10)
    grown = draft_tree.extend_likeliest(tree, torch.tensor([7, 3]), 2, (), store)  # the branch "4 5" after "3": "1 1"
    assert grown.tokens[3:] == (1, 1) and grown.parents[3:] == (2, 3) and grown.depths[3:] == (3, 4)
    assert grown.sources[3:] == ("retrieved",) * 2 and grown.scores[3:] == (-0.3, -0.3)
    assert draft_tree.extend_likeliest(tree, torch.tensor([7, 3]), 2, (5,), store) == tree  # the branch ends the answer
    assert draft_tree.extend_likeliest(tree, torch.tensor([7, 3]), 0, (), store) == tree
    copied = draft_tree.add_copy(tree, [4, 5, 8])  # a copied branch already goes on below the leaf
    assert draft_tree.extend_likeliest(copied, torch.tensor([7, 3]), 2, (), store) == copied
    # the text itself first: "4 5" occurred in it
    from_text = draft_tree.extend_likeliest(tree, torch.tensor([4, 5, 2, 3]), 3, (), store)
    assert from_text.tokens[3:] == (2, 3, 4) and from_text.sources[3:] == ("copy",) * 3  # what followed it there


@pytest.fixture(scope="module")
def answered(tiny_model):
    """The tiny model's own greedy answers to a few prompts as a datastore, and one more prompt."""
    prompts = [torch.tensor([[seed % 97, (seed * 7) % 97, (seed * 13) % 97]]) for seed in range(3, 40, 3)]
    answers = [final_summary(ar.generate(tiny_model, p, max_new_tokens=40, eos_token_ids=())).tokens for p in prompts]
    return Datastore.of_answers(answers, tiny_model.config.vocab_size), prompts


GUESSERS = {  # each method that takes the datastore: its generator and what it needs beyond it on the tiny model
    # a draft that is never right alone commits nothing by itself: what speculative decoding gains is the datastore's
    "speculative": lambda model: (speculative.generate, dict(draft=RunnerUpDraft("runner-up", model), gamma=1,
                                                             draft_tree_size=1, draft_tree_top_k=1)),
    "medusa": lambda model: (medusa.generate, dict(heads=medusa.MedusaHeads(
        model.config.hidden_size, model.config.vocab_size, 2).eval())),
    "lookahead": lambda model: (lookahead.generate, {}),  # the guess is its candidate after the copy
    "lookahead, 3 guesses": lambda model: (lookahead.generate, {"retrieved_branches": 3}),
}


def accepted_sources(data) -> list[str]:
    """Where a step's accepted proposal tokens came from: a tree's nodes, or lookahead's committed candidate."""
    if isinstance(data, TreeStep):
        return [data.tree.sources[node] for node in data.accepted_path]
    if isinstance(data, LookaheadStep) and data.best_candidate is not None and data.accept_length:
        return [data.candidate_sources[data.best_candidate]]
    return []


@pytest.mark.parametrize("method", list(GUESSERS))
def test_a_datastore_keeps_ar_answer_in_fewer_passes(tiny_model, answered, method):
    """With the datastore of the model's own answers, retrieved guesses are accepted, fewer passes
    commit the answer, and it is still AR's, token for token."""
    store, prompts = answered
    generate, own = GUESSERS[method](tiny_model)
    settings = dict(max_new_tokens=40, eos_token_ids=(), datastore=store, **own)
    for prompt in prompts[:3]:
        expected = final_summary(ar.generate(tiny_model, prompt, max_new_tokens=40, eos_token_ids=())).tokens
        without = final_summary(generate(tiny_model, prompt, retrieve=False, **settings))
        events = list(generate(tiny_model, prompt, **settings))
        assert without.tokens == events[-1].tokens == expected
        assert events[-1].target_forwards < without.target_forwards
        assert "retrieved" in [source for e in events if isinstance(e, StepEvent)
                               for source in accepted_sources(e.data)]


def test_lookahead_candidates_take_the_copy_then_the_guess_then_the_pool():
    store = Datastore.of_answers([[4, 8, 3, 3, 9], [4, 8, 3, 5]], vocab_size=16)
    pool = lookahead.NgramPool(n=3, per_key=3)
    pool.insert_text([8, 1, 1, 8, 2, 2])
    tokens = [6, 8, 7, 0, 4, 8]  # "8" occurred: the copy is "7 0"; "4 8" occurred in both answers: "3", then "3" or "5"
    candidates, sources = lookahead.choose_candidates(pool, tokens, limit=3, copy_length=2, datastore=store)
    # ties: the smaller token
    assert candidates == [(7, 0), (3, 3), (2, 2)] and sources == ["copy", "retrieved", "pool"]
    # up to an EOS
    assert lookahead.choose_candidates(pool, tokens, limit=3, copy_length=2, datastore=store, eos=(3,))[0][1] == (3,)
    # no datastore
    assert lookahead.choose_candidates(pool, tokens, limit=3, copy_length=2)[1] == ["copy", "pool", "pool"]
    # two guesses, each after another next token: "4 8" goes on with "3" twice, "6" once
    store = Datastore.of_answers([[4, 8, 3, 3, 9], [4, 8, 3, 5], [4, 8, 6, 1]], vocab_size=16)
    candidates, sources = lookahead.choose_candidates(pool, tokens, limit=4, copy_length=2, datastore=store,
                                                      retrieved_branches=2)
    assert candidates == [(7, 0), (3, 3), (6, 1), (2, 2)] and sources == ["copy", "retrieved", "retrieved", "pool"]


def test_a_token_draft_tree_with_a_datastore_keeps_ar_answer(tiny_model, answered, prompt_ids):
    """The draft's likeliest branch gets its continuation below it: still AR's answer with a real draft."""
    store, _ = answered
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=50)).tokens
    got = final_summary(speculative.generate(tiny_model, prompt_ids, draft=Draft("self", tiny_model), max_new_tokens=50,
                                             datastore=store))
    assert got.tokens == expected


def test_the_datastore_keeps_the_answers_of_greedy_shards_and_no_prompt(tmp_path):
    import json

    from training.datastore import answers

    shard = {"prompts": ["a", "b"], "sources": ["x", "y"], "sequences": [[1, 2, 3, 4], [5, 6, 7]],
             "answer_starts": [2, 1],
             "features": [torch.zeros(2, 4), torch.zeros(2, 4)]}
    torch.save(shard, tmp_path / "shard-00000.pt")
    (tmp_path / "plan.json").write_text(json.dumps({"temperature": 0.0, "dtype": "float32", "max_new_tokens": 160}))
    found, about = answers(tmp_path)
    assert found == [[3, 4], [6, 7]] and about["distill_dtype"] == "float32"
    (tmp_path / "plan.json").write_text(json.dumps({"temperature": 0.7}))
    with pytest.raises(SystemExit, match="sampled"):
        answers(tmp_path)


@pytest.mark.parametrize("method", list(GUESSERS))
def test_committed_tokens_by_origin_tell_recall_from_prediction(tiny_model, answered, method):
    """The statistics' shares: with the datastore of the model's own answers some committed tokens
    are recalled from it; without it none is; every committed token is counted once."""
    store, prompts = answered
    generate, own = GUESSERS[method](tiny_model)
    settings = dict(max_new_tokens=40, eos_token_ids=(), datastore=store, **own)
    recalled = committed_by_origin(generate(tiny_model, prompts[0], **settings))
    alone = committed_by_origin(generate(tiny_model, prompts[0], retrieve=False, **settings))
    assert sum(recalled.values()) == sum(alone.values()) == 40
    assert recalled["datastore"] > 0 and alone["datastore"] == 0
    assert recalled["target"] < alone["target"]


def test_ar_commits_the_targets_tokens_and_jacobi_predicts(tiny_model, prompt_ids):
    assert committed_by_origin(ar.generate(tiny_model, prompt_ids, max_new_tokens=20, eos_token_ids=())) == \
        {"datastore": 0, "text": 0, "prediction": 0, "target": 20}
    from specdemo.methods import jacobi

    origins = committed_by_origin(jacobi.generate(tiny_model, prompt_ids, max_new_tokens=20, eos_token_ids=(),
                                                  block_size=4))
    assert origins["datastore"] == origins["text"] == 0 and origins["prediction"] + origins["target"] == 20
