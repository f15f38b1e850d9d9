"""The feature draft (EAGLE) in speculative decoding: greedy equals AR, the draft is fed exactly
the target's features of the committed text, sampling keeps the target's distribution."""

import copy

import pytest
import torch

from specdemo.core.events import final_summary
from specdemo.core.sampling import SamplingConfig
from specdemo.methods import ar, speculative
from specdemo.methods.eagle import FeatureDraft, init_from_target

from test_speculative import chi_square_p, target_marginals


def feature_draft(target, seed: int = 0, vocab=None, layers=()) -> FeatureDraft:
    torch.manual_seed(seed)
    draft = FeatureDraft(target, vocab, layers).eval()
    # from the target's last layer: it agrees with the target often enough to test both verdicts
    init_from_target(draft, target)
    if layers:  # the layers' residual stream then changes what it drafts
        with torch.no_grad():
            draft.reduce.weight.add_(0.05 * torch.randn_like(draft.reduce.weight))
    return draft


def answer(method, model, prompt_ids, **kwargs):
    return final_summary(method.generate(model, prompt_ids, **kwargs))


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("vocab", [None, torch.arange(0, 97, 2)])
def test_greedy_equals_ar(tiny_model, prompt_ids, gamma, vocab):
    expected = answer(ar, tiny_model, prompt_ids, max_new_tokens=40).tokens
    draft = feature_draft(tiny_model, vocab=vocab)
    summary = answer(speculative, tiny_model, prompt_ids, draft=draft, max_new_tokens=40, gamma=gamma,
                     draft_tree_size=0)
    assert summary.tokens == expected and summary.finish_reason == "length"


@pytest.mark.parametrize("tree_size", [0, 10])
def test_a_draft_that_reads_layers_is_fed_them_and_greedy_equals_ar(tiny_model, prompt_ids, tree_size):
    """The verification pass returns the residual stream after the draft's layers with each
    feature (`verify.target_pass`), the draft reads exactly those of the committed text, and
    greedy decoding still equals AR."""
    draft = feature_draft(tiny_model, layers=(1,))
    calls = []
    original = draft.fuse
    draft.fuse = lambda features, tokens: calls.append(features.clone()) or original(features, tokens)
    summary = answer(speculative, tiny_model, prompt_ids, draft=draft, max_new_tokens=40, gamma=3,
                     draft_tree_size=tree_size)
    assert summary.tokens == answer(ar, tiny_model, prompt_ids, max_new_tokens=40).tokens
    hidden = tiny_model.config.hidden_size
    fed = torch.cat([f for f in calls if f.shape[-1] == 2 * hidden], dim=1)  # the target's, pass after pass
    assert summary.accepted > 0 and fed.shape[1] >= prompt_ids.shape[1]
    sequence = torch.cat([prompt_ids, torch.tensor([summary.tokens])], dim=-1)
    with torch.no_grad():
        out = tiny_model.model(sequence, output_hidden_states=True)
    expected = torch.cat([out.hidden_states[1], out.last_hidden_state], dim=-1)[:, : fed.shape[1]]
    torch.testing.assert_close(fed, expected, rtol=1e-4, atol=1e-4)


def test_greedy_with_repetition_penalty_and_adaptive_gamma_equals_ar(tiny_model, prompt_ids):
    sampling = SamplingConfig(repetition_penalty=1.3)
    expected = answer(ar, tiny_model, prompt_ids, max_new_tokens=40, sampling=sampling).tokens
    draft = feature_draft(tiny_model)
    assert answer(speculative, tiny_model, prompt_ids, draft=draft, max_new_tokens=40, sampling=sampling,
                  adaptive_gamma=True).tokens == expected


