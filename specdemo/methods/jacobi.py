"""Jacobi decoding: guess a block of n tokens, then refine every guess at once until it stops changing.

Santilli et al. 2023, "Accelerating Transformer Inference for Translation via Parallel
Decoding"; Song et al. 2021, "Accelerating Feedforward Computation via Parallel Nonlinear
Equation Solving". Greedy decoding of a block y_1..y_n is the fixed point of the system
y_i = argmax p(. | x, y_<i), i = 1..n; one Jacobi iteration is one target pass over the whole
block, replacing each y_i by the target's argmax after (x, y_<i) as currently guessed.

Each pass also verifies: the guesses that equal the target's choice after a correct prefix are
correct, so the longest such run is committed with the target's next token, exactly as a
greedy speculative step would (this is how a guess that settled early is "fast-forwarded").
The committed prefix of the block stays in the KV cache; the rest is fed again next pass.
The model is a parameter: CLLM runs this same code on consistency-trained weights.
"""

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedModel

from specdemo.core.errors import SpecDemoError, check_whole
from specdemo.core.events import StepEvent, Summary
from specdemo.core.loop import Context, Learned, Proposed, Proposer, Verdict, decode
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.core.static import CompiledPass
from specdemo.core.steps import JacobiStep
from specdemo.core.verify import Proposal, TargetPass, accept_greedy, choices_after

MAX_BLOCK_SIZE = 64


def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    block_size: int = 16,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
    method_name: str = "jacobi",
    passes: CompiledPass | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L] by Jacobi iteration over blocks of `block_size` tokens.
    `passes`: the model's compiled static pass (None: eager)."""
    check_greedy(sampling, method_name)
    check_whole("block_size", block_size, 1, MAX_BLOCK_SIZE)
    proposer = JacobiIteration(block_size)
    return decode(model, input_ids, proposer, method=method_name, max_new_tokens=max_new_tokens, sampling=sampling,
                  eos_token_ids=eos_token_ids, stop=stop, passes=passes)


@dataclass(frozen=True)
class Block:
    """A block under Jacobi iteration: its tokens as guessed now, where it starts in the answer,
    how many of its leading positions are committed, the block as fed at each iteration, and the
    iteration from which each position held its final token."""

    tokens: list[int] = field(default_factory=list)
    start: int = 0
    settled: int = 0
    trajectory: tuple[list[int], ...] = ()
    correct_since: tuple[int | None, ...] = ()

    @property
    def done(self) -> bool:
        return self.settled >= len(self.tokens)


class JacobiIteration(Proposer):
    """Proposes the unsettled rest of the current block as a chain; learns the block's Jacobi update."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.block = Block()  # the block as the last pass left it

    def propose(self, context: Context, sequence: torch.Tensor, room: int) -> Proposed:
        block = self.block
        if block.done:  # a new block: an initial guess
            guess = initial_guess(context.text.of(sequence), min(self.block_size, room))
            block = Block(guess, block.start + block.settled, correct_since=(None,) * len(guess))
        fed = Block(block.tokens, block.start, block.settled, (*block.trajectory, block.tokens), block.correct_since)
        return Proposed(Proposal.chain(fed.tokens[fed.settled :], "guess"), fed)

    def learn(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass,
              verdict: Verdict, kept: list[int], room: int) -> Learned:
        block: Block = proposed.step
        guess, choices, accept_length = list(proposed.proposal.tokens), verdict.details["choices"], len(verdict.path)
        next_block = block.tokens[: block.settled] + choices[: len(guess)]  # each unsettled position's Jacobi update
        iteration = len(block.trajectory) - 1
        # only what enters the answer settles: block positions after an EOS never do
        correct_since = list(block.correct_since)
        newly_correct = mark_correct(correct_since, list(block.trajectory), block.settled, kept, accept_length,
                                     iteration)
        learned = Learned(
            # guesses this pass replaced
            rejected=[g for g, c in zip(guess[accept_length:], choices[accept_length:]) if g != c],
            data=JacobiStep(
                block_start=block.start,
                iteration=iteration,
                state=block.tokens,
                next_state=next_block,
                settled=block.settled,
                accept_length=accept_length,
                correct_since=list(correct_since),
                fast_forwarded=[i for i in newly_correct if is_fast_forwarded(correct_since, i)],
                fixed_early=[i for i in newly_correct if is_fixed_early(correct_since, i)],
            ),
        )
        settled = block.settled + accept_length + 1
        self.block = Block(next_block, block.start, settled, block.trajectory, tuple(correct_since))
        return learned

    def accept(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass) -> Verdict:
        """Greedy acceptance, keeping the target's choices: they are the block's next state."""
        choices = choices_after(context.choose, sequence, proposed.proposal, verified.logits)
        path, token = accept_greedy(proposed.proposal, choices)
        return Verdict(path, token, {"choices": choices})


def check_greedy(sampling: SamplingConfig, method_name: str) -> None:
    if sampling.do_sample:
        raise SpecDemoError(
            f"{method_name} decodes greedily (its fixed point is the greedy answer): turn sampling off, "
            "or choose ar or speculative to sample"
        )


def initial_guess(text: np.ndarray, length: int) -> list[int]:
    """The first guess of a block after `text` [n] (the host's copy, `loop.Context.text`): its last
    token repeated (any guess converges; this one is deterministic and costs nothing)."""
    return [int(text[-1])] * length


def mark_correct(
    correct_since: list[int | None], trajectory: list[list[int]], settled: int, committed: list[int],
    accept_length: int, iteration: int
) -> list[int]:
    """Record, for the block positions this pass committed, the iteration from which each held its
    final token without change (the target's own token, after the `accept_length` accepted
    guesses: the next iteration). Returns those positions."""
    positions = [p for p in range(settled, settled + len(committed)) if p < len(correct_since)]
    for offset, position in enumerate(positions):
        if offset == accept_length:  # the target's token: wrong in this state, right in the next
            correct_since[position] = iteration + 1
            continue
        since = iteration
        while since > 0 and trajectory[since - 1][position] == committed[offset]:
            since -= 1
        correct_since[position] = since
    return positions


def is_fast_forwarded(correct_since: list[int | None], position: int) -> bool:
    """Became correct in the same iteration as its predecessor (more than one token per pass)."""
    return position > 0 and correct_since[position] == correct_since[position - 1]


def is_fixed_early(correct_since: list[int | None], position: int) -> bool:
    """Was correct, and stayed so, while its predecessor was still wrong."""
    return position > 0 and correct_since[position] < correct_since[position - 1]
