"""Speculative decoding: a draft proposes γ tokens, the target verifies them in one pass.

Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding"
(Algorithm 1), and Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling".
Greedy: keep the longest prefix of the draft that equals the target's argmax, then the
target's own token. Sampling: accept draft token x with probability min(1, p(x)/q(x)); on the
first rejection resample from norm(max(0, p - q)); after a full acceptance take a bonus token
from p. Both keep the target's output exactly (greedy) or its distribution exactly (sampling).

The draft is a token draft (`draft.Draft`: any small causal LM of the target's vocabulary) or a
feature draft (`eagle.FeatureDraft`, Li et al. 2024), which drafts from the target's own last
hidden states: the verification pass then also returns them, and the draft's cache keeps only
the pairs whose feature the target computed.
"""

import threading
from collections.abc import Generator, Iterable, Iterator

import torch
from transformers import DynamicCache, PreTrainedModel

from .draft import Draft
from .eagle import FeatureDraft
from .errors import SpecDemoError, check_request
from .events import StepEvent, Summary
from .kvcache import keep_prefix
from .models import eos_token_ids as model_eos_token_ids
from .recorder import StepRecorder
from .sampling import GREEDY, SamplingConfig, TokenChooser

MAX_GAMMA = 16


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    draft: Draft | FeatureDraft,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    gamma: int = 2,
    adaptive_gamma: bool = False,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L]; each target pass verifies up to `gamma` draft tokens."""
    check_request(input_ids, max_new_tokens, getattr(model.config, "max_position_embeddings", None))
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA:
        raise SpecDemoError(f"gamma (draft tokens per step) must be a whole number from 1 to {MAX_GAMMA}, got {gamma!r}")
    eos = model_eos_token_ids(model) if eos_token_ids is None else tuple(eos_token_ids)
    recorder = StepRecorder("speculative", max_new_tokens, eos, stop)
    choose = TokenChooser(sampling, input_ids.device)
    target_cache, draft_cache = DynamicCache(config=model.config), DynamicCache(config=draft.model.config)
    sequence = input_ids  # [1, n] prompt + committed tokens
    on_features = isinstance(draft, FeatureDraft)
    features = None  # [1, m, H] the target's features of the positions its cache holds (feature drafts)
    accepted_at = [0] * MAX_GAMMA  # steps in which draft position i was accepted
    proposed_at = [0] * MAX_GAMMA  # steps in which draft position i was proposed
    while not recorder.done:
        # 1. Propose: the draft extends the sequence by up to γ tokens (never past the answer's room).
        #    A feature draft needs the target's features of the prompt: the first pass drafts nothing.
        step_gamma = min(gamma, recorder.room - 1) if features is not None or not on_features else 0
        draft_tokens, q = propose(draft, draft_cache, sequence, features, step_gamma, choose, eos, model.config.vocab_size)
        g = draft_tokens.shape[1]
        # 2. Verify: one target pass over the uncached committed tokens and the draft.
        n, cached = sequence.shape[1], target_cache.get_seq_length()
        fed = torch.cat([sequence[:, cached:], draft_tokens], dim=-1)
        logits, hidden = verify_pass(model, fed, target_cache, g + 1, on_features)  # [g+1, V], [1, f, H] or None
        # 3. Accept: the longest agreeing prefix, then one token of the target's own.
        candidate = torch.cat([sequence, draft_tokens], dim=-1)
        if sampling.do_sample:
            accept_length, next_token, details = accept_sampled(choose, candidate, logits, draft_tokens[0], q)
        else:
            accept_length, next_token, details = accept_greedy(choose, candidate, logits, draft_tokens[0])
        # 4. Roll back: the target keeps the accepted prefix; the draft keeps what it saw of it
        #    (a feature draft: the pairs fed the target's features, not its own predictions).
        keep_prefix(target_cache, n + accept_length)
        if on_features:
            features = torch.cat([*([] if features is None else [features]), hidden[:, : n + accept_length - cached]], dim=1)
            keep_prefix(draft_cache, min(draft_cache.get_seq_length(), n - 1))
        else:
            keep_prefix(draft_cache, min(draft_cache.get_seq_length(), n + accept_length))
        committed = [*draft_tokens[0, :accept_length].tolist(), next_token]
        sequence = torch.cat([candidate[:, : n + accept_length], torch.tensor([[next_token]], device=sequence.device)], dim=-1)
        for i in range(g):
            proposed_at[i] += 1
            accepted_at[i] += i < accept_length
        drafted = draft_tokens[0].tolist()
        yield recorder.step(
            committed=committed,
            proposed=drafted,
            accepted=drafted[:accept_length],
            rejected=drafted[accept_length:],
            draft_forwards=g,
            extra={"gamma": g, "accept_length": accept_length, "target_token": next_token, **details},
        )
        # 5. Learn: adaptive γ grows after a full acceptance and shrinks after an early rejection.
        if adaptive_gamma and g == gamma:
            gamma = min(gamma + 2, MAX_GAMMA) if accept_length == g else max(gamma - 1, 1)
    yield recorder.summary(extra={"acceptance_by_position": [a / p for a, p in zip(accepted_at, proposed_at) if p]})


def verify_pass(model: PreTrainedModel, fed: torch.Tensor, cache: DynamicCache, keep: int, with_features: bool):
    """The target's logits [keep, V] at the last `keep` fed positions and, for a feature draft, its
    features [1, f, H] at every fed position (the last hidden state, what the LM head reads)."""
    if not with_features:
        return model(fed, past_key_values=cache, use_cache=True, logits_to_keep=keep).logits[0], None
    hidden = model.base_model(fed, past_key_values=cache, use_cache=True).last_hidden_state  # [1, f, H]
    return model.get_output_embeddings()(hidden[:, -keep:])[0], hidden


def draft_logits(
    draft: Draft | FeatureDraft, cache: DynamicCache, sequence: torch.Tensor, features: torch.Tensor | None
) -> Generator[torch.Tensor, torch.Tensor, None]:
    """The draft's logits [1, K] for one next token after another; send each chosen token [1, 1]
    back. A token draft reads the tokens its cache has not seen; a feature draft the pairs
    (f_t, x_{t+1}) whose feature the target computed, then its own predicted features (EAGLE)."""
    if isinstance(draft, FeatureDraft):
        seen = cache.get_seq_length()
        predicted = draft.features(features[:, seen:], sequence[:, seen + 1 :], cache)[:, -1:]  # [1, 1, H]
        while True:
            token = yield draft.logits(predicted[:, -1])
            predicted = draft.features(predicted, token, cache)
    fed = sequence[:, cache.get_seq_length() :]
    while True:
        token = yield draft.logits(fed, cache)[:, -1]
        fed = token


def propose(
    draft: Draft | FeatureDraft,
    cache: DynamicCache,
    sequence: torch.Tensor,
    features: torch.Tensor | None,
    gamma: int,
    choose: TokenChooser,
    eos: tuple[int, ...],
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft up to `gamma` tokens [1, g] autoregressively (stopping after an EOS), and when
    sampling their distributions q [g, V] (V: the target's vocabulary) under the same logits
    processing as the target."""
    tokens, q = [], []
    extended = sequence
    steps = draft_logits(draft, cache, sequence, features)
    token = None
    for _ in range(gamma):
        logits = steps.send(token)  # [1, K]; sending None starts it
        if choose.config.do_sample or choose.processors:
            scores = choose.scores(extended, draft.spread(logits, vocab_size))  # [1, V]
            if choose.config.do_sample:
                probs = torch.softmax(scores, dim=-1)
                token = torch.multinomial(probs, 1, generator=choose.generator)
                q.append(probs[0])
            else:
                token = scores.argmax(dim=-1, keepdim=True)
        else:
            token = draft.token_ids(logits.argmax(dim=-1, keepdim=True))  # [1, 1]
        tokens.append(token)
        extended = torch.cat([extended, token], dim=-1)
        if token.item() in eos:
            break
    draft_tokens = torch.cat(tokens, dim=-1) if tokens else sequence.new_zeros(1, 0)
    return draft_tokens, (torch.stack(q) if q else None)


