"""Autoregressive decoding, the baseline: one target forward pass per token.

Greedy (argmax) or sampled (repetition penalty, temperature, top-k, top-p; seeded), with the KV
cache reused between passes: the decoding loop (`loop.decode`) with a proposer of nothing.
Yields one StepEvent per pass, then a Summary. `replay` runs the same passes along a given answer
and returns their logits (the divergence margin reads AR's own passes: `specdemo.divergence`).
"""

import threading
from collections.abc import Iterable, Iterator, Sequence

import torch
from transformers import PreTrainedModel

from specdemo.core.events import StepEvent, Summary
from specdemo.core.loop import Context, Learned, Proposed, Proposer, Verdict, decode
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.core.static import CompiledPass
from specdemo.core.verify import TargetPass


def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
    passes: CompiledPass | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after the prompt `input_ids` [1, L], one token per target pass. `passes`: the model's
    compiled static pass (`static.compile_passes`); None: the eager pass."""
    return decode(model, input_ids, Proposer(), method="ar", max_new_tokens=max_new_tokens, sampling=sampling,
                  eos_token_ids=eos_token_ids, stop=stop, passes=passes)


class Replay(Proposer):
    """AR's proposer of nothing, committing the tokens of a given answer instead of choosing them,
    and keeping the logits [V] each pass gave (float32): AR's passes along that answer."""

    def __init__(self, answer: Sequence[int]):
        self.answer, self.rows = list(answer), []

    def accept(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass) -> Verdict:
        return Verdict([], self.answer[len(self.rows)])

    def learn(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass,
              verdict: Verdict, kept: list[int], room: int) -> Learned:
        self.rows.append(verified.logits[0])
        return Learned()


def replay(model: PreTrainedModel, input_ids: torch.Tensor, answer: Sequence[int],
           passes: CompiledPass | None = None) -> torch.Tensor:
    """[len(answer), V] float32: the logits AR's passes give for answer positions 0.. after the
    prompt `input_ids` [1, L], fed `answer` (not their own choices): `generate`'s loop, cache and
    pass (the compiled static one with `passes`, as `generate` takes it), EOS ignored."""
    replayed = Replay(answer)
    for _ in decode(model, input_ids, replayed, method="ar", max_new_tokens=len(answer), sampling=GREEDY,
                    eos_token_ids=(), passes=passes):
        pass
    return torch.stack(replayed.rows)
