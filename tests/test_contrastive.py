"""Contrastive decoding: scores worked out by hand on fixed-logit stand-ins, the event protocol on
tiny models, greedy AR when the amateur says nothing, a real difference on the embedded model,
and the per-step figure."""

import math
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig

from specdemo import SpecDemoError
from specdemo.app.views.figures import COLOURS, contrastive_figure
from specdemo.core.events import StepEvent, Summary, final_summary
from specdemo.core.steps import ContrastiveStep
from specdemo.methods import ar, contrastive
from specdemo.methods.draft import load_draft

from conftest import make_tiny_model


class FixedLM(torch.nn.Module):
    """A causal-LM stand-in whose next-token distribution is `probs` whatever the context; it
    takes generate()'s arguments and ignores the cache."""

    def __init__(self, probs: list[float]):
        super().__init__()
        self.logits = torch.tensor(probs).log()  # [V]: softmax(log p) = p
        self.config = LlamaConfig(vocab_size=len(probs), hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                  num_attention_heads=1)

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=1):
        return SimpleNamespace(logits=self.logits.expand(1, logits_to_keep, -1))  # [1, keep, V]


def run(expert, amateur, max_new_tokens=1, **kwargs):
    """The events and the summary of one generation after a 3-token prompt."""
    items = list(contrastive.generate(expert, torch.tensor([[0, 1, 2]]), amateur=amateur, max_new_tokens=max_new_tokens,
                                      eos_token_ids=[], **kwargs))
    assert isinstance(items[-1], Summary)
    return items[:-1], items[-1]


def by_token(event):
    return {c["token"]: c for c in event.data.candidates}


def test_the_expert_favourite_is_penalised_when_the_amateur_likes_it_more():
    # p_EXP = [.5, .3, .16, .04], p_AMA = [.8, .1, .06, .04], α = 0.1: V_head = {x : p_EXP(x) >= .05} = {0, 1, 2}.
    # scores: log(.5/.8) = -0.470, log(.3/.1) = 1.099, log(.16/.06) = 0.981; token 3 is out.
    expert, amateur = FixedLM([0.5, 0.3, 0.16, 0.04]), FixedLM([0.8, 0.1, 0.06, 0.04])
    events, summary = run(expert, amateur, max_new_tokens=2, alpha=0.1, amateur_temperature=1.0, top_candidates=4)
    assert summary.tokens == (1, 1) and [e.committed for e in events] == [(1,), (1,)]
    data = events[0].data
    assert (data.chosen, data.expert_choice, data.amateur_choice) == (1, 0, 0)
    assert data.cutoff_logprob == pytest.approx(math.log(0.05))
    assert [c["token"] for c in data.candidates] == [0, 1, 2, 3]  # most likely under the expert first
    candidates = by_token(events[0])
    for token, p_expert, p_amateur, score in [(0, 0.5, 0.8, -0.4700), (1, 0.3, 0.1, 1.0986), (2, 0.16, 0.06, 0.9808)]:
        assert candidates[token]["expert_logprob"] == pytest.approx(math.log(p_expert), abs=1e-5)
        assert candidates[token]["amateur_logprob"] == pytest.approx(math.log(p_amateur), abs=1e-5)
        assert candidates[token]["score"] == pytest.approx(score, abs=1e-4) and candidates[token]["plausible"]
    assert candidates[3]["score"] is None and not candidates[3]["plausible"]


def test_a_huge_score_below_the_plausibility_cutoff_is_not_chosen():
    # p_EXP = [.6, .35, .04, .01]: the cut-off is .1 * .6 = .06, so token 2 (p_EXP = .04) is out even
    # though its contrast log(.04/.0001) = 5.99 beats token 1's log(.35/.2) = 0.560 and token 0's log(.6/.7) = -0.154.
    expert, amateur = FixedLM([0.6, 0.35, 0.04, 0.01]), FixedLM([0.7, 0.2, 0.0001, 0.0999])
    logprobs = contrastive.expert_and_amateur_logprobs(expert.logits, amateur.logits, amateur_temperature=1.0)
    scores, plausible = contrastive.contrastive_scores(*logprobs, alpha=0.1)
    assert plausible.tolist() == [True, True, False, False]
    assert scores[:2].tolist() == pytest.approx([-0.1542, 0.5596], abs=1e-4) \
        and scores[2:].tolist() == [float("-inf")] * 2
    (event,), _ = run(expert, amateur, alpha=0.1, amateur_temperature=1.0, top_candidates=3)
    candidates = by_token(event)
    assert event.committed == (1,) and not candidates[2]["plausible"] and candidates[2]["score"] is None
    assert candidates[2]["expert_logprob"] - candidates[2]["amateur_logprob"] == pytest.approx(math.log(400), abs=1e-3)


