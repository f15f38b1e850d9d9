"""Typed step payloads: what each kind of method tells about one target pass (`StepEvent.data`).

One frozen dataclass a kind of pass; the views dispatch on the type. AR's events carry none.
A tree step holds the tree it verified as the engine took it (`verify.Proposal`), numbered as
there: node i is the proposal's node i, parent -1 the root (the last committed token).
"""

from dataclasses import dataclass

from specdemo.core.verify import Proposal


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
    """A tree verified in one pass: speculative's draft tree, or Medusa's candidate tree. Its nodes are
    the proposal's (`tree`: tokens, parents with -1 the root, sources, depths, a draft tree's scores);
    the root is the last committed token, `root_token`."""

    tree: Proposal
    root_token: int
    accepted_path: list[int]  # the accepted nodes from the root's child down ([]: none)
    best_candidate: list[int]  # that path continued by what the proposer liked best below it
    proposer: str = "draft"  # "draft" (speculative) or "heads" (Medusa)
    gamma: int | None = None  # speculative: the tree's depth
    target_token: int | None = None  # speculative: the target's own token after the path
    tree_kind: str | None = None  # medusa: "dynamic" or "static"
    acceptance_rule: str = "greedy"  # medusa: "greedy" or "typical"
    token_probs: list[float] | None = None  # typical acceptance: each node's token's probability after its parent
    thresholds: list[float] | None = None  # typical acceptance: the bar after the root (0), then after node i (1 + i)

    @property
    def accept_length(self) -> int:
        return len(self.accepted_path)


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
