"""A companion (Medusa's heads, a feature draft) computes with its parameters and buffers alone,
so `.to()` moves all of it: a tensor kept as a plain attribute would stay behind, and on a GPU its
use would copy it from the host every call, a copy a CUDA graph's capture refuses."""

import pytest
import torch

from test_eagle import feature_draft
from test_medusa import random_heads

VOCAB = torch.arange(0, 97, 2)  # a proposal vocabulary: the tiny model's even ids


def stray_tensors(module: torch.nn.Module) -> list[str]:
    """Tensors held by `module` or a submodule outside its parameters and buffers."""
    return [f"{name or type(module).__name__}.{key}" for name, part in module.named_modules()
            for key, value in vars(part).items() if isinstance(value, torch.Tensor)]


@pytest.mark.parametrize("make", [lambda model: random_heads(model, vocab=VOCAB),
                                  lambda model: feature_draft(model, vocab=VOCAB)],
                         ids=["medusa heads", "feature draft"])
def test_every_tensor_of_a_companion_moves_with_it(tiny_model, make):
    companion = make(tiny_model)
    assert not stray_tensors(companion)
    moved = companion.to("meta")
    assert moved.vocab.device.type == "meta" and moved.token_ids(torch.tensor([1], device="meta")).device.type == "meta"
