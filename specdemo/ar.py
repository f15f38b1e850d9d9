"""Autoregressive decoding, the baseline: one target forward pass per token.

Greedy (argmax) or sampled (repetition penalty, temperature, top-k, top-p; seeded), with
the KV cache reused between passes. Yields one StepEvent per pass, then a Summary.
"""

import threading
from collections.abc import Iterable, Iterator

import torch
from transformers import DynamicCache, PreTrainedModel

from .errors import check_request
from .events import StepEvent, Summary
from .models import eos_token_ids as model_eos_token_ids
from .recorder import StepRecorder
from .sampling import GREEDY, SamplingConfig, TokenChooser


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after the prompt `input_ids` [1, L], one token per target pass."""
    check_request(input_ids, max_new_tokens, getattr(model.config, "max_position_embeddings", None))
    eos = model_eos_token_ids(model) if eos_token_ids is None else tuple(eos_token_ids)
    recorder = StepRecorder("ar", max_new_tokens, eos, stop)
    choose = TokenChooser(sampling, input_ids.device)
    cache = DynamicCache(config=model.config)
    sequence = input_ids  # [1, L + tokens so far]: the repetition penalty reads it
    pending = input_ids  # tokens the cache has not seen yet: the whole prompt, then one token
    while not recorder.done:
        logits = model(pending, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # [1, V]
        token = choose(sequence, logits)  # [1, 1]
        sequence = torch.cat([sequence, token], dim=-1)
        pending = token
        yield recorder.step(committed=token[0].tolist())
    yield recorder.summary()
