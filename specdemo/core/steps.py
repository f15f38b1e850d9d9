"""Typed step payloads: what each kind of method tells about one target pass (`StepEvent.data`).

One frozen dataclass a kind of pass; the views dispatch on the type. AR's events carry none.
A tree step draws the root (the last committed token) as node 0, as in Medusa's papers' figures,
and a proposal's node i (parent -1: the root, as in `verify.Proposal`) as node i + 1: `tree_step`
numbers them so, for every tree.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChainStep:
    """A greedy chain verified in one pass (speculative's chain, or a pass that proposed nothing)."""

    gamma: int  # draft positions proposed
    accept_length: int
    target_token: int  # the target's own token after the accepted ones
    target_choices: list[int] | None = None  # the target's choice after the root and after each draft token
    proposer: str = "draft"  # "draft", or "heads" for Medusa's prompt pass (which proposes nothing)


@dataclass(frozen=True)
class SamplingCheck:
    """Speculative sampling's rule on a chain (Leviathan et al. 2023, Algorithm 1), per draft token."""

    gamma: int
    accept_length: int
    target_token: int  # the resampled or bonus token
    p: list[float]  # the target's probability of each draft token
    q: list[float]  # the draft's
    acceptance: list[float]  # min(1, p / q)
    draws: list[float]  # r ~ U(0, 1): accepted while r < min(1, p / q)


@dataclass(frozen=True)
class TreeStep:
    """A tree verified in one pass: speculative's draft tree, or Medusa's candidate tree."""

    tree_tokens: list[int]  # node 0 is the root
    tree_parents: list[int]  # -1 for the root
    tree_depths: list[int]
    tree_sources: list[str]  # per node after the root: "draft", "head" or "copy"
    accepted_path: list[int]  # nodes from the root down to the deepest accepted one
    best_candidate: list[int]  # that path continued by what the proposer liked best below it
    accept_length: int
    proposer: str = "draft"  # "draft" (speculative) or "heads" (Medusa)
    gamma: int | None = None  # speculative: the tree's depth
    target_token: int | None = None  # speculative: the target's own token after the path
    tree_scores: list[float] | None = None  # speculative: the draft's log-probability of each node's path
    tree_kind: str | None = None  # medusa: "dynamic" or "static"
    acceptance_rule: str = "greedy"  # medusa: "greedy" or "typical"
    token_probs: list[float] | None = None  # typical acceptance: each node's token's probability after its parent
    thresholds: list[float] | None = None  # typical acceptance: the bar after each node


def tree_step(tokens: Sequence[int], parents: Sequence[int], depths: Sequence[int], sources: Sequence[str], root: int,
              path: Sequence[int], best: Sequence[int], **fields) -> TreeStep:
    """A verified tree as the step draws it: `tokens`, `parents`, `depths` and `sources` per proposal
    node (parent -1 and depth 0: the root, holding `root`), `path` the accepted nodes and `best` that
    path continued by what the proposer liked best; `fields` TreeStep's own (per drawn node, the root first)."""
    drawn = lambda nodes: [0, *(node + 1 for node in nodes)]  # noqa: E731
    return TreeStep(tree_tokens=[root, *tokens], tree_parents=[-1, *(parent + 1 for parent in parents)],
                    tree_depths=[0, *depths], tree_sources=list(sources), accepted_path=drawn(path),
                    best_candidate=drawn(best), accept_length=len(path), **fields)


@dataclass(frozen=True)
class LookaheadStep:
    """Lookahead's pass: the Jacobi window, its new level, and the candidates verified beside it."""

    window: list[list[int]]  # N - 1 levels of W tokens, oldest first
    new_level: list[int]
    candidates: list[list[int]]
    candidate_sources: list[str]  # "copy" (from the text), "retrieved" (from earlier answers) or "pool"
    candidate_accept_lengths: list[int]
    best_candidate: int | None  # the committed candidate, None when none was tried
    accept_length: int
    pool_size: int


@dataclass(frozen=True)
class JacobiStep:
    """One Jacobi iteration over a block (jacobi and cllm)."""

    block_start: int  # answer position of the block's first token
    iteration: int
    state: list[int]  # the block as fed
    next_state: list[int]  # the block after this iteration
    settled: int  # leading block positions committed before this pass
    accept_length: int
    correct_since: list[int | None]  # per position, the iteration from which it held its final token
    fast_forwarded: list[int]  # positions that became right with their left neighbour
    fixed_early: list[int]  # positions right, and staying so, while their left neighbour was wrong


@dataclass(frozen=True)
class BeamStep:
    """A beam-search step (see `beam`'s module docstring for the dicts)."""

    num_beams: int
    beams: list[dict]
    finished: list[dict]
    chosen: list[int] | None = None  # the answer, on the last step


@dataclass(frozen=True)
class ContrastiveStep:
    """A contrastive-decoding choice (see `contrastive`'s module docstring for the dicts)."""

    candidates: list[dict]
    cutoff_logprob: float
    chosen: int
    expert_choice: int
    amateur_choice: int


Payload = ChainStep | SamplingCheck | TreeStep | LookaheadStep | JacobiStep | BeamStep | ContrastiveStep
