"""Autoregressive decoding, the baseline: one target forward pass per token.

Greedy (argmax) or sampled (repetition penalty, temperature, top-k, top-p; seeded), with the KV
cache reused between passes: the decoding loop (`loop.decode`) with a proposer of nothing.
Yields one StepEvent per pass, then a Summary.
"""

import threading
from collections.abc import Iterable, Iterator

import torch
from transformers import PreTrainedModel

from specdemo.core.events import StepEvent, Summary
from specdemo.core.loop import Proposer, decode
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.core.static import CompiledPass


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
    return decode(model, input_ids, Proposer(), method="ar", max_new_tokens=max_new_tokens, sampling=sampling, eos_token_ids=eos_token_ids, stop=stop,
                  passes=passes)