def test_the_amateur_temperature_sharpens_its_distribution():
    # τ = 0.5 squares p_AMA = [.5, .25, .25] before normalising: [.25, .0625, .0625] / .375 = [2/3, 1/6, 1/6].
    expert_logits, amateur_logits = torch.tensor([0.4, 0.35, 0.25]).log(), torch.tensor([0.5, 0.25, 0.25]).log()
    expert, amateur = contrastive.expert_and_amateur_logprobs(expert_logits, amateur_logits, 0.5)
    assert amateur.exp().tolist() == pytest.approx([2 / 3, 1 / 6, 1 / 6])
    scores, _ = contrastive.contrastive_scores(expert, amateur, alpha=0.1)
    assert scores.tolist() == pytest.approx([math.log(0.4 * 3 / 2), math.log(0.35 * 6), math.log(0.25 * 6)], abs=1e-5)


def test_the_chosen_token_is_appended_when_outside_the_top_candidates():
    expert, amateur = FixedLM([0.5, 0.3, 0.16, 0.04]), FixedLM([0.8, 0.1, 0.06, 0.04])
    (event,), _ = run(expert, amateur, alpha=0.1, amateur_temperature=1.0, top_candidates=1)
    assert [c["token"] for c in event.data.candidates] == [0, 1] and event.data.chosen == 1


@pytest.fixture(scope="module")
def other_model():
    return make_tiny_model(seed=1)


def test_events_count_both_passes_and_choose_the_best_score(tiny_model, other_model, prompt_ids):
    items = list(contrastive.generate(tiny_model, prompt_ids, amateur=other_model, max_new_tokens=12))
    events, summary = items[:-1], items[-1]
    assert len(events) == 12 and summary.finish_reason == "length" and summary.method == "contrastive"
    assert [e.step for e in events] == list(range(12))
    assert [e.target_forwards for e in events] == [e.draft_forwards for e in events] == list(range(1, 13))
    assert summary.target_forwards == summary.draft_forwards == 12 \
        and summary.tokens == tuple(t for e in events for t in e.committed)
    for event in events:
        assert event.proposed == event.accepted == event.rejected == ()
        plausible = [c for c in event.data.candidates if c["plausible"]]
        assert event.committed == (event.data.chosen,) == (max(plausible, key=lambda c: c["score"])["token"],)
        assert all(c["expert_logprob"] >= event.data.cutoff_logprob for c in plausible)


def test_eos_and_stop_end_the_answer(tiny_model, other_model, prompt_ids):
    tokens = final_summary(contrastive.generate(tiny_model, prompt_ids, amateur=other_model, max_new_tokens=12)).tokens
    eos = tokens[4]
    summary = final_summary(contrastive.generate(tiny_model, prompt_ids, amateur=other_model, max_new_tokens=12,
                                                 eos_token_ids=[eos]))
    assert summary.tokens == tokens[: tokens.index(eos) + 1] and summary.finish_reason == "eos"
    stop = threading.Event()
    stream = contrastive.generate(tiny_model, prompt_ids, amateur=other_model, max_new_tokens=12, stop=stop)
    next(stream), next(stream)
    stop.set()
    summary = final_summary(stream)
    assert len(summary.tokens) == 2 and summary.finish_reason == "stopped" and summary.draft_forwards == 2


def test_a_silent_amateur_or_alpha_one_gives_the_expert_greedy_answer(tiny_model, other_model, prompt_ids):
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=30)).tokens
    uniform = FixedLM([1 / 97] * 97)
    for amateur, alpha in [(uniform, 0.1), (other_model, 1.0)]:
        summary = final_summary(contrastive.generate(tiny_model, prompt_ids, amateur=amateur, max_new_tokens=30,
                                                     alpha=alpha))
        assert summary.tokens == expected
    assert final_summary(contrastive.generate(tiny_model, prompt_ids, amateur=other_model,
                                              max_new_tokens=30)).tokens != expected


def test_an_amateur_of_another_vocabulary_is_refused(tiny_model, prompt_ids):
    with pytest.raises(SpecDemoError, match="vocabulary"):
        next(contrastive.generate(tiny_model, prompt_ids, amateur=make_tiny_model(seed=1, vocab_size=50)))


