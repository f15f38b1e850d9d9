"""The margin at an answer's first difference from AR (specdemo/divergence.py): computed exactly on
a tiny model where a tie is forced, and flagged on a forced bug (a method that commits a wrong token)."""

import pytest
import torch

from specdemo.bench import explain_differences
from specdemo.divergence import SUSPECT_MARGIN, divergences, first_difference, rounding_noise
from specdemo.methods import ar

from conftest import make_tiny_model


def ar_answer(model, prompt, n):
    tokens = []
    for event in ar.generate(model, prompt, max_new_tokens=n, eos_token_ids=()):
        tokens += list(getattr(event, "committed", []))
    return tokens


@torch.no_grad()
def brute_logits(model, prompt, answer, i):
    """The logits for answer position i from a plain full pass (the reference)."""
    return model(torch.cat([prompt, torch.tensor([answer[:i]], dtype=prompt.dtype)], dim=-1)).logits[0, -1]


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_margin_is_zero_at_a_forced_tie_and_matches_a_full_pass():
    model = make_tiny_model(seed=3)
    prompt = torch.tensor([[5, 17, 42, 8]])
    answer = ar_answer(model, prompt, 8)
    i = min(range(len(answer)), key=lambda k: answer[k])  # the smallest id, so that a larger unused twin exists
    winner = answer[i]
    twin = next(t for t in range(winner + 1, model.config.vocab_size) if t not in answer)
    with torch.no_grad():  # the twin's output row equals the winner's: the two logits tie exactly at every position
        model.lm_head.weight[twin] = model.lm_head.weight[winner]
    # argmax keeps the first of equal logits (winner < twin): AR is unchanged
    assert ar_answer(model, prompt, 8) == answer
    flipped = answer[:i] + [twin] + answer[i + 1 :]
    found = divergences(model, prompt, answer, {"tied": flipped})["tied"]
    assert (found.position, found.ar_token, found.other_token) == (i, winner, twin)
    assert found.margin == 0.0 and found.top_two == 0.0 and not found.suspect
    # a position without a tie: the margin is AR's logit gap, as a full pass computes it
    j = (i + 1) % len(answer)
    other = answer[:j] + [(answer[j] + 7) % model.config.vocab_size] + answer[j + 1 :]
    found = divergences(model, prompt, answer, {"other": other})["other"]
    logits = brute_logits(model, prompt, answer, j)
    torch.testing.assert_close(found.margin, float(logits[answer[j]] - logits[other[j]]), atol=1e-4, rtol=0)
    top = logits.topk(2).values
    torch.testing.assert_close(found.top_two, float(top[0] - top[1]), atol=1e-4, rtol=0)
    torch.testing.assert_close(found.wide_gap, found.margin, atol=1e-4, rtol=0)  # float32: the wide pass agrees


def test_a_method_that_commits_a_wrong_token_is_flagged():
    model = make_tiny_model(seed=4)
    prompt = torch.tensor([[9, 3, 33]])
    answer = ar_answer(model, prompt, 10)
    i = 5
    worst = int(brute_logits(model, prompt, answer, i).argmin())
    with torch.no_grad():  # scale the output layer so that logit gaps are far above the threshold
        model.lm_head.weight.mul_(50)
    answer = ar_answer(model, prompt, 10)
    buggy = answer[:i] + [worst] + answer[i + 1 :]
    found = divergences(model, prompt, answer, {"buggy": buggy, "same": list(answer)})
    assert found["same"] is None
    assert found["buggy"].position == i and found["buggy"].margin > SUSPECT_MARGIN and found["buggy"].suspect


def test_a_shorter_answer_is_no_divergence_and_float32_rounding_is_tiny():
    model = make_tiny_model(seed=5)
    prompt = torch.tensor([[1, 2, 3]])
    answer = ar_answer(model, prompt, 6)
    assert divergences(model, prompt, answer, {"short": answer[:3]})["short"] is None
    assert rounding_noise(model, prompt, answer) < 1e-3


def test_the_bench_explains_only_methods_that_should_equal_ar():
    model = make_tiny_model(seed=6)
    prompt = torch.tensor([[4, 4, 8]])
    answer = ar_answer(model, prompt, 6)
    other = answer[:2] + [(answer[2] + 1) % 97] + answer[3:]
    target = type("T", (), {"model": model, "passes": None})()
    parted = explain_differences(target, prompt, ["ar", "speculative", "medusa", "beam"],
                                 {"ar": answer, "speculative": other, "medusa": answer, "beam": other})
    assert parted["speculative"].position == 2 and parted.get("medusa") is None and "beam" not in parted


def test_the_sentence_tells_a_rounding_flip_from_a_possible_bug():
    from specdemo.app.views import divergence_sentence
    from specdemo.divergence import Divergence

    decode = {5: " sky", 9: " air"}.get
    tie = Divergence(position=7, ar_token=5, other_token=9, margin=0.03, top_two=0.03, wide_gap=-0.01)
    said = divergence_sentence(tie, "bfloat16", decode, SUSPECT_MARGIN)
    assert "token 7" in said and "' sky'" in said and "' air'" in said and "0.03 apart" in said
    assert "near-tie" in said and "In float32 the answers are equal" in said and "bug" not in said
    wide = Divergence(position=7, ar_token=5, other_token=9, margin=SUSPECT_MARGIN * 3, top_two=0.5, wide_gap=2.0)
    assert "bug" in divergence_sentence(wide, "bfloat16", decode, SUSPECT_MARGIN)
    assert "bug" in divergence_sentence(tie, "float32", decode, SUSPECT_MARGIN)  # float32 rounding flips nothing here
    exact_tie = Divergence(position=7, ar_token=5, other_token=9, margin=0.0, top_two=0.0, wide_gap=0.0)
    # not "only 0.00 apart"
    assert "tied in logit" in divergence_sentence(exact_tie, "bfloat16", decode, SUSPECT_MARGIN)


@pytest.mark.slow
def test_bfloat16_divergences_of_the_embedded_model_stay_below_the_threshold():
    """Where a method's bfloat16 answer parts from AR's, AR's margin there is within what rounding
    moves (SUSPECT_MARGIN): a margin above it would be a bug, not a flipped near-tie."""
    from specdemo.core.events import final_summary
    from specdemo.methods import medusa, method_options, speculative
    from specdemo.models import load_model

    target = load_model("embedded", "bfloat16", "cpu")
    prompts = ["Write a Python function that reverses a string.", "Explain in two sentences why the sky is blue."]
    runs = {"speculative": (speculative.generate, method_options("speculative", target)),
            "medusa": (medusa.generate, method_options("medusa", target))}
    for text in prompts:
        ids = target.encode_chat(text)
        answer = final_summary(ar.generate(target.model, ids, max_new_tokens=48,
                                           eos_token_ids=target.eos_token_ids)).tokens
        others = {name: list(final_summary(fn(target.model, ids, max_new_tokens=48, eos_token_ids=target.eos_token_ids,
                                              **options)).tokens)
                  for name, (fn, options) in runs.items()}
        for name, found in divergences(target.model, ids, list(answer), others).items():
            assert found is None or not found.suspect, (name, text, found)
