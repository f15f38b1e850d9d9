"""Grouped attention (`core.grouped_attention`): the query heads that share a key/value head read
the cache as rows of one head, with the values of transformers' SDPA path."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdemo import final_summary
from specdemo.core import grouped_attention
from specdemo.core.attention import additive, additive_mask, sees_from_parents
from specdemo.core.static import compile_passes
from specdemo.core.verify import Proposal, target_pass
from specdemo.methods import ar
from tests.conftest import make_tiny_model


class Attention(torch.nn.Module):
    """What transformers' attention functions read of their module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal, self.training = groups, True, False


def inputs(dtype, batch: int, heads: int, kv_heads: int, queries: int, cached: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, queries, 16, generator=generator).to(dtype)
    key, value = (torch.randn(batch, kv_heads, cached + queries, 16, generator=generator).to(dtype) for _ in range(2))
    return query, key, value


def tree_mask(queries: int, cached: int, dtype, batch: int = 1, boolean: bool = False) -> torch.Tensor:
    """A draft tree's mask after `cached` positions (each node its parent the one two before it), or
    for a batch a left-padded one: row b cannot see its first b positions."""
    sees = sees_from_parents([i - 2 if i >= 2 else -1 for i in range(queries)])
    mask = additive_mask(sees, cached, torch.float32).repeat(batch, 1, 1, 1)
    for row in range(batch):
        mask[row, :, :, :row] = torch.finfo(torch.float32).min
    return (mask == 0) if boolean else mask.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kv_heads", [(6, 2), (4, 4)])
@pytest.mark.parametrize("queries, batch, boolean",
                         [(1, 1, False), (5, 1, False), (13, 1, False), (13, 2, False), (5, 2, True), (1, 2, True)])
