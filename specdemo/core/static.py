"""The static pass: gpt-fast's recipe inside the engine's one target pass, and the drafts' passes.

A request's target cache is a `kvcache.StaticKV`, allocated once for its maximum length: a pass
writes its tokens' keys and values at the valid length and on, and rollback only moves that
length. Every pass is padded to the smallest of a few widths (`BUCKETS`), its padded nodes
masked out, so one graph serves every pass of that width whatever the cache holds: the mask is
built inside the graph from the pass's layout, which the host writes into the graph's inputs. A
pass wider than the largest bucket (a prompt) runs the same function eagerly.

`compile_passes(model)` builds the graphs of one model and returns them as a `CompiledPass`, a
value its caller holds beside the model (a `models.LoadedModel`, a draft's options) and passes
on: with CUDA, hand-captured CUDA graphs over a buffer they own (`specdemo.core.graphs`: a pass
costs one launch instead of hundreds); on a CPU, `torch.compile` with inductor (the buffers'
length a dynamic dimension, so requests of every length share the graphs). Nothing is set on
the model. `request_cache(model, need, passes)` makes a request's `StaticKV`, which carries the
pass that runs it, so every pass over that cache (`verify.target_pass`, a draft's
`decoder_pass`) takes the compiled path; without `passes` a request gets transformers'
DynamicCache and the eager pass. A draft (the token draft, the feature draft's decoder layer)
gets graphs the same way for its own widths (`DRAFT_BUCKETS`).
"""

import functools
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import Cache, DynamicCache, PreTrainedModel

from specdemo.core import llama
from specdemo.core.attention import additive
from specdemo.core.errors import SpecDemoError, described
from specdemo.core.graphs import GRAPH_CAPACITY, CudaGraphs, PassLayout, layout_views, padded_inputs
from specdemo.core.grouped_attention import per_pass
from specdemo.core.kvcache import StaticKV
from specdemo.core.process import compiling_on_cpu
from specdemo.core.transfer import tensor_on, to_device

log = logging.getLogger(__name__)

BUCKETS = (1, 8, 16, 32, 64)  # pass widths a graph is compiled for (vLLM and SGLang capture a few padded sizes too)
# a draft's: the pairs a step adds (accepted tokens and one), a tree level's top-k nodes
DRAFT_BUCKETS = (1, 2, 4, 8, 16)
# with CUDA graphs, how far back a pass may look at nodes fed before it (a draft tree's third level and on sees its
# branches' earlier nodes), padded like its width: each a graph of its own; a pass looking further runs eagerly
LOOK_BACK = (8, 16, 32, 64)
CAPACITY_STEP = 256  # a request's buffers are rounded up to a multiple of this
# without CUDA graphs a pass attends over the buffers' first positions up to a multiple of this past its own
WINDOW_STEP = 64
CPU_WIDEST = 16  # the widest bucket a tree widens its pass to on a CPU, copy included (`fitted_size`)
JOINED_SHARE = 4  # with CUDA a decoder's products are joined where the copy takes at most 1/4 of the free memory


