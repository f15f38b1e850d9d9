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

Plain greedy decoding drafts a tree rather than a chain (`draft_tree`, EAGLE-2): one target pass
verifies every branch with tree attention and keeps the branch it agrees with. The tree also
gets a branch copied from the text (`prompt_lookup`) where the text's end occurred before, so
answers that quote their prompt commit runs the draft would not guess. Sampling drafts the
chain, whose rejection rule above keeps the target's distribution.
"""

import threading
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from . import draft_tree
from .attention import additive_mask, chain_positions, sees_from_parents
from .draft import Draft
from .eagle import FeatureDraft
from .errors import SpecDemoError, check_request
from .events import StepEvent, Summary
from .kvcache import keep_positions, keep_prefix
from .models import eos_token_ids as model_eos_token_ids
from .prompt_lookup import COPY_LENGTH, check_copy_length, copied_branch
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
    draft_tree_size: int | None = None,
    draft_tree_top_k: int = 2,
    copy_length: int | None = None,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L]; each target pass verifies up to `gamma` draft tokens.
    `draft_tree_size` > 0 drafts a tree of that many nodes instead of a chain (`draft_tree`, EAGLE-2),
    `gamma` deep, expanding `draft_tree_top_k` nodes per level; None chooses: a tree of
    AUTO_TREE_SIZE nodes for plain greedy decoding, the chain otherwise (a tree is verified
    greedily, without logits processors). `copy_length` > 0 adds to a tree a branch of up to
    that many tokens copied from the text (prompt lookup); None chooses COPY_LENGTH with a tree."""
    check_request(input_ids, max_new_tokens, getattr(model.config, "max_position_embeddings", None))
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA:
        raise SpecDemoError(f"gamma (draft tokens per step) must be a whole number from 1 to {MAX_GAMMA}, got {gamma!r}")
    choose = TokenChooser(sampling, input_ids.device)
    draft_tree_size = resolve_tree_size(draft_tree_size, draft_tree_top_k, choose)
    copy_length = resolve_copy_length(copy_length, draft_tree_size)
    eos = model_eos_token_ids(model) if eos_token_ids is None else tuple(eos_token_ids)
    recorder = StepRecorder("speculative", max_new_tokens, eos, stop)
    target_cache, draft_cache = DynamicCache(config=model.config), DynamicCache(config=draft.model.config)
    sequence = input_ids  # [1, n] prompt + committed tokens
    on_features = isinstance(draft, FeatureDraft)
    features = None  # [1, m, H] the target's features of the positions its cache holds (feature drafts)
    accepted_at = [0] * MAX_GAMMA  # steps in which draft position (tree depth) i was accepted
    proposed_at = [0] * MAX_GAMMA  # steps in which draft position (tree depth) i was proposed
    while not recorder.done:
        n, cached = sequence.shape[1], target_cache.get_seq_length()
        # A feature draft needs the target's features of the prompt: the first pass drafts nothing.
        step_gamma = min(gamma, recorder.room - 1) if features is not None or not on_features else 0
        if draft_tree_size and step_gamma:
            tree = draft_tree.grow(draft, draft_cache, sequence, features, depth=step_gamma, top_k=draft_tree_top_k, size=draft_tree_size, eos=eos)
            copied = copied_branch(sequence[0], min(copy_length, recorder.room - 1), eos)
            step = tree_step(model, target_cache, sequence, draft_tree.add_copy(tree, copied), on_features)
        else:
            step = chain_step(model, draft, target_cache, draft_cache, sequence, features, step_gamma, choose, eos)
        accept_length = len(step.accepted_nodes)
        # Roll back: the target keeps the committed tokens and the accepted draft tokens; the draft
        # keeps what it saw of them (a feature draft: only pairs fed the target's features).
        keep_positions(target_cache, n, [n + node for node in step.accepted_nodes])
        if on_features:
            kept_rows = [*range(n - cached), *(n - cached + node for node in step.accepted_nodes)]
            features = torch.cat([*([] if features is None else [features]), step.hidden[:, kept_rows]], dim=1)
            keep_prefix(draft_cache, min(draft_cache.get_seq_length(), n - 1))
        else:
            keep_prefix(draft_cache, min(draft_cache.get_seq_length(), n + accept_length))
        committed = [*step.accepted, step.next_token]
        sequence = torch.cat([sequence, torch.tensor([committed], device=sequence.device)], dim=-1)
        for depth in range(step.depth):
            proposed_at[depth] += 1
            accepted_at[depth] += depth < accept_length
        yield recorder.step(
            committed=committed,
            proposed=step.proposed,
            accepted=step.accepted,
            rejected=step.rejected,
            draft_forwards=step.draft_passes,
            extra={"gamma": step.depth, "accept_length": accept_length, "target_token": step.next_token, **step.extra},
        )
        # Learn: adaptive γ grows after a full acceptance and shrinks after an early rejection
        # (a copied branch can commit more than γ: that is no rejection).
        if adaptive_gamma and step_gamma == gamma:
            gamma = min(gamma + 2, MAX_GAMMA) if accept_length >= gamma else max(gamma - 1, 1)
    yield recorder.summary(extra={"acceptance_by_position": [a / p for a, p in zip(accepted_at, proposed_at) if p]})


