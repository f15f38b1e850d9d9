"""Prepacked linear layers (`core.prepack`): the same products as `nn.Linear`, through oneDNN's
blocked weights: float32 wherever torch has oneDNN, bfloat16 where a CPU multiplies it natively."""

import copy

import pytest
import torch
from torch import nn

from specdemo.core import prepack

DTYPES = [
    pytest.param(torch.float32,
                 marks=pytest.mark.skipif(torch.float32 not in prepack.packed_dtypes(), reason="no oneDNN")),
    pytest.param(torch.bfloat16,
                 marks=pytest.mark.skipif(torch.bfloat16 not in prepack.packed_dtypes(), reason="no native bfloat16")),
]


def layers(dtype: torch.dtype) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.SiLU(), nn.Linear(96, 32, bias=False)).to(dtype).eval()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_packed_layers_give_the_plain_products(dtype, rows):
    """bfloat16: the very same values (the plain product runs oneDNN's kernel too); float32 (the
    plain product is MKL's) within rounding."""
    plain, packed = layers(dtype), layers(dtype)
    assert prepack.prepack(packed) == 2
    # swapped in the open
    assert [type(layer) for layer in packed] == [prepack.PackedLinear, nn.SiLU, prepack.PackedLinear]
    assert packed[0].weight is not plain[0].weight and packed[2].bias is None
    x = torch.randn(1, rows, 64, dtype=dtype)
    with torch.inference_mode():
        if dtype == torch.bfloat16:
            assert torch.equal(packed(x), plain(x))
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-6)
    # the packed path ran, each layer holding its own weight's layout
    assert all(layer.packed.layout is not None for layer in packed if isinstance(layer, nn.Linear))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_weight_changed_in_place_is_packed_again(dtype):
    plain, packed = layers(dtype), layers(dtype)
    prepack.prepack(packed)
    x = torch.randn(1, 3, 64, dtype=dtype)
    with torch.inference_mode():
        packed(x)
    with torch.no_grad():
        for model in (plain, packed):
            model[0].weight.mul_(-0.5)  # as merged adapters or load_state_dict change it
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_copy_follows_its_own_weights(dtype):
    packed = layers(dtype)
    prepack.prepack(packed)
    x = torch.randn(1, 2, 64, dtype=dtype)
    with torch.inference_mode():
        before = packed(x)
    twin = copy.deepcopy(packed)
    with torch.no_grad():
        twin[2].weight.zero_()
    with torch.inference_mode():
        assert torch.equal(packed(x), before)
        assert not twin(x).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_training_goes_through_the_plain_product(dtype):
    packed = layers(dtype)
    prepack.prepack(packed)
    x = torch.randn(1, 4, 64, dtype=dtype)
    packed(x).float().sum().backward()
    assert packed[0].weight.grad is not None and packed[0].weight.grad.abs().sum() > 0
    assert not any(layer.packed.layout is not None for layer in packed if isinstance(layer, nn.Linear))


@pytest.mark.parametrize("dtype", DTYPES)
def test_weights_made_in_inference_mode_take_the_plain_path(dtype):
    """Their changes in place leave no version to see, so a packed copy could go stale unseen."""
    with torch.inference_mode():
        model = layers(dtype)
        prepack.prepack(model)
        x = torch.randn(1, 3, 64, dtype=dtype)
        model(x)
        model[0].weight.mul_(-0.5)
        assert torch.equal(model(x), model[2](model[1](nn.functional.linear(x, model[0].weight, model[0].bias))))
    assert [type(layer) for layer in model] == [nn.Linear, nn.SiLU, nn.Linear]  # left as they were


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_weight_that_is_no_layers_gives_the_plain_product(dtype):
    """`linear(x, rows, packed=...)`: the rows of an LM head that a draft proposes from, a tensor of
    no layer, multiplied through the layout their holder keeps beside them (bfloat16: the very same
    values), packed again once changed in place; with gradients on, or without a layout to keep, the
    plain product."""
    torch.manual_seed(0)
    rows, x = torch.randn(300, 64, dtype=dtype), torch.randn(4, 64, dtype=dtype)
    packed = prepack.Packed()
    with torch.inference_mode():
        if dtype == torch.bfloat16:
            assert torch.equal(prepack.linear(x, rows, packed=packed), nn.functional.linear(x, rows))
        torch.testing.assert_close(prepack.linear(x, rows, packed=packed), nn.functional.linear(x, rows),
                                   rtol=1e-5, atol=1e-5)
        assert torch.equal(prepack.linear(x, rows), nn.functional.linear(x, rows))
    assert packed.layout is not None
    first = packed.layout
    with torch.no_grad():
        rows.mul_(-1)
    with torch.inference_mode():
        torch.testing.assert_close(prepack.linear(x, rows, packed=packed), nn.functional.linear(x, rows),
                                   rtol=1e-5, atol=1e-5)
    assert packed.layout is not first
    trained, kept = rows.clone().requires_grad_(), prepack.Packed()
    prepack.linear(x, trained, packed=kept).float().sum().backward()
    assert trained.grad is not None and kept.layout is None


def test_other_dtypes_stay_as_they_are():
    model = layers(torch.float64)
    assert prepack.prepack(model) == 0
    assert all("forward" not in layer.__dict__ for layer in model)


def test_bfloat16_is_left_alone_without_native_bfloat16(monkeypatch):
    monkeypatch.setattr(prepack, "cpu_multiplies_bfloat16", lambda: False)
    prepack.packed_dtypes.cache_clear()
    try:
        assert torch.bfloat16 not in prepack.packed_dtypes()
        model = layers(torch.bfloat16)
        assert prepack.prepack(model) == 0
        assert all("forward" not in layer.__dict__ for layer in model)
    finally:
        prepack.packed_dtypes.cache_clear()
