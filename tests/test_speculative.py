"""Speculative decoding: greedy equals AR exactly, sampling keeps the target's distribution,
caches roll back after a rejection at any position, EOS ends an accepted run."""

from unittest import mock

import pytest
import torch
from scipy.stats import chisquare
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from specdemo import SpecDemoError
from specdemo.core.events import StepEvent, final_summary
from specdemo.core.sampling import SamplingConfig, logits_processors
from specdemo.methods import ar, speculative
from specdemo.methods.draft import Draft, load_draft

from conftest import make_tiny_model


class ScriptedDraft(Draft):
    """The target itself as a draft (always right), except that its proposal is replaced by
    the runner-up token whenever the draft cache length is a multiple of `every`."""

    def __init__(self, model, every: int):
        super().__init__("scripted", model)
        self.every = every

    def logits(self, input_ids, cache, logits_to_keep=1, **tree):
        logits = super().logits(input_ids, cache, logits_to_keep, **tree).clone()
        if cache.get_seq_length() % self.every == 0:
            logits[..., logits.argmax(-1)] = float("-inf")
        return logits


def answer(method, model, prompt_ids, **kwargs):
    return final_summary(method.generate(model, prompt_ids, **kwargs))


@pytest.fixture(scope="module")
def other_model():
    return make_tiny_model(seed=1)


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("draft_kind", ["always_right", "mostly_wrong", "vocab_subset"])
def test_greedy_equals_ar(tiny_model, other_model, prompt_ids, gamma, draft_kind):
    draft = {
        "always_right": Draft("target", tiny_model),
        "mostly_wrong": Draft("other", other_model),
        "vocab_subset": Draft("subset", tiny_model, torch.arange(0, 97, 2)),
    }[draft_kind]
    expected = answer(ar, tiny_model, prompt_ids, max_new_tokens=40).tokens
    summary = answer(speculative, tiny_model, prompt_ids, draft=draft, max_new_tokens=40, gamma=gamma,
                     draft_tree_size=0)
    assert summary.tokens == expected and summary.finish_reason == "length"
    if draft_kind == "always_right":  # every pass commits gamma + 1 tokens
        assert summary.target_forwards == -(-40 // (gamma + 1))


@pytest.mark.parametrize("settings", [{"draft_tree_size": 0}, {"draft_tree_size": 6},
                                      {"draft_tree_size": 6, "static_tree": True}])
def test_the_draft_runs_its_first_pass_only_for_a_proposal_that_drafts(tiny_model, other_model, prompt_ids,
                                                                        settings):
    """Learning a pass queues the next proposal's first draft pass (on a GPU it runs while the host
    records the pass): one a pass that drafts, none after the answer's last pass or before a pass
    that has room for the target's token alone."""
    real = speculative.draft_tree.first_logits
    with mock.patch.object(speculative.draft_tree, "first_logits", side_effect=real) as first:
        events = list(speculative.generate(tiny_model, prompt_ids, draft=Draft("other", other_model), gamma=3,
                                           max_new_tokens=23, eos_token_ids=(), **settings))
    totals = [0, *(event.draft_forwards for event in events[:-1])]  # the draft's passes so far
    drafted = sum(1 for before, after in zip(totals, totals[1:]) if after > before)
    assert drafted > 2 and first.call_count == drafted
    assert events[-1].tokens == answer(ar, tiny_model, prompt_ids, max_new_tokens=23).tokens


def test_adaptive_gamma_and_repetition_penalty_equal_ar(tiny_model, other_model, prompt_ids):
    sampling = SamplingConfig(repetition_penalty=1.3)
    expected = answer(ar, tiny_model, prompt_ids, max_new_tokens=40, sampling=sampling).tokens
    for draft in [Draft("target", tiny_model), Draft("other", other_model)]:
        summary = answer(
            speculative, tiny_model, prompt_ids, draft=draft, max_new_tokens=40, gamma=2, adaptive_gamma=True,
            sampling=sampling
        )
        assert summary.tokens == expected


@pytest.mark.parametrize("every", [2, 3, 5, 7])
def test_rollback_after_a_rejection_at_every_position(tiny_model, prompt_ids, every):
    gamma = 6
    expected = answer(ar, tiny_model, prompt_ids, max_new_tokens=60).tokens
    events = list(speculative.generate(tiny_model, prompt_ids, draft=ScriptedDraft(tiny_model, every),
                                       max_new_tokens=60, gamma=gamma, draft_tree_size=0))
    assert events[-1].tokens == expected
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert any(e.rejected for e in steps)
    for e in steps:
        assert e.accepted + e.rejected == e.proposed
        assert e.committed[: len(e.accepted)] == e.accepted


def test_rejections_cover_every_draft_position(tiny_model, prompt_ids):
    seen = set()
    for every in [2, 3, 4, 5, 6, 7, 8]:
        for e in speculative.generate(tiny_model, prompt_ids, draft=ScriptedDraft(tiny_model, every), max_new_tokens=60,
                                      gamma=6, draft_tree_size=0):
            if isinstance(e, StepEvent) and e.rejected:
                seen.add(e.data.accept_length)
    assert seen == set(range(6))


def test_eos_inside_an_accepted_run(tiny_model, prompt_ids):
    greedy = list(answer(ar, tiny_model, prompt_ids, max_new_tokens=30).tokens)
    eos = greedy[4]
    expected = greedy[: greedy.index(eos) + 1]
    events = list(
        speculative.generate(tiny_model, prompt_ids, draft=Draft("target", tiny_model), max_new_tokens=30, gamma=8,
                             eos_token_ids=[eos], draft_tree_size=0)
    )
    summary = events[-1]
    assert list(summary.tokens) == expected and summary.finish_reason == "eos"
    assert events[0].committed == tuple(expected) and events[0].accepted == tuple(expected)  # one pass, cut after EOS


def test_summary_reports_acceptance_by_position(tiny_model, prompt_ids):
    summary = answer(speculative, tiny_model, prompt_ids, draft=ScriptedDraft(tiny_model, 3), max_new_tokens=40,
                     gamma=4, draft_tree_size=0)
    by_position = summary.extra["acceptance_by_position"]
    assert len(by_position) == 4 and all(0 <= a <= 1 for a in by_position)
    assert by_position == sorted(by_position, reverse=True)  # position i+1 is accepted only after position i
    assert summary.draft_forwards == summary.proposed


def target_marginals(model, prompt_ids, sampling, count: int = 2):
    """Exact distributions of each of the first `count` sampled tokens under `sampling`, summed
    over every prefix the target can sample before it."""
    processors = logits_processors(sampling)

    def next_probs(ids):
        with torch.no_grad():
            logits = model(ids).logits[:, -1].float()
        return torch.softmax(processors(ids, logits), dim=-1)[0]

    marginals, prefixes = [], [(prompt_ids, 1.0)]  # each prefix the target can sample, with its probability
    for _ in range(count):
        marginal, longer = 0, []
        for ids, weight in prefixes:
            probs = next_probs(ids)
            marginal = marginal + weight * probs
            longer += [(torch.cat([ids, token.view(1, 1)], dim=-1), weight * float(probs[token]))
                       for token in probs.nonzero()[:, 0]]
        marginals.append(marginal)
        prefixes = longer
    return marginals


def chi_square_p(samples, probs):
    counts = torch.bincount(torch.tensor(samples), minlength=probs.shape[0]).double()
    support = probs > 1e-9
    assert counts[~support].sum() == 0, "a token the target cannot produce was sampled"
    expected = probs[support].double() * len(samples)
    return chisquare(counts[support], expected / expected.sum() * counts[support].sum()).pvalue


def test_sampling_keeps_the_target_distribution(tiny_model, other_model, prompt_ids):
    """Chi-square of the first three tokens over many seeded runs against the exact target
    marginals: the first pass drafts two tokens, so the rule decides the first two (accept, or
    resample from the residual) and the third is its bonus or the next pass's. As many tokens
    drawn from the draft's own distribution fail the same test (so the test has power)."""
    settings = dict(do_sample=True, temperature=1.0, top_k=6)
    marginals = target_marginals(tiny_model, prompt_ids, SamplingConfig(**settings), count=3)
    first = marginals[0]
    runs = 1500
    draft = Draft("other", other_model)
    summaries = [
        answer(speculative, tiny_model, prompt_ids, draft=draft, max_new_tokens=3, gamma=2,
               sampling=SamplingConfig(seed=seed, **settings))
        for seed in range(runs)
    ]
    assert sum(s.proposed for s in summaries) >= 2 * runs  # every run's first pass drafted 2 tokens
    for position, marginal in enumerate(marginals):
        assert chi_square_p([s.tokens[position] for s in summaries], marginal) > 0.01
    # as many tokens drawn from the draft's own first-token distribution (exact, as the target's above)
    draft_first = target_marginals(other_model, prompt_ids, SamplingConfig(**settings), count=1)[0]
    draft_only = torch.multinomial(draft_first, runs, replacement=True,
                                   generator=torch.Generator().manual_seed(0)).tolist()
    with pytest.raises(AssertionError):
        assert chi_square_p(draft_only, first) > 0.01


def test_bad_gamma_is_refused(tiny_model, prompt_ids):
    for gamma in [0, -1, 17, 2.5]:
        with pytest.raises(SpecDemoError, match="gamma"):
            next(speculative.generate(tiny_model, prompt_ids, draft=Draft("t", tiny_model), gamma=gamma))


def test_draft_with_another_vocabulary_is_refused(embedded, tmp_path):
    vocab = {f"w{i}": i for i in range(97)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="w0")), unk_token="w0")
    tokenizer.save_pretrained(tmp_path)
    make_tiny_model().save_pretrained(tmp_path)
    with pytest.raises(SpecDemoError, match="vocabulary"):
        load_draft(str(tmp_path), embedded)


