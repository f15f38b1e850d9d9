"""A Llama decoder's static pass written out: the products of transformers' `LlamaModel` in fewer kernels.

On a GPU a small model's graphed pass costs what its kernels do, a few microseconds each whatever
they compute, and transformers' decoder layer spends most of its kernels on small element-wise
work: an RMSNorm is seven operations (two casts, square, mean, add, reciprocal root, two
products), the rotary embedding five for the queries and five for the keys, the cache write
computes its positions again in every layer. Here one layer is
- each RMSNorm one call (`F.rms_norm`, one kernel with CUDA);
- the queries and keys rotated together, as one tensor [1, H + H_kv, w, D] laid out head by head
  (so grouped attention reads a group's queries without copying them), by a roll and a sine
  whose sign is folded in (`rotate`); the pass reads its positions' cosine and sine from a table
  made with the cache (`rotary_table`), one kernel where transformers' embedding takes nine;
- the keys and values written at the slots the pass is given (`kvcache.SlotLayer.write`);
- the model's own attention (the registered implementation its config names: `grouped_attention`
  or SDPA), its own products (prepacked ones on a CPU) and its own MLP module.
On a CPU in float32 the values are transformers' exactly (the same operations in the same order);
with CUDA the norm's one kernel sums in an order of its own, and in bfloat16 an RMSNorm rounds once
where transformers' rounds its normalised input before the weight. `writes_out(decoder)` says
whether a decoder is one this covers (a `LlamaModel` without biases, rotary embeddings fixed at
load, an attention that reads an additive mask, no accelerate hooks); every other one runs
transformers' forward (`static.static_forward`).
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import LlamaModel
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRMSNorm, eager_attention_forward

from specdemo.core.grouped_attention import NAME as GROUPED
from specdemo.core.kvcache import StaticKV

FIXED_ROPE = ("default", "linear", "llama3", "yarn")  # rotary types whose frequencies never change after loading
ATTENTIONS = ("sdpa", "eager", GROUPED)  # attention implementations that take the pass's additive mask as it is


def writes_out(decoder: torch.nn.Module) -> bool:
    """Whether `decoder_pass` runs `decoder`: a `LlamaModel` whose projections have no bias, with
    SiLU, rotary frequencies fixed at load, an attention that takes an additive mask (ATTENTIONS),
    and no accelerate hook on a module whose forward it skips (`bypassed`: a hook moves weights in
    on a module's call). It runs before every eager static pass, so it looks at the modules it
    skips, not at every module."""
    if type(decoder) is not LlamaModel:
        return False
    config = decoder.config
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    return (not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False)
            and config.hidden_act == "silu" and config._attn_implementation in ATTENTIONS
            and rope in FIXED_ROPE and getattr(config, "pretraining_tp", 1) == 1
            and not hooked(bypassed(decoder)))


def hooked(modules) -> bool:
    """Whether accelerate hooked one of `modules`: a hook moves a module's weights in on its call."""
    return any("_hf_hook" in vars(module) for module in modules)


def bypassed(decoder: LlamaModel):
    """The modules whose forward `decoder_pass` does not call (it reads their weights, or calls
    their children): where accelerate hooked one, its weights would not move in."""
    yield from (decoder, decoder.norm)
    for layer in decoder.layers:
        yield from (layer, layer.self_attn, layer.input_layernorm, layer.post_attention_layernorm)


def decoder_pass(decoder: LlamaModel, cache: StaticKV, inputs: torch.Tensor, positions: torch.Tensor,
                 slots: torch.Tensor, mask: torch.Tensor, hidden_states: bool = False,
                 joined: tuple["Joined", ...] | None = None, **extras) -> BaseModelOutputWithPast:
    """transformers' `decoder(input_ids or inputs_embeds=inputs, attention_mask=mask,
    position_ids=positions, past_key_values=cache, output_hidden_states=hidden_states)` over a
    static cache, writing token i's keys and values at `slots[i]` ([w]: the cache's start and on):
    the last hidden states [1, w, H], and with `hidden_states` the residual stream before the
    first layer and after each one (the last normed). `joined`: each layer's products joined
    (`joined_weights`); None: the modules' own. `extras`: what the attention takes beside
    (`grouped_attention.per_pass`)."""
    hidden = decoder.embed_tokens(inputs) if not inputs.is_floating_point() else inputs
    cos, sin = rotary_rows(decoder, cache, positions, hidden)
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(decoder.config._attn_implementation, eager_attention_forward)
    states = [hidden]
    for index, layer in enumerate(decoder.layers):
        hidden = layer_pass(layer, hidden, cos, sin, cache.layers[index], slots, mask, attend, extras,
                            None if joined is None else joined[index])
        states.append(hidden)
    hidden = normed(decoder.norm, hidden)
    states[-1] = hidden
    return BaseModelOutputWithPast(last_hidden_state=hidden, hidden_states=tuple(states) if hidden_states else None)


class Joined(NamedTuple):
    """A layer's products joined: its queries', keys' and values' weights as one, its MLP's gate's and up's."""

    qkv: torch.Tensor  # [H D + 2 H_kv D, hidden]
    gate_up: torch.Tensor  # [2 I, hidden]


def joined_weights(decoder: torch.nn.Module, room: int) -> tuple[Joined, ...] | None:
    """Each layer's products joined, for a decoder `decoder_pass` runs whose joined weights take at
    most `room` bytes (else None): a pass then runs two products where it ran five, and each
    output is the same row of the same weights. The weights are copied, so a decoder joins them
    once they are final, as it compiles its pass; never where accelerate hooks a projection (its
    weights move in only when it is called, which the joined pass skips)."""
    if not writes_out(decoder):
        return None
    parts = [(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj,
              layer.mlp.up_proj) for layer in decoder.layers]
    if hooked(part for layer in parts for part in layer):
        return None
    if sum(part.weight.nbytes for layer in parts for part in layer) > room:
        return None
    with torch.no_grad():
        return tuple(Joined(torch.cat([q.weight, k.weight, v.weight]), torch.cat([gate.weight, up.weight]))
                     for q, k, v, gate, up in parts)


def rotary_table(decoder: torch.nn.Module, capacity: int) -> torch.Tensor | None:
    """The rotary embedding's cosine and sine (its sign folded in, `signed_sine`) at every position
    below `capacity`, [capacity, 2, D] in the decoder's dtype, for a decoder `decoder_pass` runs
    (else None): a pass then reads its positions' rows (`rotary_rows`), one kernel where computing
    them takes nine or more. The same values: the embedding is computed position by position."""
    if not writes_out(decoder):
        return None
    probe = torch.empty(0, dtype=decoder.dtype, device=decoder.device)  # the embedding reads its dtype and device
    cos, sin = decoder.rotary_emb(probe, torch.arange(capacity, device=decoder.device)[None])
    return torch.stack([cos[0], signed_sine(sin[0])], dim=1)


def rotary_rows(decoder: LlamaModel, cache: StaticKV, positions: torch.Tensor,
                hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pass's rotary cosine and signed sine [1, 1, w, D] at `positions` [1, w], every head
    alike, in the dtype of `hidden`: rows of the cache's table (`rotary_table`) where it has one,
    else computed."""
    if cache.rotary is not None:
        rows = cache.rotary[positions[0]]  # [w, 2, D]
        return rows[None, None, :, 0], rows[None, None, :, 1]
    cos, sin = decoder.rotary_emb(hidden, positions)  # [1, w, D]
    return cos[:, None], signed_sine(sin)[:, None]


def layer_pass(layer, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv, slots: torch.Tensor,
               mask: torch.Tensor, attend, extras: dict, joined: Joined | None = None) -> torch.Tensor:
    """One `LlamaDecoderLayer` over `hidden` [1, w, H]: attention (its keys and values written at
    `slots` of `kv`, the layer's part of the cache, a `kvcache.SlotLayer`), then the MLP, each added
    to the residual stream. `cos`, `sin`: the pass's rotary embedding [1, 1, w, D], the sine's sign
    folded in (`signed_sine`). `joined`: the layer's products joined (`joined_weights`)."""
    attention, mlp = layer.self_attn, layer.mlp
    width, head_dim = hidden.shape[1], attention.head_dim
    normalised = normed(layer.input_layernorm, hidden)
    if joined is None:
        queries, keys, values = (attention.q_proj(normalised), attention.k_proj(normalised),
                                 attention.v_proj(normalised))
    else:
        sizes = [attention.q_proj.out_features, attention.k_proj.out_features, attention.v_proj.out_features]
        queries, keys, values = F.linear(normalised, joined.qkv).split(sizes, dim=-1)
    queries = queries.view(1, width, -1, head_dim)  # [1, w, H, D]
    keys, values = keys.view(1, width, -1, head_dim), values.view(1, width, -1, head_dim)  # [1, w, H_kv, D]
    heads = queries.shape[2]
    # [1, H + H_kv, w, D], head by head in memory: the queries of a group of heads are rows of one
    # tensor as they are (`grouped_attention`), with no copy for a pass of several tokens
    rotated = rotate(torch.cat([queries.transpose(1, 2), keys.transpose(1, 2)], dim=1), cos, sin)
    cached_keys, cached_values = kv.write(slots, rotated[:, heads:], values.transpose(1, 2))
    out, _ = attend(attention, rotated[:, :heads], cached_keys, cached_values, mask, dropout=0.0,
                    scaling=attention.scaling, **extras)  # [1, w, H, D]
    hidden = hidden + attention.o_proj(out.reshape(1, width, -1))
    normalised = normed(layer.post_attention_layernorm, hidden)
    if joined is None:
        return hidden + mlp(normalised)
    gate, up = F.linear(normalised, joined.gate_up).chunk(2, dim=-1)
    return hidden + mlp.down_proj(mlp.act_fn(gate) * up)  # `LlamaMLP`'s products


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding (Su et al. 2021) of `x` [..., D] as transformers lays it out, x cos +
    rotate_half(x) sin with rotate_half(x) = [-x2, x1] for the halves x1, x2: here [x2, x1] (one
    roll) times the sine with its first half negated (`signed_sine`), the same products."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def signed_sine(sin: torch.Tensor) -> torch.Tensor:
    """[-s1, s2] for the halves s1, s2 of `sin` [..., D]: once a pass, for every layer's `rotate`."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def normed(norm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """`norm(hidden)`, an RMSNorm (Zhang & Sennrich 2019) as one call; any other module called."""
    if isinstance(norm, LlamaRMSNorm):
        return F.rms_norm(hidden, norm.weight.shape, norm.weight, norm.variance_epsilon)
    return norm(hidden)
