"""Prepacked linear layers (`core.prepack`): the same products as `nn.Linear`, through oneDNN's
blocked weights, only where a CPU multiplies bfloat16 natively."""

import copy

import pytest
import torch
from torch import nn

from specdemo.core import prepack

native = pytest.mark.skipif(not prepack.cpu_multiplies_bfloat16(), reason="this CPU does not multiply bfloat16 natively")


def layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.SiLU(), nn.Linear(96, 32, bias=False)).to(torch.bfloat16).eval()


@native
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_packed_layers_give_the_plain_products(rows):
    plain, packed = layers(), layers()
    assert prepack.prepack(packed) == 2
    x = torch.randn(1, rows, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(packed(x), plain(x))
    assert all(layer in prepack._PACKED for layer in packed if isinstance(layer, nn.Linear))  # the packed path ran


@native
def test_a_weight_changed_in_place_is_packed_again():
    plain, packed = layers(), layers()
    prepack.prepack(packed)
    x = torch.randn(1, 3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        packed(x)
    with torch.no_grad():
        for model in (plain, packed):
            model[0].weight.mul_(-0.5)  # as merged adapters or load_state_dict change it
    with torch.inference_mode():
        assert torch.equal(packed(x), plain(x))


@native
def test_a_copy_follows_its_own_weights():
    packed = layers()
    prepack.prepack(packed)
    x = torch.randn(1, 2, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        before = packed(x)
    twin = copy.deepcopy(packed)
    with torch.no_grad():
        twin[2].weight.zero_()
    with torch.inference_mode():
        assert torch.equal(packed(x), before)
        assert not twin(x).any()


@native
def test_training_goes_through_the_plain_product():
    packed = layers()
    prepack.prepack(packed)
    x = torch.randn(1, 4, 64, dtype=torch.bfloat16)
    packed(x).float().sum().backward()
    assert packed[0].weight.grad is not None and packed[0].weight.grad.abs().sum() > 0


def test_float32_layers_stay_as_they_are():
    model = layers().float()
    assert prepack.prepack(model) == 0
    assert all("forward" not in layer.__dict__ for layer in model)


def test_nothing_is_packed_without_native_bfloat16(monkeypatch):
    monkeypatch.setattr(prepack, "cpu_multiplies_bfloat16", lambda: False)
    model = layers()
    assert prepack.prepack(model) == 0
    assert all("forward" not in layer.__dict__ for layer in model)


@native
def test_weights_made_in_inference_mode_take_the_plain_path():
    """Their changes in place leave no version to see, so a packed copy could go stale unseen."""
    with torch.inference_mode():
        model = layers()
        prepack.prepack(model)
        x = torch.randn(1, 3, 64, dtype=torch.bfloat16)
        model(x)
        model[0].weight.mul_(-0.5)
        assert torch.equal(model(x), model[2](model[1](nn.functional.linear(x, model[0].weight, model[0].bias))))
    assert not any(layer in prepack._PACKED for layer in model)