@dataclass
class Verified:
    """What one target pass decided about a chain or a tree of draft tokens."""

    accepted_nodes: list[int]  # the accepted draft tokens' indices among the drafted ones, in order
    next_token: int  # the target's own token after them
    hidden: torch.Tensor | None  # [1, f, H] the target's features at every fed position (feature drafts)
    proposed: list[int]
    accepted: list[int]
    rejected: list[int]  # the drafted tokens after the last accepted one that the target turned down
    depth: int  # draft positions proposed: the chain's length, the tree's depth (a copied branch's included)
    draft_passes: int  # the draft's passes that proposed them (a copy takes none)
    extra: dict  # the event's method-specific data


AUTO_TREE_SIZE = 6  # with draft_tree_top_k = 2: the best of sizes 4 to 16 on our bench prompts (README)


def resolve_tree_size(draft_tree_size: int | None, draft_tree_top_k: int, choose: TokenChooser) -> int:
    """The number of tree nodes to draft (0: a chain), checked against the decoding rule."""
    plain_greedy = not choose.config.do_sample and not choose.processors
    if isinstance(draft_tree_top_k, bool) or not isinstance(draft_tree_top_k, int) or draft_tree_top_k < 1:
        raise SpecDemoError(f"draft_tree_top_k must be a whole number from 1, got {draft_tree_top_k!r}")
    if draft_tree_size is None:
        return AUTO_TREE_SIZE if plain_greedy else 0
    if isinstance(draft_tree_size, bool) or not isinstance(draft_tree_size, int) or draft_tree_size < 0:
        raise SpecDemoError(f"draft_tree_size (draft tree nodes, 0 for a chain) must be a whole number from 0, got {draft_tree_size!r}")
    if draft_tree_size and not plain_greedy:
        raise SpecDemoError(
            "a draft tree is verified greedily, without logits processors: for sampling or a repetition penalty "
            "draft a chain (draft_tree_size=0), whose rejection-sampling rule keeps the target's distribution"
        )
    return draft_tree_size


def resolve_copy_length(copy_length: int | None, draft_tree_size: int) -> int:
    """The number of tokens to copy into the draft tree (0: none), checked against the tree."""
    if copy_length is None:
        return COPY_LENGTH if draft_tree_size else 0
    if check_copy_length(copy_length) and not draft_tree_size:
        raise SpecDemoError(
            "copied tokens are a branch of the draft tree, which only plain greedy decoding drafts: "
            "decode greedily with a draft_tree_size above 0, or set copy_length=0"
        )
    return copy_length


