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
from transformers import DynamicCache, PreTrainedModel

from .errors import SpecDemoError, check_request
from .events import StepEvent, Summary
from .kvcache import keep_prefix
from .models import eos_token_ids as model_eos_token_ids
from .recorder import StepRecorder
from .sampling import GREEDY, SamplingConfig, TokenChooser

MAX_BLOCK_SIZE = 64


@torch.inference_mode()
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
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L] by Jacobi iteration over blocks of `block_size` tokens."""
    check_request(input_ids, max_new_tokens, getattr(model.config, "max_position_embeddings", None))
    check_greedy(sampling, method_name)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise SpecDemoError(f"block_size must be a whole number from 1 to {MAX_BLOCK_SIZE}, got {block_size!r}")
    eos = model_eos_token_ids(model) if eos_token_ids is None else tuple(eos_token_ids)
    recorder = StepRecorder(method_name, max_new_tokens, eos, stop)
    choose = TokenChooser(sampling, input_ids.device)
    cache = DynamicCache(config=model.config)
    sequence = input_ids  # [1, n] prompt + committed tokens; the cache holds all but the last
    while not recorder.done:
        block_start = len(recorder.tokens)
        block = initial_guess(sequence, min(block_size, recorder.room))
        trajectory: list[list[int]] = []  # the block as fed at each iteration
        correct_since: list[int | None] = [None] * len(block)  # iteration from which a position held its final token
        settled = 0  # leading block positions already committed
        while settled < len(block) and not recorder.done:
            trajectory.append(block)
            guess = block[settled:]
            cached = cache.get_seq_length()
            fed = torch.cat([sequence[:, cached:], torch.tensor([guess], device=sequence.device)], dim=-1)
            logits = model(fed, past_key_values=cache, use_cache=True, logits_to_keep=len(guess) + 1).logits[0]
            candidate = torch.cat([sequence, fed[:, sequence.shape[1] - cached :]], dim=-1)
            choices = choose.greedy_choices(candidate, logits).tolist()  # choices[i]: the target's token after guess[:i]
            accept_length = leading_matches(guess, choices)
            committed = [*guess[:accept_length], choices[accept_length]]
            next_block = block[:settled] + choices[: len(guess)]  # the Jacobi update of every unsettled position
            keep_prefix(cache, sequence.shape[1] + accept_length)
            sequence = torch.cat([sequence, torch.tensor([committed], device=sequence.device)], dim=-1)
            iteration = len(trajectory) - 1
            # only what enters the answer settles: block positions after an EOS never do
            newly_correct = mark_correct(correct_since, trajectory, settled, recorder.kept(committed), accept_length, iteration)
            yield recorder.step(
                committed=committed,
                proposed=guess,
                accepted=guess[:accept_length],
                rejected=[g for g, c in zip(guess[accept_length:], choices[accept_length:]) if g != c],  # guesses this pass replaced
                extra={
                    "block_start": block_start,
                    "iteration": iteration,
                    "state": block,
                    "next_state": next_block,
                    "settled": settled,
                    "accept_length": accept_length,
                    "correct_since": list(correct_since),
                    "fast_forwarded": [i for i in newly_correct if is_fast_forwarded(correct_since, i)],
                    "fixed_early": [i for i in newly_correct if is_fixed_early(correct_since, i)],
                },
            )
            settled += len(committed)
            block = next_block
    yield recorder.summary()


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


def leading_matches(guess: list[int], choices: list[int]) -> int:
    """How many leading guesses equal the target's choice after the guesses before them."""
    accept_length = 0
    while accept_length < len(guess) and guess[accept_length] == choices[accept_length]:
        accept_length += 1
    return accept_length


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