@pytest.mark.parametrize("prompt", ["Write a haiku about the sea.", "Explain in two sentences why we sleep."])
@pytest.mark.parametrize("draft_kind, tree_size", [("feature", 0), ("feature", 12), ("token", 0)])
def test_greedy_equals_ar_on_embedded_model_with_trained_draft(embedded, embedded_ar, prompt, draft_kind, tree_size):
    from specdemo.methods import method_options, token_draft
    from specdemo.methods.eagle import FeatureDraft

    draft = method_options("speculative", embedded)["draft"] if draft_kind == "feature" else token_draft(embedded)
    assert isinstance(draft, FeatureDraft) == (draft_kind == "feature")  # the preset's feature draft is speculative's
    assert draft.vocab is not None
    embedding = draft.shared["embed"] if draft_kind == "feature" else draft.model.get_input_embeddings()
    assert embedding is embedded.model.get_input_embeddings()  # shared, not copied
    input_ids = embedded.encode_chat(prompt)
    expected = embedded_ar(prompt, 48)  # AR's answer, decoded once for the three drafts
    summary = answer(
        speculative, embedded.model, input_ids, draft=draft, max_new_tokens=48, gamma=5, draft_tree_size=tree_size,
        eos_token_ids=embedded.eos_token_ids,
    )
    assert summary.tokens == expected
    assert summary.tokens_per_forward > 1.5  # the trained draft is right more often than not