def static_forward(decoder: torch.nn.Module, cache: StaticKV, inputs: torch.Tensor, layout: PassLayout,
                   head: torch.nn.Module | None = None, layers: tuple[int, ...] = (),
                   joined: tuple[llama.Joined, ...] | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The decoder's last hidden states [1, w, H] over `inputs` (token ids [1, w], or embeddings
    [1, w, H] for a decoder fed by something else: a feature draft) as `layout` lays them out
    (`padded_layout`): at its positions, written into `cache` at its slots, token i attending to
    what its `sees` row says of the span of `back` cached positions and the new tokens; it attends
    to every valid cached position before the span, and never to what lies past the new tokens.
    A target pass has back = 0; a draft tree's later levels look back at the branches fed before.
    With `head` (the target's LM head): the hidden states and the logits [1, w, V] in float32,
    the head inside the graph (on a CPU its weights prepacked by freezing; float32, whose argmax
    is faster than bfloat16's).
    `layers`: the hidden states are `with_layers`' (the head reads the last ones).
    A Llama decoder runs written out (`llama.decoder_pass`: transformers' values in fewer
    kernels), its products joined where `joined` gives them (`joined_forward`); any other runs
    transformers' forward, which writes at `cache.start`."""
    # each buffer slot's column of the framed `sees`: the first (all seen) before the span, the last (none) past it
    every_slot = torch.arange(cache.layers[0].keys.shape[2], device=inputs.device)
    columns = (every_slot - layout.first).clamp(0, layout.sees.shape[1] - 1)
    mask = additive((layout.sees != 0)[:, columns], decoder.dtype)
    if llama.writes_out(decoder):  # the same values in fewer kernels
        out = llama.decoder_pass(decoder, cache, inputs, layout.positions, layout.slots, mask, bool(layers), joined,
                                 **per_pass(decoder))
    else:
        out = decoder(**fed(inputs), attention_mask=mask, position_ids=layout.positions, past_key_values=cache,
                      use_cache=True, output_hidden_states=bool(layers), **per_pass(decoder))
    hidden = with_layers(out, layers)
    return hidden if head is None else (hidden, head(out.last_hidden_state).float())


def joined_forward(decoder: torch.nn.Module, room: int) -> Callable:
    """`static_forward` for `decoder` with its products joined (`llama.joined_weights`, a copy of
    at most `room` bytes): what CUDA graphs capture, where a pass costs about what its kernels do
    and a small model's pass runs 3 kernels a layer fewer; a decoder without room runs the
    modules' own products."""
    joined = llama.joined_weights(decoder, room)
    return static_forward if joined is None else functools.partial(static_forward, joined=joined)


def with_layers(out, layers: tuple[int, ...] = ()) -> torch.Tensor:
    """A decoder's output as a feature draft reads it: the residual stream after each of `layers`
    (k: after k decoder layers; `out` asked with `output_hidden_states`), then the last hidden
    states, joined [..., (len(layers) + 1) * H] (EAGLE-3's low, middle and high features); without
    layers the last hidden states [..., H] alone."""
    return (torch.cat([*(out.hidden_states[k] for k in layers), out.last_hidden_state], dim=-1) if layers
            else out.last_hidden_state)


def fed(inputs: torch.Tensor) -> dict:
    """A decoder's keyword for `inputs`: token ids, or embeddings (a feature draft's fused input)."""
    return {"inputs_embeds": inputs} if inputs.is_floating_point() else {"input_ids": inputs}


@dataclass
class CompiledPass:
    """The compiled static pass of one model: its graphs' widths and how often each ran."""

    forward: Callable  # torch.compile(static_forward) on a CPU; with CUDA graphs `joined_forward`
    buckets: tuple[int, ...]
    mode: str | None  # "cuda-graphs" with CUDA (`graphs.CudaGraphs`); None: torch.compile's default (a CPU)
    runs: Counter = field(default_factory=Counter)  # bucket width -> passes run (0: eager, wider than every bucket)
    failed: str | None = None  # why compiling failed: every pass then runs eagerly
    graphs: CudaGraphs | None = None  # with CUDA: the captured graphs and the KV buffer they own

    def bucket(self, width: int) -> int | None:
        return next((bucket for bucket in self.buckets if bucket >= width), None)

    def serves(self, cache: Cache) -> bool:
        """Whether a pass over `cache` runs a graph: any `StaticKV` when compiled, with CUDA graphs
        only a view of the graphs' own buffer (`graphs.CudaGraphs.lease`)."""
        return isinstance(cache, StaticKV) and not self.failed and (self.graphs is None or self.graphs.serves(cache))


def default_compile(device: torch.device) -> bool:
    """Compile by default with CUDA, where a small model's pass is launch-bound. On a CPU the
    compiled path gains no reliable speed over the eager one with prepacked weights, and compiling
    every width takes minutes before the first answer, which a laptop's first try should not wait
    for: eager there, `--compile` to choose (docs/benchmarks.md has the measurements)."""
    return device.type == "cuda"


def compile_passes(model: PreTrainedModel, buckets: tuple[int, ...] = BUCKETS,
                   progress: Callable[[str], None] | None = None, role: str = "target",
                   windows: tuple[int, ...] = ()) -> CompiledPass:
    """The compiled static pass of `model` for every bucket, each warmed up once (the compile
    happens now, not in a user's first answer), reporting through `progress`. A target's graphs
    hold its LM head (`verify.target_pass`); a draft's (`role` "draft") its decoder alone
    (`decoder_pass`). If compiling fails, it says so once and every pass runs eagerly.
    Each call compiles anew: the caller keeps the value. On a CPU the graphs hold the weights as
    constants (freezing): compile a model once its weights are final (a CLLM after its adapters
    are merged). `windows`: with CUDA, the windows of the graphs' buffer a pass may attend over
    (`graphs.CudaGraphs.window`; none: the whole buffer)."""
    if model.device.type == "cuda":  # hand-captured CUDA graphs: no compiler, captured in milliseconds
        forward = joined_forward(model.get_decoder(), torch.cuda.mem_get_info(model.device)[0] // JOINED_SHARE)
        compiled = CompiledPass(forward, tuple(sorted(buckets)), "cuda-graphs",
                                graphs=CudaGraphs(model, capacity(model, GRAPH_CAPACITY), windows))
    else:
        compiling_on_cpu()  # process-wide: dynamo's limits, inductor's freezing (`core.process` says why)
        compiled = CompiledPass(torch.compile(static_forward, dynamic=False), tuple(sorted(buckets)), None)
    warm_up(model, compiled, progress, role)
    return compiled


def warm_up(model: PreTrainedModel, compiled: CompiledPass, progress: Callable[[str], None] | None, role: str) -> None:
    """Run one pass of every bucket, so that compiling (or capturing a CUDA graph) happens now,
    not in a user's first answer: with CUDA graphs given windows, one over each window (a pass
    reaching its end) and over the whole buffer."""
    verb = "capturing a CUDA graph of" if compiled.graphs else "compiling"
    spans = compiled.graphs.spans() if compiled.graphs else (None,)
    kinds = [(span, width) for span in spans for width in compiled.buckets]
    with torch.inference_mode():
        cache = request_cache(model, 1 + max(compiled.buckets), compiled)
        for number, (span, width) in enumerate(kinds, 1):
            if progress:
                over = f" over {span} positions" if len(spans) > 1 else ""
                progress(f"{verb} the {role} pass for {width} token(s){over} ({number} of {len(kinds)})")
            cache.length = 0 if span in (None, spans[0]) else max(span - width, 0)
            static_pass(model, cache, warm_inputs(model, width), np.arange(width), np.tri(width, dtype=bool),
                        rows=range(width) if role == "target" else None)
            if compiled.failed:
                break
        cache.length = 0
    compiled.runs.clear()


def warm_inputs(model: PreTrainedModel, width: int) -> torch.Tensor:
    """Inputs of `width` tokens for a warm-up pass: token ids, or embeddings for a decoder without
    an embedding of its own (a feature draft's)."""
    if getattr(model.get_decoder(), "embed_tokens", None) is not None:
        return torch.zeros(1, width, dtype=torch.long, device=model.device)
    return torch.zeros(1, width, model.config.hidden_size, dtype=model.dtype, device=model.device)


def capacity(model: PreTrainedModel, need: int) -> int:
    """A request's buffer length: `need` positions rounded up, within the model's context."""
    rounded = math.ceil(need / CAPACITY_STEP) * CAPACITY_STEP
    limit = getattr(model.config, "max_position_embeddings", None)
    return min(rounded, limit) if limit and need <= limit else rounded


def request_cache(model: PreTrainedModel, need: int, passes: CompiledPass | None = None) -> Cache:
    """A model's cache (a target's, a draft's) for a request that may feed up to `need` positions:
    a `StaticKV` run by `passes` (the model's compiled pass) when given, else transformers'
    DynamicCache, run eagerly."""
    if passes is None or passes.failed:
        return DynamicCache(config=model.config)
    if passes.graphs and (lent := passes.graphs.lease(need + max(passes.buckets), passes)):
        return lent
    # the last pass's padded nodes are written too, and a window past them stays a view shorter than the
    # buffers: a graph compiled on views recompiled (a minute on a CPU) for the whole buffer
    length = capacity(model, need + max(passes.buckets) + WINDOW_STEP)
    # inductor compiles a graph over one buffer a layer about twice as fast (`kvcache.StaticKV`)
    return StaticKV(model, length, passes, llama.rotary_table(model.get_decoder(), length), per_layer=not passes.graphs)


def padded_width(cache: Cache) -> Callable[[int], int | None] | None:
    """For a request on the compiled path (`cache` a `StaticKV` run by a compiled pass), the width
    a pass of n fed tokens runs at: its bucket, None where none holds it (it then runs eagerly).
    A proposer may fill the padded slots with nodes that cost nothing more. None on the eager
    path, where a pass costs what it feeds."""
    passes = getattr(cache, "passes", None)
    if passes is None or not passes.serves(cache):
        return None
    return lambda width: width if passes.failed else passes.bucket(width)


def fitted_copy(nodes: int, copied: int, bucket: Callable[[int], int | None] | None) -> int:
    """How much of a `copied` branch a tree of a fixed `nodes` (a static tree) takes beside its root
    on the compiled path (`bucket`) without its pass outgrowing the widest bucket, which would run it
    eagerly: all of it while it fits, the rest dropped from its end. Eager (`bucket` None): all."""
    if bucket is None:
        return copied
    return next((length for length in range(copied, 0, -1) if bucket(1 + nodes + length)), 0)


def fitted_size(size: int, copied: int, bucket: Callable[[int], int | None] | None, device: torch.device) -> int:
    """How many nodes a tree of `size` nodes (a Medusa tree, a draft tree) gets this pass beside
    `copied` copied ones. Eager (`bucket` None): `size`, as asked. On the compiled path, whose
    passes are padded to a few widths (`loop.Context.bucket`), the tree fills the width its pass
    runs at (a padded slot costs what a node costs), and which width depends on what a wider pass
    costs on `device`:
    - with CUDA (graphs: a pass costs about the same at any width), the bucket holding the root,
      the copy and all `size` nodes; a tree too large for every bucket fills the widest, down to
      half its size, rather than run its pass eagerly;
    - on a CPU (a pass costs about its width in compute), the narrowest bucket holding the root,
      the copy and half the tree: a 12-node tree without a copy runs as 8 (7 nodes), not 16 (15). Past
      CPU_WIDEST the tree gives way to the copy, down to one node, rather than take a bucket
      twice as wide (docs/history/benchmarks-log.md has what each choice measured).
    At least half of `size` stay (on a CPU, within CPU_WIDEST)."""
    if bucket is None:
        return size
    least = (size + 1) // 2
    if device.type == "cuda":
        held = next((nodes for nodes in range(size, least - 1, -1) if bucket(1 + nodes + copied)), size)
        width = bucket(1 + held + copied) or 1 + size + copied
    else:
        least = max(min(least, CPU_WIDEST - 1 - copied), 1)
        width = bucket(1 + least + copied) or 1 + least + copied
    return max(width - 1 - copied, least)


def padded_layout(positions: np.ndarray, sees: np.ndarray, bucket: int, look_back: int = 0,
                  start: int = 0) -> torch.Tensor:
    """A pass's layout padded to `bucket` nodes and a look-back window of `look_back` >= back cached
    positions, as one byte buffer on the CPU (`graphs.layout_views` reads it back). As int64: its
    positions [1, bucket], `start` (where it writes in its cache), the slot before the span that
    `sees` covers, and the slots it writes [bucket] (start and on); then, as bool, `sees` [w, back + w]
    padded to [bucket, look_back + bucket] and framed by a first column every node sees (the
    cache before the span) and a last one none sees (past the pass), so the pass builds its mask
    from a slot's column alone (`static_forward`). `positions` [w] and `sees` are the host's numpy
    arrays (`attention`), and the layout moves to the device as one copy. A padded node sits at the
    last position and sees only itself among the fed nodes; no real node sees it, and what it
    writes into the cache lies past the valid length. Its input is `graphs.padded_inputs`' zero,
    or in a CUDA graph whatever an earlier pass fed that slot. The window's added columns come
    first and are seen by every node: they hold cached positions before the first one some node
    may not see."""
    width = positions.shape[0]
    back = sees.shape[1] - width
    split = 8 * (2 * bucket + 2)
    layout = np.empty(split + bucket * (look_back + bucket + 2), dtype=np.uint8)
    head = layout[:split].view(np.int64)
    head[:width] = positions
    head[width:bucket], head[bucket], head[bucket + 1] = head[width - 1], start, start - look_back - 1
    head[bucket + 2 :] = np.arange(start, start + bucket)
    framed = layout[split:].view(bool).reshape(bucket, look_back + bucket + 2)
    framed[:, 0], framed[:, -1] = True, False
    seen = framed[:, 1:-1]
    seen[:, :look_back] = True
    seen[:, look_back:] = np.eye(bucket, dtype=bool)
    seen[:width, look_back - back : look_back + width] = sees
    return torch.from_numpy(layout)


def unpadded_layout(positions: np.ndarray, sees: np.ndarray, start: int, device: torch.device) -> PassLayout:
    """The layout of a pass run as it is fed, without padding (`padded_layout`), on `device`."""
    width = positions.shape[0]
    return layout_views(to_device(padded_layout(positions, sees, width, sees.shape[1] - width, start), device), width)


def static_pass(model: PreTrainedModel, cache: StaticKV, inputs: torch.Tensor, positions: np.ndarray,
                sees: np.ndarray, rows: Sequence[int] | None = None, layers: tuple[int, ...] = (),
                keep_hidden: bool = True) -> torch.Tensor | tuple[torch.Tensor | None, torch.Tensor]:
    """One pass on the static path: the last hidden states [1, w, H] of `inputs` [1, w] (ids, or
    embeddings [1, w, H]) at `positions` [w], token i seeing what `sees` [w, back + w] says
    (`static_forward`), padded to its bucket and run by the compiled graph; eagerly when no bucket
    fits, when compiling failed, or when the pass looks back at earlier branches (back > 0) without
    CUDA graphs (inductor would compile each look-back anew) or further than LOOK_BACK's widest.
    `positions` and `sees` are the host's numpy arrays (`attention`): they move to the model's
    device here (into a CUDA graph's own buffer, as one copy that waits for nothing), so building
    them costs no GPU launch.
    It attends over the buffer's first positions, those that may be valid rounded up: with CUDA
    graphs their window (`graphs.CudaGraphs.window`), else a multiple of WINDOW_STEP.
    `rows`: the model's logits [len(rows), V] (float32) at those fed positions too, from the LM
    head in the same graph (all w rows, then these), or where the pass runs eagerly (a prompt
    wider than every bucket) from the head over these rows alone. `layers`: the hidden states
    are `with_layers`' (a graph for those layers is compiled at their first pass). With `rows`,
    `keep_hidden` False returns None for the hidden states, which a graphed pass then does not
    copy out (a target pass whose proposer reads no features).
    The cache's valid length then counts the w tokens (`kvcache.keep_positions` rolls it back)."""
    width, back = inputs.shape[1], sees.shape[1] - inputs.shape[1]
    passes = cache.passes
    look_back = 0 if back == 0 else next((span for span in LOOK_BACK if span >= back), None)
    graphed = back == 0 or (passes is not None and passes.graphs is not None and look_back is not None)
    bucket = passes.bucket(width) if passes and passes.serves(cache) and graphed else None
    if cache.length + (bucket or width) > cache.capacity:
        raise SpecDemoError(f"the static KV cache holds {cache.capacity} positions; this pass needs "
                            f"{cache.length + (bucket or width)}")
    reach = cache.length + (bucket or width)
    # a cache of its own (the graphs' buffer lent, or too short) has no graph's window: it rounds up, as without graphs
    seen = cache.window(passes.graphs.window(reach) if passes and passes.graphs and passes.graphs.serves(cache)
                        else math.ceil(reach / WINDOW_STEP) * WINDOW_STEP)
    out = None
    if bucket is not None:
        try:
            out = bucketed(passes, model, seen, inputs, positions, sees, bucket, rows is not None, layers, look_back,
                           cache.length)
            hidden = (out if rows is None else out[0])[:, :width] if keep_hidden or rows is None else None
            if passes.mode and hidden is not None:  # a CUDA graph's outputs are overwritten by its next replay
                hidden = hidden.clone()
            out = hidden if rows is None else (hidden, rows_of(out[1][0], rows))
            passes.runs[bucket] += 1
        except Exception as error:  # noqa: BLE001 -- any compiler failure: warn once, run eagerly from now on
            passes.failed = described(error)
            log.warning("compiling the static pass failed (%s); running it eagerly", passes.failed.splitlines()[0])
    if out is None:  # eagerly: the start set here, as a graph sets it from its layout
        cache.start.fill_(cache.length)
        layout = unpadded_layout(positions, sees, cache.length, inputs.device)
        hidden = static_forward(model.get_decoder(), seen, inputs, layout, layers=layers)
        if rows is not None:
            logits = model.get_output_embeddings()(hidden[0, list(rows), -model.config.hidden_size :]).float()
            out = hidden if keep_hidden else None, logits
        else:
            out = hidden
        if passes:
            passes.runs[0] += 1
    cache.length += width
    return out


def bucketed(passes: CompiledPass, model: PreTrainedModel, cache: StaticKV, inputs: torch.Tensor,
             positions: np.ndarray, sees: np.ndarray, bucket: int, with_head: bool,
             layers: tuple[int, ...], look_back: int = 0, start: int = 0):
    """`static_forward`'s output for a pass of `model`'s decoder (and its LM head where
    `with_head`) padded to `bucket` nodes (and `look_back` cached positions, `padded_layout`)
    writing at `start`, run by the compiled pass: a CUDA graph (which takes the fed inputs as they
    are and the padded layout as one copy), or the compiled function over fresh padded tensors on
    the model's device, the cache's start set first (a CUDA graph sets it from the layout)."""
    layout = padded_layout(positions, sees, bucket, look_back, start)
    if passes.graphs is not None:
        return passes.graphs(passes.forward, model, cache, inputs, layout, bucket, with_head, layers)
    cache.start.fill_(start)
    head = model.get_output_embeddings() if with_head else None
    return passes.forward(model.get_decoder(), cache, padded_inputs(inputs, bucket),
                          layout_views(layout.to(inputs.device), bucket), head, layers)


def rows_of(logits: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """`logits[rows]` as a tensor of its own: a slice where the rows run in a row (one copy, no
    index to move to the device), else indexed by the list (copied without waiting for the pass)."""
    rows = list(rows)
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return logits[rows[0] : rows[0] + len(rows)].clone()
    return logits.index_select(0, tensor_on(rows, logits.device))


def decoder_pass(model: PreTrainedModel, cache: Cache, inputs: torch.Tensor, *, sees: np.ndarray | None = None,
                 position_ids: np.ndarray | None = None) -> torch.Tensor:
    """A draft's pass: the last hidden states [1, w, H] of `model`'s decoder over `inputs` (ids
    [1, w] or embeddings [1, w, H]) after what `cache` holds. A chain when `sees` is None; else
    token i attends to every cached position but the last `back` and, among those and the new
    tokens, to j where `sees[i, j]` ([w, back + w]: the branches of a draft tree, the last `back`
    cached positions holding the branches fed before), at `position_ids` [w]: both the host's
    numpy arrays, as a tree's layout is built (`attention`). On a `StaticKV` the static path
    (compiled when the cache carries a compiled pass, `request_cache`); on any other cache
    transformers' pass."""
    cached, width = cache.get_seq_length(), inputs.shape[1]
    if not isinstance(cache, StaticKV):
        tree = {}
        if sees is not None:
            before = cached + width - sees.shape[1]  # cached positions every new token sees
            allowed = np.concatenate([np.ones((width, before), dtype=bool), sees], axis=1)
            tree = {"attention_mask": to_device(additive(torch.from_numpy(allowed), model.dtype), inputs.device),
                    "position_ids": to_device(torch.from_numpy(position_ids)[None], inputs.device)}
        return model.get_decoder()(**fed(inputs), past_key_values=cache, use_cache=True, **tree,
                                   **per_pass(model)).last_hidden_state
    if sees is None:
        return static_pass(model, cache, inputs, np.arange(cached, cached + width), np.tri(width, dtype=bool))
    back = sees.shape[1] - width
    if back:  # from the window's first position some new token may not see
        hidden_from = np.flatnonzero(~sees[:, :back].all(axis=0))
        sees = sees[:, int(hidden_from[0]) if len(hidden_from) else back :]
    return static_pass(model, cache, inputs, position_ids, sees)