def accept_greedy(
    choose: TokenChooser, candidate: torch.Tensor, logits: torch.Tensor, draft_tokens: torch.Tensor
) -> tuple[int, int, dict]:
    """Exact-match verification: accept while the draft equals the target's choice."""
    g = draft_tokens.shape[0]
    choices = choose.greedy_choices(candidate, logits)  # [g+1]
    matches = (choices[:g] == draft_tokens).int()
    accept_length = int(matches.cumprod(dim=0).sum())
    return accept_length, int(choices[accept_length]), {"target_choices": choices.tolist()}


def accept_sampled(
    choose: TokenChooser, candidate: torch.Tensor, logits: torch.Tensor, draft_tokens: torch.Tensor, q: torch.Tensor
) -> tuple[int, int, dict]:
    """The speculative sampling rule (Leviathan et al. 2023, Algorithm 1)."""
    g = draft_tokens.shape[0]
    n = candidate.shape[1] - g
    if g == 0:  # nothing was drafted (no room left): one token from p
        p = torch.softmax(choose.scores(candidate, logits[:1]), dim=-1)
        return 0, int(torch.multinomial(p[0], 1, generator=choose.generator)), {}
    p = torch.cat([torch.softmax(choose.scores(candidate[:, : n + i], logits[i : i + 1]), dim=-1) for i in range(g + 1)])
    p_x = p[torch.arange(g), draft_tokens]  # [g] target probability of each draft token
    q_x = q[torch.arange(g), draft_tokens]  # [g] draft probability of each draft token
    acceptance = torch.clamp(p_x / q_x, max=1.0)  # min(1, p/q)
    draws = torch.rand(g, generator=choose.generator, device=p.device)  # r ~ U(0, 1)
    rejected = (draws >= acceptance).nonzero()
    accept_length = int(rejected[0]) if len(rejected) else g
    if accept_length < g:
        residual = torch.clamp(p[accept_length] - q[accept_length], min=0)  # max(0, p - q), renormalized
        next_token = torch.multinomial(residual / residual.sum(), 1, generator=choose.generator)
    else:
        next_token = torch.multinomial(p[g], 1, generator=choose.generator)  # bonus token from p
    details = {"p": p_x.tolist(), "q": q_x.tolist(), "acceptance": acceptance.tolist(), "draws": draws.tolist()}
    return accept_length, int(next_token), details
