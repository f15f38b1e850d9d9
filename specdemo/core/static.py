"""The compiled target pass (issue 27): gpt-fast's recipe inside the engine's one target pass.

A request's target cache is a `kvcache.StaticKV`, allocated once for its maximum length: a pass
writes its tokens' keys and values at the valid length and on, and rollback only moves that
length. Every pass is padded to the smallest of a few widths (`BUCKETS`), its padded nodes
masked out, so one `torch.compile`d graph serves every pass of that width whatever the cache
holds: the mask is built inside the graph from the cache's `start` tensor, and the buffers'
length is a dynamic dimension, so requests of every length share the graphs. On CUDA the graphs
run as CUDA graphs (mode "reduce-overhead"), which is what makes a small model's pass cost one
launch instead of hundreds. A pass wider than the largest bucket (a prompt) runs the same
function eagerly.

`compile_passes(model)` compiles and warms up every bucket once per process and attaches the
result to the model as `model.compiled_pass`; `verify.target_pass` takes this path whenever the
loop gave it a `StaticKV`, which `target_cache` does for a model that has one.
"""

import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import Cache, DynamicCache, PreTrainedModel

from specdemo.core.attention import additive
from specdemo.core.errors import SpecDemoError
from specdemo.core.kvcache import StaticKV

log = logging.getLogger(__name__)

BUCKETS = (1, 8, 16, 32, 64)  # pass widths a graph is compiled for (vLLM and SGLang capture a few padded sizes too)
CAPACITY_STEP = 256  # a request's buffers are rounded up to a multiple of this
ATTRIBUTE = "compiled_pass"  # where `compile_passes` leaves its `CompiledPass` on the model


def static_forward(decoder: torch.nn.Module, cache: StaticKV, tokens: torch.Tensor, positions: torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states [1, w, H] over `tokens` [1, w] at `positions` [1, w],
    written into `cache` at `cache.start` and on. Token i attends to every valid cached position
    (before `start`) and to the new tokens j where `sees[i, j]`; never to what lies past them."""
    width = tokens.shape[1]
    kv = torch.arange(cache.layers[0].keys.shape[2], device=tokens.device)
    offset = kv - cache.start  # where each buffer slot lies relative to this pass's first token
    window = (offset >= 0) & (offset < width)
    allowed = (kv < cache.start)[None] | (sees[:, offset.clamp(0, width - 1)] & window[None])  # [w, capacity]
    mask = additive(allowed, decoder.dtype)
    return decoder(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True).last_hidden_state


@dataclass
class CompiledPass:
    """The compiled static pass of one model: its graphs' widths and how often each ran."""

    forward: Callable  # torch.compile(static_forward)
    buckets: tuple[int, ...]
    mode: str | None  # torch.compile's mode: "reduce-overhead" (CUDA graphs) on CUDA
    runs: Counter = field(default_factory=Counter)  # bucket width -> passes run (0: eager, wider than every bucket)
    failed: str | None = None  # why compiling failed: every pass then runs eagerly

    def bucket(self, width: int) -> int | None:
        return next((bucket for bucket in self.buckets if bucket >= width), None)


def default_compile(device: torch.device) -> bool:
    """Compile by default where it measures faster: with CUDA (a small model's pass is launch-bound
    there). On a CPU compiled AR measured 1.38x eager AR in bfloat16, but speculative's and
    Medusa's speedups fell and compiling the buckets took minutes before the first answer:
    eager (docs/benchmarks.md)."""
    return device.type == "cuda"


def compiled_pass(model: PreTrainedModel) -> CompiledPass | None:
    return getattr(model, ATTRIBUTE, None)


def compile_passes(model: PreTrainedModel, buckets: tuple[int, ...] = BUCKETS, progress: Callable[[str], None] | None = None) -> CompiledPass:
    """Compile the static pass of `model` for every bucket and warm each up once (the compile
    happens then, not in a user's first answer), reporting through `progress`. If compiling
    fails, say so once and leave the model eager. Idempotent: a model keeps its first graphs.
    On a CPU the graphs hold the weights as constants (freezing): compile a model once its
    weights are final (a CLLM after its adapters are merged)."""
    if compiled := compiled_pass(model):
        return compiled
    mode = "reduce-overhead" if model.device.type == "cuda" else None
    for limit in ("cache_size_limit", "recompile_limit"):  # a graph per bucket and model (a target, a CLLM...)
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 256))
    if not mode:  # on a CPU, inductor's freezing prepacks the weights for oneDNN: a compiled pass gains
        # about 1.4x with it, 1.2x without (docs/benchmarks.md). Set for the process: torch.compile's
        # `options` did not carry it to the compiler (measured: no gain)
        torch._inductor.config.freezing = True
    compiled = CompiledPass(torch.compile(static_forward, dynamic=False, mode=mode), tuple(sorted(buckets)), mode)
    setattr(model, ATTRIBUTE, compiled)
    with torch.inference_mode():
        cache = StaticKV(model, capacity(model, 1 + max(buckets)))
        for number, width in enumerate(compiled.buckets, 1):
            if progress:
                progress(f"compiling the target pass for {width} token(s) ({number} of {len(compiled.buckets)})")
            for _ in range(2 if mode else 1):  # CUDA graphs are recorded on the second call
                static_pass(model, cache, torch.zeros(1, width, dtype=torch.long, device=model.device),
                            torch.arange(width, device=model.device)[None], torch.ones(width, width, dtype=torch.bool, device=model.device).tril())
                cache.length = 0
            if compiled.failed:
                break
    compiled.runs.clear()
    return compiled


