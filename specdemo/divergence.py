"""Why an answer differs from AR's: the margin between AR's two likeliest tokens where they part.

In float32 every greedy method commits AR's tokens. In bfloat16 a pass that feeds k tokens rounds
its sums differently from AR's pass of one token, so where AR's two likeliest tokens were nearly
tied the other pass may pick the second. `divergence` measures that at the first differing
position i of an answer:

- `margin`: logit(AR's token) - logit(the other answer's token) in the very passes AR made (the
  prompt in one pass, then one token a pass, replayed by AR's own loop: `ar.replay`): how far AR
  preferred its token. When the other answer took AR's runner-up, as a rounding flip does, it is
  AR's top-two gap (`top_two`);
- `wide_gap`: the same difference in one target pass over the prompt and the whole shared prefix,
  a pass as wide as a verification pass: negative when such a pass prefers the other token.

A near-tie flipped by rounding has a small margin; a margin above `SUSPECT_MARGIN` is too large for
rounding to flip (a method that commits a wrong token, even at a near-tie, shows one), so it is
flagged as a possible bug (docs/divergence.md gives the measurement).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specdemo.core.static import CompiledPass, request_cache
from specdemo.core.verify import Proposal, target_pass
from specdemo.methods import ar

# Twice the largest logit-gap change bfloat16 rounding made between AR's one-token passes and one
# wide pass over the same text (0.50, 26 Spec-Bench prompts x 128 tokens; every bfloat16 divergence
# of speculative, medusa, lookahead and jacobi there had a margin of at most 0.25): docs/divergence.md.
SUSPECT_MARGIN = 1.0


@dataclass(frozen=True)
class Divergence:
    position: int  # the first answer position whose tokens differ
    ar_token: int
    other_token: int
    margin: float  # logit(ar_token) - logit(other_token) in AR's own pass
    top_two: float  # AR's top-1 minus top-2 logit there (= margin when other_token is AR's runner-up)
    wide_gap: float  # logit(ar_token) - logit(other_token) in one wide pass over the prompt and the shared prefix

    @property
    def suspect(self) -> bool:
        """Too wide a margin for rounding to flip: a possible bug."""
        return self.margin > SUSPECT_MARGIN


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where the answers differ (one ending early counts), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def ar_logits(model: PreTrainedModel, input_ids: torch.Tensor, answer: Sequence[int], upto: int,
              passes: CompiledPass | None = None) -> torch.Tensor:
    """[upto + 1, V] float32: the logits AR's passes gave for answer positions 0..upto, replayed
    through AR's own loop and pass (`ar.replay`: the compiled static pass with `passes`, as `ar.generate` takes it)."""
    return ar.replay(model, input_ids, answer[: upto + 1], passes)


@torch.inference_mode()
def wide_logits(model: PreTrainedModel, input_ids: torch.Tensor, answer: Sequence[int], upto: int,
                passes: CompiledPass | None = None) -> torch.Tensor:
    """[upto + 1, V] float32: the logits for answer positions 0..upto from one target pass over the
    prompt and answer[:upto] on a fresh cache, the shared prefix fed as a verification pass feeds a
    chain (`verify.target_pass`)."""
    cache = request_cache(model, input_ids.shape[1] + upto, passes)
    return target_pass(model, cache, input_ids, Proposal.chain(answer[:upto], "answer")).logits


def top_two_gap(logits: torch.Tensor) -> torch.Tensor:
    """[...]: top-1 minus top-2 of the last dimension."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def divergences(model: PreTrainedModel, input_ids: torch.Tensor, ar_answer: Sequence[int],
                others: dict[str, Sequence[int]], passes: CompiledPass | None = None) -> dict[str, Divergence | None]:
    """For each other answer: where it first differs from AR's, and by how much AR preferred its
    token there (one replay of AR's passes and one wide pass serve them all, on `model`'s compiled
    pass `passes` where AR's answer ran on it); None when the answers are equal, or when one merely stops earlier."""
    parts = {name: first_difference(ar_answer, other) for name, other in others.items()}
    parts = {name: i for name, i in parts.items() if i is not None and i < min(len(ar_answer), len(others[name]))}
    if not parts:
        return dict.fromkeys(others)
    upto = max(parts.values())
    narrow, wide = (ar_logits(model, input_ids, ar_answer, upto, passes),
                    wide_logits(model, input_ids, ar_answer, upto, passes))
    found = {}
    for name, i in parts.items():
        a, b = ar_answer[i], others[name][i]
        found[name] = Divergence(i, a, b, float(narrow[i, a] - narrow[i, b]), float(top_two_gap(narrow[i])),
                                 float(wide[i, a] - wide[i, b]))
    return {name: found.get(name) for name in others}


def rounding_noise(model: PreTrainedModel, input_ids: torch.Tensor, ar_answer: Sequence[int],
                   passes: CompiledPass | None = None) -> float:
    """The largest change, over AR's answer positions, of AR's top-two logit gap between AR's own
    one-token passes and one wide pass over the same text: how far the dtype's rounding alone moves
    a margin. Zero-ish in float32; the scale `SUSPECT_MARGIN` must stay above in bfloat16."""
    if not ar_answer:
        return 0.0
    upto = len(ar_answer) - 1
    narrow, wide = (ar_logits(model, input_ids, ar_answer, upto, passes),
                    wide_logits(model, input_ids, ar_answer, upto, passes))
    top = narrow.topk(2, dim=-1).indices  # [T, 2]: AR's two likeliest tokens at each position
    gap_narrow = narrow.gather(-1, top[:, :1]) - narrow.gather(-1, top[:, 1:])
    gap_wide = wide.gather(-1, top[:, :1]) - wide.gather(-1, top[:, 1:])
    return float((gap_narrow - gap_wide).abs().max())