def test_grouped_rows_give_sdpa_values(dtype, heads, kv_heads, queries, batch, boolean):
    query, key, value = inputs(dtype, batch, heads, kv_heads, queries, cached=40)
    mask = tree_mask(queries, 40, dtype, batch, boolean)
    module = Attention(heads // kv_heads)
    # one token in float32 keeps transformers' kernel (faster there); the same call then runs it
    assert grouped_attention.takes_grouped_path(query, key, mask, 0.0, {}) == (queries > 1 or dtype != torch.float32)
    got, _ = grouped_attention.grouped_attention_forward(module, query, key, value, mask)
    want, _ = sdpa_attention_forward(module, query, key, value, mask)
    assert got.shape == want.shape == (batch, queries, heads, 16)
    torch.testing.assert_close(got, want)


def test_one_token_without_a_mask_sees_the_whole_cache():
    query, key, value = inputs(torch.bfloat16, 1, 6, 2, 1, cached=40)
    module = Attention(3)
    got, _ = grouped_attention.grouped_attention_forward(module, query, key, value, None)
    reference = torch.softmax(query.float() @ key.float().repeat_interleave(3, dim=1).transpose(-1, -2) / 4,
                              dim=-1) @ value.float().repeat_interleave(3, dim=1)
    torch.testing.assert_close(got.float(), reference.transpose(1, 2), atol=2e-2, rtol=2e-2)


def test_what_keeps_transformers_path():
    small = inputs(torch.bfloat16, 1, 6, 2, 4, cached=40)
    mask = tree_mask(4, 40, torch.bfloat16)
    assert grouped_attention.takes_grouped_path(small[0], small[1], mask, 0.0, {})
    one_float32 = inputs(torch.float32, 1, 6, 2, 1, cached=40)
    # transformers' kernel is faster there
    assert not grouped_attention.takes_grouped_path(one_float32[0], one_float32[1], None, 0.0, {})
    prompt = inputs(torch.bfloat16, 1, 6, 2, grouped_attention.MAX_QUERIES + 1, cached=0)
    assert not grouped_attention.takes_grouped_path(prompt[0], prompt[1], None, 0.0, {})
    # several tokens need their causal mask
    assert not grouped_attention.takes_grouped_path(small[0], small[1], None, 0.0, {})
    # a device other than a CPU or CUDA
    assert not grouped_attention.takes_grouped_path(*(t.to("meta") for t in small[:2]), mask.to("meta"), 0.0, {})
    # a mask per head
    assert not grouped_attention.takes_grouped_path(small[0], small[1], mask.repeat(1, 6, 1, 1), 0.0, {})
    assert not grouped_attention.takes_grouped_path(small[0], small[1], mask, 0.1, {})
    assert not grouped_attention.takes_grouped_path(small[0], small[1], mask, 0.0, {"sinks": torch.zeros(6)})


def test_every_graphed_width_but_one_takes_the_grouped_path_with_cuda():
    """With CUDA, `repeat_kv` would copy a graph's whole buffer in every layer of a wide pass; one
    token transformers packs by key/value head itself. On a CPU prompts keep transformers' path."""
    from specdemo.core.static import BUCKETS

    cuda = grouped_attention.grouped_widths("cuda", torch.bfloat16)
    assert [width for width in BUCKETS if width in cuda] == [width for width in BUCKETS if width > 1]
    assert grouped_attention.grouped_widths("cuda", torch.float32) == cuda
    assert grouped_attention.grouped_widths("cpu", torch.bfloat16) == range(1, grouped_attention.MAX_QUERIES + 1)
    assert grouped_attention.grouped_widths("cpu", torch.float32) == range(2, grouped_attention.MAX_QUERIES + 1)
    assert not grouped_attention.grouped_widths("mps", torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_verifies_a_tree_with_the_same_logits_either_way(dtype):
    """The tiny model (4 query heads, 2 key/value heads) through `verify.target_pass`: a tree's
    pass and an AR pass give the logits of transformers' SDPA."""
    plain = make_tiny_model().to(dtype)
    grouped = copy.deepcopy(plain)
    assert grouped_attention.use_grouped_attention(grouped) == 1
    assert grouped.config._attn_implementation == grouped_attention.NAME and plain.config._attn_implementation == "sdpa"
    assert grouped_attention.use_grouped_attention(grouped) == 0  # already switched
    sequence = torch.tensor([[5, 17, 42, 8, 63, 21, 9, 30]])
    tree = Proposal((3, 4, 5, 6, 7), (-1, -1, 0, 0, 2), ("draft",) * 5)
    with torch.inference_mode():
        for proposal in (tree, Proposal((), (), ())):
            caches = DynamicCache(config=plain.config), DynamicCache(config=grouped.config)
            for model, cache in zip((plain, grouped), caches):
                model(sequence[:, :-1], past_key_values=cache, use_cache=True)
            want, got = (target_pass(model, cache, sequence, proposal)
                         for model, cache in zip((plain, grouped), caches))
            torch.testing.assert_close(got.logits, want.logits)


def test_a_grouped_model_compiles_and_keeps_ars_answer(prompt_ids):
    """`--compile` on a CPU compiles the loaded model, which runs grouped attention eagerly: inside
    a graph the attention is transformers' SDPA, and the answer is the eager one."""
    model = make_tiny_model()
    grouped_attention.use_grouped_attention(model)
    eager = final_summary(ar.generate(model, prompt_ids, max_new_tokens=12, eos_token_ids=())).tokens
    passes = compile_passes(model, buckets=(1, 8))
    assert passes.failed is None
    assert final_summary(ar.generate(model, prompt_ids, max_new_tokens=12, eos_token_ids=(),
                                     passes=passes)).tokens == eager
    assert passes.runs[1] == 11 and passes.runs[8] == 1  # the prompt's pass and every step ran a graph


def test_a_pass_tiles_its_mask_once():
    """Every layer of a pass gets the same mask: with the pass's own dict (`per_pass`) it is tiled
    for the grouped rows once, and again only for another mask or grouping; without one every
    layer tiles it, to the same values."""
    with torch.inference_mode():
        mask, other = tree_mask(5, 40, torch.bfloat16), tree_mask(5, 40, torch.bfloat16)
        tiled = {}
        first = grouped_attention.tiled_mask(mask, 3, tiled)
        assert grouped_attention.tiled_mask(mask, 3, tiled) is first
        torch.testing.assert_close(first, mask.repeat(1, 1, 3, 1), rtol=0, atol=0)
        assert grouped_attention.tiled_mask(mask, 2, tiled).shape == (1, 1, 10, 45)
        assert grouped_attention.tiled_mask(other, 3, tiled) is not first
        alone = grouped_attention.tiled_mask(mask, 3)
        assert alone is not first and torch.equal(alone, first)


def test_the_layers_of_a_pass_share_one_tiled_mask(prompt_ids):
    """A pass's dict reaches every layer's attention through transformers: its layers tile their
    mask once between them, and the answer is the one without the dict."""
    model = make_tiny_model()
    grouped_attention.use_grouped_attention(model)
    fed = prompt_ids[:, :6]
    sees = torch.ones(6, 6, dtype=torch.bool).tril()
    mask = additive(sees, model.dtype)
    extras = grouped_attention.per_pass(model)
    with torch.inference_mode():
        shared = model(fed, attention_mask=mask, **extras).logits
        alone = model(fed, attention_mask=mask).logits
    assert len(extras[grouped_attention.TILED]) == 1 and torch.equal(shared, alone)
    # a model that runs another attention, or any module without a config, is given nothing
    assert grouped_attention.per_pass(make_tiny_model()) == {}
    assert grouped_attention.per_pass(torch.nn.Linear(2, 2)) == {}


class Copies(TorchDispatchMode):
    """Counts the operations that copy a tensor's data (a clone, a `copy_`)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ in ("clone", "copy_", "_to_copy")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kernels_layout", ["rows", "heads last"])
def test_the_heads_come_out_token_by_token_in_one_copy(kernels_layout):
    """SDPA's output of the grouped rows becomes transformers' [B, q, H, D] in one copy, whether the
    kernel wrote it row by row (a CPU's) or with the key/value heads last and handed a transposed
    view (CUDA's fused kernels): reshaping to [B, H, q, D] first and transposing after copies twice there."""
    batch, kv_heads, groups, queries, dim = 2, 3, 3, 5, 16
    generator = torch.Generator().manual_seed(0)
    written = torch.randn(batch, kv_heads, groups * queries, dim, generator=generator)
    out = written if kernels_layout == "rows" else written.transpose(1, 2).contiguous().transpose(1, 2)
    want = written.reshape(batch, kv_heads * groups, queries, dim).transpose(1, 2)
    with Copies() as copies:
        got = grouped_attention.heads_by_token(out, kv_heads * groups, queries)
    assert copies.count == 1
    assert got.is_contiguous() and torch.equal(got, want)