def chain_step(model, draft, target_cache, draft_cache, sequence, features, gamma, choose, eos) -> Verified:
    """Draft a chain of up to `gamma` tokens and verify it in one target pass (Leviathan et al.)."""
    cached = target_cache.get_seq_length()
    draft_tokens, q = propose(draft, draft_cache, sequence, features, gamma, choose, eos, model.config.vocab_size)
    g = draft_tokens.shape[1]
    fed = torch.cat([sequence[:, cached:], draft_tokens], dim=-1)
    logits, hidden = verify_pass(model, fed, target_cache, g + 1, isinstance(draft, FeatureDraft))
    candidate = torch.cat([sequence, draft_tokens], dim=-1)
    if choose.config.do_sample:
        accept_length, next_token, details = accept_sampled(choose, candidate, logits, draft_tokens[0], q)
    else:
        accept_length, next_token, details = accept_greedy(choose, candidate, logits, draft_tokens[0])
    drafted = draft_tokens[0].tolist()
    return Verified(
        list(range(accept_length)), next_token, hidden, drafted, drafted[:accept_length], drafted[accept_length:], depth=g, draft_passes=g, extra=details
    )


def tree_step(model, target_cache, sequence, tree: draft_tree.DraftTree, with_features: bool) -> Verified:
    """Verify every node of a draft tree in one target pass, each seeing the committed tokens
    and its own ancestors (tree attention, as Medusa's)."""
    n, cached = sequence.shape[1], target_cache.get_seq_length()
    uncached = n - cached  # committed tokens the target has not seen; the last one is the tree's root
    parents = [*range(-1, uncached - 1), *(uncached - 1 if p < 0 else uncached + p for p in tree.parents)]
    sees = sees_from_parents(parents).to(sequence.device)
    fed = torch.cat([sequence[:, cached:], sequence.new_tensor([tree.tokens])], dim=-1)
    tree_attention = {"attention_mask": additive_mask(sees, cached, model.dtype), "position_ids": chain_positions(sees, cached)}
    logits, hidden = verify_pass(model, fed, target_cache, tree.size + 1, with_features, **tree_attention)
    choices = logits.argmax(dim=-1).tolist()  # [1 + size]: after the root, then after each node
    path = draft_tree.accept_greedy(tree, choices)
    next_token = choices[path[-1] + 1 if path else 0]
    rejected = draft_tree.best_continuation(tree, path[-1] if path else -1)
    extra = {
        "tree_tokens": [int(sequence[0, -1]), *tree.tokens],  # node 0 is the root, as in Medusa's events
        "tree_parents": [-1, *(p + 1 for p in tree.parents)],
        "tree_depths": [0, *tree.depths],
        "accepted_path": [0, *(node + 1 for node in path)],
        "best_candidate": [0, *(node + 1 for node in [*path, *rejected])],
        "tree_scores": tree.scores,
        "tree_sources": tree.sources,
    }
    accepted, turned_down = [tree.tokens[node] for node in path], [tree.tokens[node] for node in rejected]
    return Verified(path, next_token, hidden, tree.tokens, accepted, turned_down, depth=max(tree.depths), draft_passes=tree.draft_passes, extra=extra)


def verify_pass(model: PreTrainedModel, fed: torch.Tensor, cache: DynamicCache, keep: int, with_features: bool, **tree):
    """The target's logits [keep, V] at the last `keep` fed positions and, for a feature draft, its
    features [1, f, H] at every fed position (the last hidden state, what the LM head reads).
    `tree`: an attention_mask and position_ids when the fed tokens form a tree."""
    if not with_features:
        return model(fed, past_key_values=cache, use_cache=True, logits_to_keep=keep, **tree).logits[0], None
    hidden = model.base_model(fed, past_key_values=cache, use_cache=True, **tree).last_hidden_state  # [1, f, H]
    return model.get_output_embeddings()(hidden[:, -keep:])[0], hidden


def draft_logits(
    draft: Draft | FeatureDraft, cache: DynamicCache, sequence: torch.Tensor, features: torch.Tensor | None
) -> Generator[torch.Tensor, torch.Tensor, None]:
    """The draft's logits [1, K] for one next token after another; send each chosen token [1, 1]
    back. A token draft reads the tokens its cache has not seen; a feature draft the pairs
    (f_t, x_{t+1}) whose feature the target computed, then its own predicted features (EAGLE)."""
    logits, state = draft_tree.first_logits(draft, cache, sequence, features)
    while True:
        token = yield logits
        logits, state = draft_tree.branch_logits(draft, cache, token[0], state)


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
