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

import torch
from transformers import PreTrainedModel

from specdemo.core.errors import SpecDemoError, check_whole
from specdemo.core.events import StepEvent, Summary
from specdemo.core.loop import Context, Learned, Proposer, Verdict, decode
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
    return decode(model, input_ids, proposer, method=method_name, max_new_tokens=max_new_tokens, sampling=sampling, eos_token_ids=eos_token_ids, stop=stop,
                  passes=passes)


class JacobiIteration(Proposer):
    """Proposes the unsettled rest of the current block as a chain; learns the block's Jacobi update."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.block: list[int] = []  # the current block as guessed now
        self.settled = 0  # leading block positions already committed
        self.block_start = 0  # answer position of the block's first token
        self.trajectory: list[list[int]] = []  # the block as fed at each iteration
        self.correct_since: list[int | None] = []  # iteration from which a position held its final token

    def propose(self, context: Context, sequence: torch.Tensor, room: int) -> Proposal:
        if self.settled >= len(self.block):  # a new block: an initial guess
            self.block_start += self.settled
            self.block, self.settled, self.trajectory = initial_guess(sequence, min(self.block_size, room)), 0, []
            self.correct_since = [None] * len(self.block)
        self.trajectory.append(self.block)
        return Proposal.chain(self.block[self.settled :], "guess")

    def learn(self, context: Context, sequence: torch.Tensor, proposal: Proposal, verified: TargetPass, verdict: Verdict, kept: list[int]) -> Learned:
        guess, choices, accept_length = list(proposal.tokens), verdict.details["choices"], len(verdict.path)
        next_block = self.block[: self.settled] + choices[: len(guess)]  # the Jacobi update of every unsettled position
        iteration = len(self.trajectory) - 1
        # only what enters the answer settles: block positions after an EOS never do
        newly_correct = mark_correct(self.correct_since, self.trajectory, self.settled, kept, accept_length, iteration)
        learned = Learned(
            rejected=[g for g, c in zip(guess[accept_length:], choices[accept_length:]) if g != c],  # guesses this pass replaced
            data=JacobiStep(
                block_start=self.block_start,
                iteration=iteration,
                state=self.block,
                next_state=next_block,
                settled=self.settled,
                accept_length=accept_length,
                correct_since=list(self.correct_since),
                fast_forwarded=[i for i in newly_correct if is_fast_forwarded(self.correct_since, i)],
                fixed_early=[i for i in newly_correct if is_fixed_early(self.correct_since, i)],
            ),
        )
        self.settled += accept_length + 1
        self.block = next_block
        return learned

    def accept(self, context: Context, sequence: torch.Tensor, proposal: Proposal, verified: TargetPass) -> Verdict:
        """Greedy acceptance, keeping the target's choices: they are the block's next state."""
        choices = choices_after(context.choose, sequence, proposal, verified.logits)
        path, token = accept_greedy(proposal, choices)
        return Verdict(path, token, {"choices": choices})


def check_greedy(sampling: SamplingConfig, method_name: str) -> None:
    if sampling.do_sample:
        raise SpecDemoError(
            f"{method_name} decodes greedily (its fixed point is the greedy answer): turn sampling off, "
            "or choose ar or speculative to sample"
        )


def initial_guess(sequence: torch.Tensor, length: int) -> list[int]:
    """The first guess of a block: the last committed token repeated (any guess converges;
    this one is deterministic and costs nothing)."""
    return [int(sequence[0, -1])] * length


def mark_correct(
    correct_since: list[int | None], trajectory: list[list[int]], settled: int, committed: list[int], accept_length: int, iteration: int
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
