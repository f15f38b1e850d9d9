"""The EAGLE draft's training (training/train_eagle.py) on a tiny random Llama: the loss step learns,
the target never changes, the all-starts drafting evaluation equals drafting step by step, and
the draft saves and loads."""

import contextlib

import pytest
import torch
from transformers import DynamicCache

from specdemo.core.static import with_layers
from specdemo.methods.eagle import (
    FeatureDraft,
    init_from_target,
    load_feature_draft,
    save_feature_draft,
)
from training.train_eagle import (
    autocast,
    checksum,
    drafted_features,
    eagle_loss,
    pad_batch,
    summarize,
)

from conftest import make_tiny_model

VOCAB = torch.arange(0, 97, 2)  # the draft proposes the even token ids
TO_SUBSET = torch.full((97,), -100).index_put_((VOCAB,), torch.arange(len(VOCAB)))


def tiny_data(target, lengths=(24, 17, 30), seed=1, layers=()):
    generator = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(0, 97, (n,), generator=generator).tolist() for n in lengths]
    with torch.no_grad():
        features = {i: with_layers(target.model(torch.tensor([s]), output_hidden_states=bool(layers)), layers)[0]
                    for i, s in enumerate(sequences)}
    return {"sequences": sequences, "answer_starts": [6, 4, 9]}, features


def tiny_draft(target, layers=()):
    draft = FeatureDraft(target, VOCAB, layers)
    init_from_target(draft, target)
    return draft


def test_training_steps_lower_the_loss_and_leave_the_target_alone():
    target = make_tiny_model().requires_grad_(False)
    before = checksum(target)
    data, features = tiny_data(target)
    _, layered = tiny_data(target, layers=(1,))
    # EAGLE's loss, with later drafting steps trained too, and reading layer 1 too
    for steps, layers in ((1, ()), (3, ()), (3, (1,))):
        batch = pad_batch(data, layered if layers else features, [0, 1, 2])
        draft = tiny_draft(target, layers).train()
        optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
        torch.manual_seed(0)
        losses = []
        for _ in range(20):
            loss, _, _ = eagle_loss(draft, *batch, TO_SUBSET, w_cls=0.1, noise=0.05, steps=steps)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[-1] < 0.7 * losses[0]
    assert all(p.grad is None for p in target.parameters())
    assert checksum(target) == before


@pytest.mark.parametrize("steps", [1, 3])
def test_a_bfloat16_autocast_step_keeps_float32_weights_and_nearly_float32_gradients(steps):
    """`--autocast bfloat16` makes the matrix products bfloat16, not the draft: its weights and their
    gradients stay float32, the loss and the gradient are float32's within bfloat16 rounding, and
    "none" is float32 exactly."""
    target = make_tiny_model().requires_grad_(False)
    data, features = tiny_data(target)
    batch = pad_batch(data, features, [0, 1, 2])
    draft = tiny_draft(target).train()
    results = {}
    for dtype in ("none", "bfloat16", "float32"):
        torch.manual_seed(0)  # the same input noise
        draft.zero_grad()
        # float32: no autocast at all
        with autocast(dtype, batch[0].device) if dtype != "float32" else contextlib.nullcontext():
            loss, _, _ = eagle_loss(draft, *batch, TO_SUBSET, w_cls=0.1, noise=0.05, steps=steps)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in draft.parameters() if p.grad is not None])
        results[dtype] = (loss.detach(), grads)
    assert all(p.dtype == torch.float32 for p in draft.parameters()) and results["bfloat16"][1].dtype == torch.float32
    assert torch.equal(results["none"][0], results["float32"][0]) \
        and torch.equal(results["none"][1], results["float32"][1])
    torch.testing.assert_close(results["bfloat16"][0], results["float32"][0], rtol=0.05, atol=0.0)
    assert torch.nn.functional.cosine_similarity(results["bfloat16"][1], results["float32"][1], dim=0) > 0.99
    assert not torch.equal(results["bfloat16"][0], results["float32"][0])  # the products did run in bfloat16