def capacity(model: PreTrainedModel, need: int) -> int:
    """A request's buffer length: `need` positions rounded up, within the model's context."""
    rounded = math.ceil(need / CAPACITY_STEP) * CAPACITY_STEP
    limit = getattr(model.config, "max_position_embeddings", None)
    return min(rounded, limit) if limit and need <= limit else rounded


def target_cache(model: PreTrainedModel, need: int, compiled: bool = True) -> Cache:
    """The target's cache for a request that may feed up to `need` positions: a `StaticKV` when
    the model has a compiled pass (and `compiled`), else transformers' DynamicCache."""
    passes = compiled_pass(model)
    if not compiled or passes is None or passes.failed:
        return DynamicCache(config=model.config)
    return StaticKV(model, capacity(model, need + max(passes.buckets)))  # the last pass's padded nodes are written too


def padded_width(model: PreTrainedModel, cache: Cache) -> Callable[[int], int] | None:
    """For a request on the compiled path (`cache` a `StaticKV`), the width a pass of n fed tokens
    runs at: its bucket (n where none fits). A proposer may fill the padded slots with nodes that
    cost nothing more. None on the eager path, where a pass costs what it feeds."""
    passes = compiled_pass(model)
    if not isinstance(cache, StaticKV) or passes is None or passes.failed:
        return None
    return lambda width: width if passes.failed else passes.bucket(width) or width


def fitted_size(size: int, copied: int, bucket: Callable[[int], int] | None) -> int:
    """How many nodes a tree of `size` nodes (a Medusa tree, a draft tree) gets this pass beside
    `copied` copied ones. Eager (`bucket` None): `size`. On the compiled path, whose passes are
    padded to a few widths (`loop.Context.bucket`), the nodes that fill the width the root and
    `size` nodes run at, the copy's included: a copy takes the room of the tree's least likely
    nodes instead of widening the pass (a CPU pass costs about its width in compute), and
    padded slots hold real nodes instead of nothing. At least half of `size` stay."""
    if bucket is None:
        return size
    return max(bucket(1 + size) - 1 - copied, (size + 1) // 2)


def padded(tokens: torch.Tensor, positions: torch.Tensor, sees: torch.Tensor, bucket: int) -> tuple[torch.Tensor, ...]:
    """A pass's inputs padded to `bucket` nodes, as fresh tensors (a graph is specialised on its
    inputs' strides too): a padded node holds token 0 at the last position and sees only itself;
    no real node sees it, and what it writes into the cache lies past the valid length."""
    width = tokens.shape[1]
    fed = tokens.new_zeros(1, bucket)
    fed[:, :width] = tokens
    at = positions[:, -1:].repeat(1, bucket)
    at[:, :width] = positions
    seen = torch.eye(bucket, dtype=torch.bool, device=sees.device)
    seen[:width, :width] = sees
    return fed, at, seen


def static_pass(model: PreTrainedModel, cache: StaticKV, tokens: torch.Tensor, positions: torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
    """One target pass on the static path: the last hidden states [1, w, H] of `tokens` [1, w]
    (at `positions` [1, w], token i seeing the new tokens j where `sees[i, j]`), padded to its
    bucket and run by the compiled graph, or eagerly when no bucket fits or compiling failed.
    The cache's valid length then counts the w tokens (`kvcache.keep_positions` rolls it back)."""
    width = tokens.shape[1]
    passes = compiled_pass(model)
    bucket = passes.bucket(width) if passes and not passes.failed else None
    if cache.length + (bucket or width) > cache.capacity:
        raise SpecDemoError(f"the static KV cache holds {cache.capacity} positions; this pass needs {cache.length + (bucket or width)}")
    cache.start.fill_(cache.length)
    hidden = None
    if bucket is not None:
        try:
            hidden = passes.forward(model.get_decoder(), cache, *padded(tokens, positions, sees, bucket))[:, :width]
            if passes.mode == "reduce-overhead":
                hidden = hidden.clone()  # a CUDA graph's output is overwritten by its next replay
            passes.runs[bucket] += 1
        except Exception as error:  # noqa: BLE001 -- any compiler failure: warn once, run eagerly from now on
            passes.failed = f"{type(error).__name__}: {error}"
            log.warning("compiling the target pass failed (%s); running it eagerly", passes.failed.splitlines()[0])
    if hidden is None:
        hidden = static_forward(model.get_decoder(), cache, tokens, positions, sees)
        if passes:
            passes.runs[0] += 1
    cache.length += width
    return hidden