class OracleDraft(FeatureDraft):
    """A feature draft that predicts the true next feature (it runs a copy of the target on the
    text its pairs spell) but whose proposal is replaced by the runner-up every `every`-th token,
    so rejections happen at every draft position. It logs each call with its cache length."""

    def __init__(self, target, first_token: int, every: int):
        super().__init__(target)
        # a plain dict: not a submodule, and no hook of the real target fires
        self.oracle = {"target": copy.deepcopy(target)}
        self.tokens, self.every, self.calls, self.log = {0: first_token}, every, 0, []

    def features(self, features, next_tokens, cache, **tree):
        seen, count = cache.get_seq_length(), next_tokens.shape[1]
        self.log.append((seen, features.clone(), next_tokens.clone(), bool(tree)))
        predicted = super().features(features, next_tokens, cache, **tree)  # keeps the cache in step with the pairs
        if tree:  # branches of a draft tree do not spell one text: no oracle for them
            return predicted
        for i, token in enumerate(next_tokens[0].tolist()):
            self.tokens[seen + 1 + i] = token
        text = torch.tensor([[self.tokens[position] for position in range(seen + count + 1)]])
        return self.oracle["target"].model(text).last_hidden_state[:, -count:]

    def logits(self, predicted):
        logits = super().logits(predicted).clone()
        self.calls += 1
        if self.calls % self.every == 0:
            logits[..., logits.argmax(-1)] = float("-inf")
        return logits


@pytest.mark.parametrize("every", [2, 3, 5])
def test_rollback_feeds_the_draft_exactly_the_targets_features(tiny_model, prompt_ids, every):
    """Greedy equals AR with rejections at every position, and after each target pass the draft's
    first call continues its cache with the pairs (f_t, x_{t+1}) of the committed text, features
    exactly the target's: the rollback kept no pair made from the draft's own predictions."""
    draft = OracleDraft(tiny_model, prompt_ids[0, 0].item(), every)
    passes = []
    hook = tiny_model.model.register_forward_pre_hook(lambda module, args: passes.append(len(draft.log)))
    try:
        *events, summary = speculative.generate(tiny_model, prompt_ids, draft=draft, max_new_tokens=40, gamma=4,
                                                draft_tree_size=0)
    finally:
        hook.remove()
    lengths = [prompt_ids.shape[1]]  # the text's length before the first pass, then after each pass
    for event in events:
        lengths.append(lengths[-1] + len(event.committed))
    assert summary.tokens == answer(ar, tiny_model, prompt_ids, max_new_tokens=40).tokens
    assert 0 < summary.accepted < summary.proposed  # both verdicts happened
    assert summary.target_forwards < 40  # and accepted runs saved passes
    sequence = torch.cat([prompt_ids, torch.tensor([summary.tokens])], dim=-1)
    with torch.no_grad():
        true_features = tiny_model.model(sequence).last_hidden_state  # [1, n, H]
    # the first draft call after each target pass that was followed by a proposal (the last pass,
    # and one with room for a single token, are not)
    first_calls = [(draft.log[start], step)
                   for step, (start, end) in enumerate(zip(passes, passes[1:] + [len(draft.log)])) if end > start]
    assert len(first_calls) >= summary.target_forwards - 2
    for (seen, features, next_tokens, _), step in first_calls:
        count = features.shape[1]
        # the cache kept exactly the pairs of the text before this pass (all but its last token has a
        # successor), and the new pairs reach the last committed token
        assert seen == (lengths[step] - 1 if step else 0) and seen + count + 1 == lengths[step + 1]
        torch.testing.assert_close(features, true_features[:, seen : seen + count], rtol=1e-4, atol=1e-4)
        assert torch.equal(next_tokens, sequence[:, seen + 1 : seen + 1 + count])


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution(tiny_model, prompt_ids):
    """The same chi-square test as the token draft's. A feature draft drafts nothing in its first
    pass (it needs the prompt's features), so the second pass drafts the second and third tokens
    and the rule decides them; the fourth is its bonus or the next pass's."""
    settings = dict(do_sample=True, temperature=1.0, top_k=6)
    marginals = target_marginals(tiny_model, prompt_ids, SamplingConfig(**settings), count=3)
    draft = feature_draft(tiny_model)
    runs = 1200
    summaries = [
        answer(speculative, tiny_model, prompt_ids, draft=draft, max_new_tokens=4, gamma=2,
               sampling=SamplingConfig(seed=seed, **settings))
        for seed in range(runs)
    ]
    assert sum(s.proposed for s in summaries) >= 2 * runs  # the rule ran on two drafted tokens in every run
    for position, marginal in enumerate(marginals):
        assert chi_square_p([s.tokens[position] for s in summaries], marginal) > 0.01