def test_loss_on_a_padded_batch_equals_the_loss_of_its_rows():
    target = make_tiny_model()
    data, features = tiny_data(target, lengths=(24, 24, 24))
    data["sequences"][1] = data["sequences"][1][:15]  # right padding in the batch
    features[1] = features[1][:15]
    draft = tiny_draft(target)
    input_ids, _, _, feats = pad_batch(data, features, [0, 1])
    predicted = draft.features(feats[:, :-1], input_ids[:, 1:], cache=None)
    alone = draft.features(features[1][None, :-1], torch.tensor([data["sequences"][1][1:]]), cache=None)
    torch.testing.assert_close(predicted[1, :14], alone[0])


@pytest.mark.parametrize("layers", [(), (1,)])
def test_all_starts_drafting_equals_step_by_step_drafting(layers):
    target = make_tiny_model()
    data, features = tiny_data(target, layers=layers)
    draft = tiny_draft(target, layers).eval()
    with torch.no_grad():  # move off the init so the layer is not the target's
        for p in draft.parameters():
            p.add_(0.05 * torch.randn_like(p))
    input_ids, _, _, feats = pad_batch(data, features, [0, 1, 2])
    depth = 4
    with torch.no_grad():
        drafted = drafted_features(draft, feats, input_ids, depth)  # [D, B, T-1, H]
    for row, n in enumerate(len(s) for s in data["sequences"]):
        f, x = feats[row : row + 1, :n], input_ids[row : row + 1, :n]
        for p in (1, 5, n - 3):
            cache = DynamicCache(config=draft.model.config)
            with torch.no_grad():
                predicted = draft.features(f[:, :p], x[:, 1 : p + 1], cache)[:, -1:]  # f̂_p from the true pairs
                torch.testing.assert_close(predicted[0, 0], drafted[0, row, p - 1], rtol=1e-4, atol=1e-4)
                for d in range(1, depth):
                    if p + d > n - 1:
                        break
                    predicted = draft.features(predicted, x[:, p + d : p + d + 1], cache)  # pair (f̂_{p+d-1}, x_{p+d})
                    torch.testing.assert_close(predicted[0, 0], drafted[d, row, p + d - 1], rtol=1e-4, atol=1e-4)


def test_tokens_per_pass_counts_like_the_token_draft():
    # runs [2, 0, 0, 1, 0]: a pass at 0 accepts 2 and commits 3; at 3 accepts 1 and commits the last 2
    result = summarize([[2, 0, 0, 1, 0]], gammas=(1, 2))
    assert result["tokens_per_pass_gamma2"] == 5 / 2
    assert result["tokens_per_pass_gamma1"] == 5 / 3  # passes at 0 (2 tokens), 2 (1), 3 (2)
    assert result["top1_agreement"] == 2 / 5


@pytest.mark.parametrize("layers", [(), (1,)])
def test_save_and_load_round_trip(tmp_path, layers):
    target = make_tiny_model()
    draft = tiny_draft(target, layers)
    save_feature_draft(draft, tmp_path, {"w_cls": 0.1})
    loaded = load_feature_draft(tmp_path, target)
    assert torch.equal(loaded.vocab, VOCAB) and loaded.layers == layers
    for (name, weight), (loaded_name, loaded_weight) in zip(draft.state_dict().items(), loaded.state_dict().items()):
        assert name == loaded_name
        torch.testing.assert_close(loaded_weight, weight, rtol=1e-3, atol=1e-3)  # float16 on disk


def test_a_draft_that_reads_layers_starts_as_the_draft_without_them():
    """`reduce` starts as [0 ... 0 I]: fine-tuning a trained draft into one that reads layers starts from it."""
    target = make_tiny_model()
    data, features = tiny_data(target)
    _, layered = tiny_data(target, layers=(1,))
    plain, reading = tiny_draft(target), tiny_draft(target, (1,))
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(0.05 * torch.randn_like(p))
    missing, unexpected = reading.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and sorted(missing) == ["norms.0.weight", "reduce.weight"]
    tokens = torch.tensor([data["sequences"][0][1:]])
    with torch.no_grad():
        torch.testing.assert_close(reading.features(layered[0][None, :-1], tokens, cache=None),
                                   plain.features(features[0][None, :-1], tokens, cache=None))
        reading.reduce.weight.add_(0.1 * torch.randn_like(reading.reduce.weight))  # and the layer then matters
        assert not torch.allclose(reading.features(layered[0][None, :-1], tokens, cache=None),
                                  plain.features(features[0][None, :-1], tokens, cache=None), atol=1e-3)