class EndingDraft(Draft):
    """A token draft whose every guess is token 3."""

    def logits(self, input_ids, cache, logits_to_keep=1, **tree):
        logits = torch.zeros(1, logits_to_keep, self.model.config.vocab_size)
        logits[..., 3] = 10.0
        return logits


@pytest.mark.parametrize("settings", [dict(), dict(do_sample=True, seed=0), dict(repetition_penalty=1.3)])
def test_a_drafted_chain_ends_at_its_first_eos(tiny_model, prompt_ids, settings):
    """The chain is drafted whole and read once; what follows an EOS is dropped, its q rows too."""
    from transformers import DynamicCache

    from specdemo.core.sampling import TokenChooser

    choose = TokenChooser(SamplingConfig(**settings), "cpu")
    draft = EndingDraft("ending", tiny_model)
    vocab = tiny_model.config.vocab_size
    args = (draft, DynamicCache(config=tiny_model.config), prompt_ids, None, 4, choose)
    drafted, q = speculative.propose(*args, eos=(3,), vocab_size=vocab)
    assert drafted == [3]
    assert (q is None) != bool(settings.get("do_sample")) and (q is None or q.shape == (1, vocab))
    drafted, _ = speculative.propose(*args, eos=(), vocab_size=vocab)
    assert drafted == [3, 3, 3, 3]