@pytest.mark.parametrize("setting", [{"alpha": 0}, {"alpha": 1.5}, {"amateur_temperature": 0}, {"top_candidates": 0},
                                     {"max_new_tokens": 0}])
def test_bad_settings_are_refused(tiny_model, other_model, prompt_ids, setting):
    with pytest.raises(SpecDemoError):
        next(contrastive.generate(tiny_model, prompt_ids, amateur=other_model, **setting))


def test_the_embedded_draft_as_amateur_changes_the_answer(embedded):
    amateur = load_draft("embedded", embedded).model

    def changes(prompt):  # stops at the first prompt whose answer differs from greedy AR
        input_ids = embedded.encode_chat(prompt)
        greedy = final_summary(ar.generate(embedded.model, input_ids, max_new_tokens=12,
                                           eos_token_ids=embedded.eos_token_ids))
        items = list(contrastive.generate(embedded.model, input_ids, amateur=amateur, max_new_tokens=12,
                                          eos_token_ids=embedded.eos_token_ids))
        summary = items[-1]
        assert summary.draft_forwards == summary.target_forwards == len(items) - 1 == len(summary.tokens)
        return summary.tokens != greedy.tokens

    # "The capital of France is Paris." becomes "Capital of France - Paris" (α = 0.1, τ = 0.5)
    assert any(changes(p) for p in ["What is the capital of France?", "Write a haiku about the sea.",
                                    "Give me three tips for sleeping well."])


def contrastive_step():
    """' cat' is the expert's favourite, but ' sat' wins the contrast; ' dog' is under the cut-off."""
    candidates = [
        {"token": 2, "expert_logprob": -0.7, "amateur_logprob": -0.2, "score": -0.5, "plausible": True},
        {"token": 3, "expert_logprob": -1.2, "amateur_logprob": -2.3, "score": 1.1, "plausible": True},
        {"token": 4, "expert_logprob": -3.2, "amateur_logprob": -9.2, "score": None, "plausible": False},
    ]
    data = ContrastiveStep(candidates=candidates, cutoff_logprob=-3.0, chosen=3, expert_choice=2, amateur_choice=2)
    return StepEvent("contrastive", step=4, committed=(3,), draft_forwards=5, target_forwards=5, data=data)


def test_the_figure_marks_the_choice_greys_the_implausible_and_draws_the_cutoff():
    decode = {2: " cat", 3: " sat", 4: " dog"}.__getitem__
    figure = contrastive_figure(contrastive_step(), decode)
    expert, amateur, chosen = figure.data
    assert list(figure.layout.xaxis.ticktext) == [" cat", " sat", " dog"]
    assert list(expert.y) == [-0.7, -1.2, -3.2] and list(amateur.y) == [-0.2, -2.3, -9.2]
    assert list(expert.marker.color)[:2] == [COLOURS["target"]] * 2 \
        and expert.marker.color[2] == amateur.marker.color[2] != COLOURS["target"]
    assert chosen.name == "chosen" and list(chosen.x) == [1]
    assert [shape.y0 for shape in figure.layout.shapes] == [-3.0]
    assert "' sat'" in figure.layout.title.text and "' cat'" in figure.layout.title.text
    # the expert's bars and the cut-off fit; the amateur's -9.2 is cut
    assert tuple(figure.layout.yaxis.range) == (-7.2, 1)


def test_a_step_is_explained_by_why_the_experts_favourite_lost():
    from specdemo.app.views import explain_step

    text = explain_step(contrastive_step(), {2: " cat", 3: " sat", 4: " dog"}.__getitem__)
    assert "' sat' won" in text and "1.10" in text
    assert "preferred ' cat'" in text and "-0.20" in text and "-0.50" in text
    assert "1 of the top candidates fell below the plausibility cut-off and could not win" in text
    step = contrastive_step()
    every = [{**candidate, "plausible": True} for candidate in step.data.candidates]
    text = explain_step(replace(step, data=replace(step.data, candidates=every)), {2: " cat", 3: " sat", 4: " dog"}.get)
    assert text.endswith("None of the top candidates fell below the plausibility cut-off.")


def test_its_tokens_are_the_targets_own_in_the_stream():
    from specdemo.app.views import stream_html

    assert 'data-origin="ar"' in stream_html([contrastive_step()], {3: " sat"}.__getitem__)
