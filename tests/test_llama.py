"""The written-out Llama pass (`core/llama.py`) against transformers' decoder: the same values in fewer operations."""

from collections import Counter

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from specdemo.core import llama
from specdemo.core.attention import additive
from specdemo.core.grouped_attention import per_pass, use_grouped_attention
from specdemo.core.kvcache import StaticKV

# views, and casts (none in float32): no kernel of a pass's own
NOT_KERNELS = frozenset({"to", "alias", "as_strided", "chunk", "detach", "expand", "permute", "select", "slice",
                         "split", "split_with_sizes", "squeeze", "t", "transpose", "unsqueeze", "view", "_unsafe_view",
                         "reshape", "_reshape_alias"})


def tiny(dtype=torch.float32, grouped=False, **config) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                         **config))
    with torch.no_grad():  # norms' weights other than ones, so that their product counts
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.5 * torch.randn_like(parameter))
    if grouped:
        use_grouped_attention(model)
    return model.to(dtype).eval()


def layout(cached: int, width: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and the additive mask of a pass of `width` branching tokens after `cached` ones:
    token i sees the prefix, itself and token i // 2 (a tree), nothing past the pass."""
    sees = torch.eye(width, dtype=torch.bool)
    for node in range(1, width):
        sees[node] |= sees[node // 2]
    allowed = torch.zeros(width, capacity, dtype=torch.bool)
    allowed[:, :cached] = True
    allowed[:, cached : cached + width] = sees
    return (cached + sees.sum(-1) - 1)[None], allowed


def both(model, width: int, cached: int = 0, hidden_states: bool = False):
    """transformers' decoder and `llama.decoder_pass` over one pass after the same `cached` tokens,
    each over a cache of its own: (outputs, caches)."""
    decoder, capacity, device = model.model, 32, model.device
    prefix = torch.randint(0, 97, (1, cached), device=device)
    fed = torch.randint(0, 97, (1, width), device=device)
    positions, allowed = layout(cached, width, capacity)
    positions, mask = positions.to(device), additive(allowed.to(device), model.dtype)
    outs, caches = [], []
    with torch.inference_mode():
        for run in ("transformers", "written out"):
            cache = StaticKV(model, capacity)
            if cached:  # the prefix written by transformers' pass, the same for both
                cache.start.fill_(0)
                prefix_mask = additive(torch.ones(cached, capacity, dtype=torch.bool, device=device).tril(),
                                       model.dtype)
                decoder(input_ids=prefix, attention_mask=prefix_mask,
                        position_ids=torch.arange(cached, device=device)[None], past_key_values=cache, use_cache=True)
            cache.start.fill_(cached)
            if run == "transformers":
                out = decoder(input_ids=fed, attention_mask=mask, position_ids=positions, past_key_values=cache,
                              use_cache=True, output_hidden_states=hidden_states, **per_pass(decoder))
            else:
                slots = torch.arange(cached, cached + width, device=device)
                out = llama.decoder_pass(decoder, cache, fed, positions, slots, mask, hidden_states,
                                         **per_pass(decoder))
            outs.append(out)
            caches.append(cache)
    return outs, caches


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("width", [1, 6])
@pytest.mark.parametrize("cached", [0, 5])
def test_float32_pass_equals_transformers_decoder_exactly(grouped, width, cached):
    model = tiny(grouped=grouped)
    assert llama.writes_out(model.model)
    (ours, theirs), (our_cache, their_cache) = both(model, width, cached, hidden_states=True)
    assert torch.equal(ours.last_hidden_state, theirs.last_hidden_state)
    assert len(ours.hidden_states) == len(theirs.hidden_states) == 4
    assert all(torch.equal(a, b) for a, b in zip(ours.hidden_states, theirs.hidden_states))
    assert torch.equal(our_cache.buffer, their_cache.buffer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotary_table_holds_the_values_a_pass_would_compute(dtype):
    """A pass reads its positions' rows of the table made with the cache: exactly what the rotary
    embedding computes for them (the cosine, and the sine with its first half negated)."""
    decoder = tiny(dtype).model
    table = llama.rotary_table(decoder, 32)
    positions = torch.tensor([[3, 17, 17, 31, 0]])
    with_table = llama.rotary_rows(decoder, StaticKV(decoder, 32, rotary=table), positions, table)
    computed = llama.rotary_rows(decoder, StaticKV(decoder, 32), positions, table)
    assert table.shape == (32, 2, 16) and table.dtype == dtype
    assert all(torch.equal(a, b) for a, b in zip(with_table, computed))
    assert with_table[0].shape == (1, 1, 5, 16)


def test_only_a_decoder_the_pass_writes_out_gets_a_rotary_table():
    assert llama.rotary_table(tiny(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
                              .model, 32) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_pass_agrees_with_transformers_decoder(dtype):
    """With CUDA an RMSNorm is one fused kernel, whose sum runs in another order: close, not equal."""
    (ours, theirs), (our_cache, their_cache) = both(tiny(dtype, grouped=True).cuda(), 6, 5)
    assert torch.allclose(ours.last_hidden_state.float(), theirs.last_hidden_state.float(), rtol=0.05, atol=0.05)
    assert torch.allclose(our_cache.buffer.float(), their_cache.buffer.float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("width", [1, 6])
def test_joined_products_give_the_same_pass_in_fewer_products(grouped, width):
    """With each layer's queries, keys and values one product and its gate and up another
    (`llama.joined_weights`, what CUDA graphs capture) the pass is the same, bit for bit on a CPU in
    float32, in 4 products a layer instead of 7."""
    model = tiny(grouped=grouped)
    decoder = model.model
    joined = llama.joined_weights(decoder, 1 << 30)
    assert len(joined) == 3 and joined[0].qkv.shape == (64 + 2 * 32, 64) and joined[0].gate_up.shape == (2 * 96, 64)
    positions, allowed = layout(5, width, 32)
    mask, slots = additive(allowed, torch.float32), torch.arange(5, 5 + width)
    fed = torch.randint(0, 97, (1, width))
    outs, counts = [], []
    for weights in (None, joined):
        cache = StaticKV(model, 32)
        torch.manual_seed(1)
        cache.buffer.normal_()  # the same stale cache for both: the prefix, and what the mask keeps out
        with Operations() as operations, torch.inference_mode():
            outs.append((llama.decoder_pass(decoder, cache, fed, positions, slots, mask, True, weights,
                                            **per_pass(decoder)), cache.buffer))
        counts.append(operations.kinds["linear"])
    (plain, plain_buffer), (ours, our_buffer) = outs
    assert torch.equal(ours.last_hidden_state, plain.last_hidden_state) and torch.equal(our_buffer, plain_buffer)
    assert all(torch.equal(a, b) for a, b in zip(ours.hidden_states, plain.hidden_states))
    assert counts == [7 * 3, 4 * 3]


def test_a_decoder_joins_its_products_only_with_room_for_the_copy_and_no_hooked_projection():
    decoder = tiny().model
    assert llama.joined_weights(decoder, 1000) is None
    add_hook_to_module(decoder.layers[1].mlp.up_proj, ModelHook())  # accelerate moves its weights in on a call
    assert llama.joined_weights(decoder, 1 << 30) is None
    dynamic = tiny(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}).model
    assert llama.joined_weights(dynamic, 1 << 30) is None  # a decoder the pass does not write out


def test_bfloat16_pass_differs_from_transformers_only_by_rounding():
    (ours, theirs), _ = both(tiny(torch.bfloat16, grouped=True), 6, 5)
    assert torch.allclose(ours.last_hidden_state.float(), theirs.last_hidden_state.float(), rtol=0.05, atol=0.05)


def test_a_feature_draft_decoder_fed_embeddings_without_a_final_norm():
    """A feature draft's decoder (`eagle.FeatureDraft`): one layer, no norm after it, fed embeddings."""
    model = tiny()
    decoder = model.model
    decoder.norm = torch.nn.Identity()
    embedded = torch.randn(1, 4, 64)
    positions, allowed = layout(0, 4, 16)
    mask = additive(allowed, torch.float32)
    with torch.inference_mode():
        outs = [decoder(inputs_embeds=embedded, attention_mask=mask, position_ids=positions,
                        past_key_values=StaticKV(model, 16), use_cache=True).last_hidden_state,
                llama.decoder_pass(decoder, StaticKV(model, 16), embedded, positions, torch.arange(4),
                                   mask).last_hidden_state]
    assert torch.equal(*outs)


def test_decoders_it_does_not_cover_run_transformers_forward():
    assert not llama.writes_out(tiny(attention_bias=True).model)
    assert not llama.writes_out(tiny(mlp_bias=True).model)
    assert not llama.writes_out(tiny(hidden_act="gelu").model)
    assert not llama.writes_out(tiny(attn_implementation="flex_attention").model)
    hooked = tiny()
    add_hook_to_module(hooked.model.layers[1].input_layernorm, ModelHook())  # accelerate moves weights on a call
    assert not llama.writes_out(hooked.model)


class Operations(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kinds = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in NOT_KERNELS:
            self.kinds[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_layer_costs_fewer_operations_than_transformers(dtype):
    """On a GPU each operation that is not a view is a kernel of a graphed pass: a layer written out
    runs 7 products, 2 norms, the rotation of queries and keys together (a join, a roll, two
    products, a sum), 2 writes to the cache, the attention, SiLU, the gate's product and 2 residual
    sums: 21, where transformers' layer runs over half as many again, casts not counted (its norms
    square, reduce and scale in separate steps, its rotary embedding rotates queries and keys apart).
    Besides the layers the pass runs the embedding, one read of the rotary table, the grouped
    attention's mask tiled once (`grouped_attention.per_pass`) and the final norm."""
    model = tiny(dtype, grouped=True)
    counts = []
    for run in range(2):
        decoder = model.model
        cache = StaticKV(model, 16, rotary=llama.rotary_table(decoder, 16))
        positions, allowed = layout(0, 1, 16)
        mask, slots, fed = additive(allowed, dtype), torch.arange(1), torch.zeros(1, 1, dtype=torch.long)
        with Operations() as operations, torch.inference_mode():
            if run:
                llama.decoder_pass(decoder, cache, fed, positions, slots, mask, **per_pass(decoder))
            else:
                decoder(input_ids=fed, attention_mask=mask, position_ids=positions,
                        past_key_values=cache, use_cache=True, **per_pass(decoder))
        counts.append(operations.kinds)
    theirs, ours = counts
    layers = model.config.num_hidden_layers
    assert ours["rms_norm"] == 2 * layers + 1 and ours["roll"] == layers and ours["linear"] == 7 * layers
    assert ours["index"] == 1 and sum(ours.values()) <= 21 * layers + 4
    assert ours["cos"] == ours["sin"] == 0
    assert sum(theirs.values()) >= 1.6 * sum(ours.values())


class Copies(TorchDispatchMode):
    """Counts the reshapes that copy (the input's layout allowed no view)."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ == "reshape" and out.data_ptr() != args[0].data_ptr():
            self.copies += 1
        return out


def test_grouped_attention_reads_a_group_of_queries_without_a_copy():
    """The rotated queries lie head by head in memory, so the heads sharing a key/value head are
    rows of one tensor as they are: transformers' layout made grouped attention copy them in every
    layer of a pass of several tokens."""
    model = tiny(grouped=True)
    decoder = model.model
    cache = StaticKV(model, 16)
    positions, allowed = layout(0, 6, 16)
    mask = additive(allowed, torch.float32)
    with Copies() as copies, torch.inference_mode():
        llama.decoder_pass(decoder, cache, torch.zeros(1, 6, dtype=torch.long), positions, torch.arange(6), mask,
                           **per_pass(decoder))
    assert copies.copies == 0
