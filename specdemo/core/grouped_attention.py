"""Attention with the query heads grouped by the key/value head they share.

SmolLM2-135M has 9 query heads and 3 key/value heads (grouped-query attention, Ainslie et al.
2023). With a mask (every verification pass), transformers' SDPA copies the key/value heads to 9
(`repeat_kv`) for a pass of several tokens: every layer of every such pass copies the cached keys
and values, on a CPU and with CUDA alike (a graphed pass's whole buffer). On a CPU, in bfloat16,
torch's flash kernel then pads each head's few queries to a whole block, so it reads each cached
key and value once per query head (docs/history/benchmarks-log.md measures what that costs).
Here the queries that share a key/value head are laid out as rows of one head, [B, H, q, D] ->
[B, H_kv, (H / H_kv) q, D], and the same kernel reads the cache once per key/value head, with no
copy (transformers does this for one token with a mask, `pack_gqa`). Each row is computed as
before, in float32 inside the kernel, so a pass of several tokens gives exactly the values of
transformers' path (`repeat_kv`). (The products are not written out in bfloat16, as
transformers' eager attention does: scores rounded to bfloat16 cost speculative decoding
accepted tokens.)
Everything else goes to transformers' SDPA unchanged: one token in float32 on a CPU (its
`enable_gqa` kernel is faster there) and one token with CUDA (`pack_gqa`), other devices, a
graph being compiled, a pass wider than `grouped_widths` allows (a prompt's), a dropout, another
attention's extras. `use_grouped_attention(model)` selects it by name through transformers'
attention registry (`core.process`): nothing else of the model changes.
"""

import torch
from transformers import PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdemo.core.process import register_attention

NAME = "grouped_sdpa"  # the attention implementation's name in transformers' registries
MAX_QUERIES = 32  # queries a pass may hold to take the grouped path on a CPU; a prompt's pass keeps transformers'
CUDA_MAX_QUERIES = 64  # with CUDA: the widest graphed pass (`static.BUCKETS`)
TILED = "grouped_masks"  # the keyword a pass gives its layers (`per_pass`)


def per_pass(model: torch.nn.Module) -> dict:
    """The keyword arguments one pass of `model` gives its layers' attention where they run this
    one (`use_grouped_attention`; else none): a dict of the pass's own in which they share the
    mask tiled once (`tiled_mask`). A call without it tiles the mask in every layer: the same
    values, more work."""
    config = getattr(model, "config", None)
    return {TILED: {}} if getattr(config, "_attn_implementation", None) == NAME else {}


def grouped_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                              is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query [B, H, q, D], key and value [B, H_kv, k, D], an
    additive or boolean mask [B or 1, 1, q, k] or None; returns [B, q, H, D] and no weights."""
    if not takes_grouped_path(query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    return grouped_attention(query, key, value, attention_mask, query.shape[-1] ** -0.5 if scaling is None else scaling,
                             kwargs.get(TILED)), None


def takes_grouped_path(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, dropout: float,
                       extras: dict) -> bool:
    """A pass of as many tokens as `grouped_widths` allows, outside a compiled graph, with a mask
    shared by the heads (or, for one token, none: it sees the whole cache)."""
    q = query.shape[2]
    return (
        q in grouped_widths(query.device.type, query.dtype)
        and not torch.compiler.is_compiling()
        and dropout == 0.0
        and query.shape[1] % key.shape[1] == 0
        and (mask.shape[1] == 1 if mask is not None else q == 1)
        and not any(extras.get(name) is not None for name in ("position_bias", "softcap", "cache", "sinks", "s_aux"))
    )


def grouped_widths(device_type: str, dtype: torch.dtype) -> range:
    """The passes' widths that take the grouped path: on a CPU 2 to MAX_QUERIES tokens (from one in
    bfloat16 or float16); with CUDA 2 to CUDA_MAX_QUERIES (one token transformers packs itself);
    none elsewhere."""
    if device_type == "cpu":
        return range(1 if dtype in (torch.bfloat16, torch.float16) else 2, MAX_QUERIES + 1)
    return range(2, CUDA_MAX_QUERIES + 1) if device_type == "cuda" else range(0)


def grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                      scale: float, tiled: dict | None = None) -> torch.Tensor:
    """softmax(q k^T scale + mask) v for query [B, H, q, D] and key, value [B, H_kv, k, D], query
    head h reading key/value head h // (H / H_kv); returns [B, q, H, D] (`heads_by_token`). `tiled`:
    the pass's masks tiled so far (`per_pass`)."""
    batch, heads, q, dim = query.shape
    groups = heads // key.shape[1]
    rows = query.reshape(batch, key.shape[1], groups * q, dim)  # row g q + i: query head h_kv groups + g, token i
    if mask is not None:
        mask = tiled_mask(mask, groups, tiled)
    out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=mask, scale=scale)
    return heads_by_token(out, heads, q)


def heads_by_token(out: torch.Tensor, heads: int, q: int) -> torch.Tensor:
    """SDPA's output of the grouped rows, `out` [B, H_kv, groups q, D], as transformers' attention
    returns it: [B, q, H, D], contiguous, in one copy whatever layout the kernel wrote. A CPU's
    kernels write it row by row; CUDA's fused kernels write the key/value heads last and hand a
    transposed view, so that reshaping to [B, H, q, D] first, then transposing, copies twice."""
    batch, dim = out.shape[0], out.shape[-1]
    return out.view(batch, out.shape[1], -1, q, dim).permute(0, 3, 1, 2, 4).reshape(batch, q, heads, dim).contiguous()


def tiled_mask(mask: torch.Tensor, groups: int, tiled: dict | None = None) -> torch.Tensor:
    """`mask` [B or 1, 1, q, k] with row i repeated for every query head of a group: [B or 1, 1,
    groups q, k]. Every layer of a pass gets the same mask: where the pass gives its own dict
    (`tiled`, from `per_pass`), the first layer tiles it and the others take that one. The dict
    holds the mask it was tiled from, so another mask (or grouping) is tiled anew."""
    if tiled is None:
        return mask.repeat(1, 1, groups, 1)
    kept = tiled.get((id(mask), groups))
    if kept is None or kept[0] is not mask:
        kept = tiled[(id(mask), groups)] = (mask, mask.repeat(1, 1, groups, 1))
    return kept[1]


def use_grouped_attention(module: torch.nn.Module) -> int:
    """Have every transformers model in `module` (itself included) that runs SDPA run
    `grouped_attention_forward` instead (the passes it does not take go to SDPA as before);
    returns how many it switched (a model and its inner decoder share one switch). The name is
    registered with transformers first (`process.register_attention`)."""
    register_attention(NAME, grouped_attention_forward)
    switched = 0
    for model in module.modules():
        if isinstance(model, PreTrainedModel) and model.config._attn_implementation == "sdpa":
            model.set_attn_implementation(NAME)
            switched += 1
    return switched
