"""CUDA graphs of the static pass, captured by hand (`torch.cuda.CUDAGraph`, no compiler).

On a GPU a small model's eager pass is launch-bound: hundreds of kernels, each launched from
Python. A CUDA graph records one pass's kernels once and replays them with one launch. Rules:

- A graph reads and writes fixed addresses. So the graphs of one model own one KV buffer
  (`StaticKV`, `GRAPH_CAPACITY` positions) and one set of input tensors per graph; a pass copies
  its padded inputs into them, replays, and copies the outputs out before the next replay.
- A pass's layout (its positions, where it writes, what each node sees) is built on the host
  and reaches its graph as one copy of one buffer (`static.padded_layout`), from pinned memory
  and without waiting: a copy from pageable memory would wait for the device to finish its queue.
- A pass attends over the whole buffer, or, where the graphs are given `windows`, over its first
  positions: the smallest window holding the cache's valid length and the pass's padded nodes
  (`window`). Attention reads every position it attends over, valid or masked; a window is a kind
  of pass of its own, captured with the others. None by default: `specdemo.passcost --windowed`
  measures what a ladder of windows (`GRAPH_WINDOWS`) saves a pass.
- One graph per kind of pass: its window, its width (a bucket of `static.BUCKETS`), how far back it looks
  at nodes fed before it (`static.LOOK_BACK`: a draft tree's deeper levels), whether it is fed
  token ids or embeddings (a feature draft), whether the LM head runs inside it (a target
  pass), and the layers whose hidden states it returns. Each is captured once per `CompiledPass`, at
  `static.compile_passes` for the usual kinds and at first use for the others.
- The buffer is lent to one request at a time (`lease`), as a view sharing its tensors; the
  lease ends when the request drops its view. A request that finds it lent, or needs more
  positions, gets a buffer of its own and runs the static pass eagerly: slower, never wrong.
- All graphs share one memory pool: they never run at once, so their scratch memory can overlap.

A companion's small layers outside any decoder pass (Medusa's heads) are graphs too
(`FunctionGraphs`): fixed-shape inputs, outputs copied out under a lock. So is a function of
several passes over the buffer (a static draft tree's levels: `CudaGraphs.functions`), which
reads its layouts from its inputs as one pass does.
"""

import gc
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers import PreTrainedModel

from specdemo.core import llama
from specdemo.core.errors import described
from specdemo.core.kvcache import StaticKV

log = logging.getLogger(__name__)

GRAPH_CAPACITY = 4096  # positions of the buffer the graphs own: a prompt, its answer and a pass's padding
GRAPH_WINDOWS = (512, 1024, 2048)  # a ladder of windows of that buffer (`CudaGraphs.window`), measured by passcost


@dataclass
class Graph:
    """One captured pass: the tensors it reads and the output it writes."""

    graph: "torch.cuda.CUDAGraph"
    inputs: torch.Tensor
    layout: torch.Tensor  # `static.padded_layout`'s bytes: the pass's positions, where it writes, what each node sees
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor]


class CudaGraphs:
    """The CUDA graphs of one model's static pass and the KV buffer they own."""

    def __init__(self, model: PreTrainedModel, capacity: int, windows: tuple[int, ...] = ()):
        self.cache = StaticKV(model, capacity, rotary=llama.rotary_table(model.get_decoder(), capacity))
        self.windows = tuple(sorted(windows))
        self.pool = None  # the memory pool the graphs share, made at the first capture
        self.graphs: dict[tuple, Graph] = {}
        self.lock = threading.Lock()
        self.holder: weakref.ref | None = None  # the view lent to the request running now
        self.functions = FunctionGraphs()  # graphs of functions of several passes over this buffer

    def lease(self, need: int, passes) -> StaticKV | None:
        """The graphs' buffer as a fresh view of length 0, run by `passes` (the `static.CompiledPass`
        holding these graphs), for a request of up to `need` positions; None when it is too short
        or lent to a request that still holds it."""
        if need > self.cache.capacity:
            return None
        with self.lock:
            if self.holder is not None and self.holder() is not None:
                gc.collect()  # a finished request caught in a reference cycle
            if self.holder is not None and self.holder() is not None:
                return None
            view = self.cache.shared(passes)
            self.holder = weakref.ref(view)
            return view

    def window(self, reach: int) -> int:
        """The positions a pass reaching `reach` (the cache's valid length and the pass's padded
        nodes) attends over: the smallest window holding it, else the whole buffer."""
        return next((window for window in self.windows if reach <= window < self.cache.capacity), self.cache.capacity)

    def spans(self) -> tuple[int, ...]:
        """The positions a pass may attend over, smallest first: each window, then the whole buffer."""
        return (*(window for window in self.windows if window < self.cache.capacity), self.cache.capacity)

    def serves(self, cache) -> bool:
        """Whether `cache` is a view of the graphs' buffer (only such a pass may replay a graph)."""
        return isinstance(cache, StaticKV) and cache.start is self.cache.start

    def __call__(self, forward, model: PreTrainedModel, cache: StaticKV, inputs: torch.Tensor,
                 layout: torch.Tensor, bucket: int, with_head: bool, layers: tuple[int, ...]):
        """`forward(decoder, cache, inputs, layout, head, layers)` (`static.static_forward`) over
        `model`'s decoder, and its LM head where `with_head`, replayed from its graph for this kind
        of pass, captured now if it is the first (the model's parts are looked up only then:
        transformers' lookups are host work a replay need not repeat), with the
        layout `layout` (`static.padded_layout`'s bytes, on the CPU) for a pass of
        `bucket` nodes over `cache` (the buffer, or a window of it: `window`). `inputs` [1, w] (ids,
        or embeddings [1, w, H]) fill the first w of its slots; the padded slots keep whatever an
        earlier pass fed them: each sees only itself, no real node sees it, and what it writes lies
        past the cache's valid length."""
        width = inputs.shape[1]
        span = (layout.shape[0] - 8 * (2 * bucket + 2)) // bucket  # what a node may see: look-back, fed, framing
        key = (bucket, span, inputs.dtype, with_head, layers, cache.capacity)
        graph = self.graphs.get(key)
        if graph is None:
            head = model.get_output_embeddings() if with_head else None
            graph = self.graphs[key] = self.capture(forward, model.get_decoder(), cache, padded_inputs(inputs, bucket),
                                                    layout.to(inputs.device), bucket, head, layers)
        graph.inputs[:, :width].copy_(inputs)
        if inputs.device.type == "cuda":  # pinned, the copy waits for nothing and the host goes on
            layout = layout.pin_memory()
        graph.layout.copy_(layout, non_blocking=True)
        graph.graph.replay()
        return graph.out

    def capture(self, forward, decoder, cache, inputs, layout, bucket, head, layers) -> Graph:
        """Record the pass (`recorded`). Both its warm-up and its capture write keys and values at
        the layout's start and on, past the valid length, as the pass itself does."""
        inputs, layout = inputs.clone(), layout.clone()
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        graph, out = recorded(replayable(forward, decoder, cache, inputs, layout, bucket, head, layers), inputs.device,
                              self.pool)
        return Graph(graph, inputs, layout, out)


class PassLayout(NamedTuple):
    """A pass's layout on the device (`layout_views` of `static.padded_layout`'s bytes)."""

    positions: torch.Tensor  # [1, b] each node's position
    start: torch.Tensor  # [] the first slot it writes in its cache
    first: torch.Tensor  # [] the buffer slot of `sees`' second column, less one
    slots: torch.Tensor  # [b] the slot each node writes: start and on
    # [b, 1 + span + 1] what each node sees (1) or not (0): the cache before the span, the span, past it; bytes, read
    # as they are (a view as bool is a reinterpreting cast that some of inductor's releases cannot lower)
    sees: torch.Tensor


def layout_views(layout: torch.Tensor, bucket: int) -> PassLayout:
    """A pass's layout (`static.padded_layout`'s bytes) as views, for a pass of `bucket` nodes."""
    split = 8 * (2 * bucket + 2)
    head = layout[:split].view(torch.int64)
    return PassLayout(head[:bucket].view(1, bucket), head[bucket], head[bucket + 1], head[bucket + 2 :],
                      layout[split:].view(bucket, -1))


def replayable(forward, decoder, cache: StaticKV, inputs: torch.Tensor, layout: torch.Tensor, bucket: int, head,
               layers: tuple[int, ...]):
    """The pass a graph records: it sets `cache.start` from its `layout` (`static.padded_layout`), then
    runs `forward` on its own tensors."""
    views = layout_views(layout, bucket)

    def run():
        cache.start.copy_(views.start)
        return forward(decoder, cache, inputs, views, head, layers)

    return run


def recorded(run, device: torch.device, pool) -> tuple["torch.cuda.CUDAGraph", object]:
    """A CUDA graph of `run()` and the output it writes: warmed up twice on a side stream, then
    recorded into `pool` (PyTorch's recipe)."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = run()
    return graph, out


@dataclass
class Captured:
    """One captured function: the tensors it reads and the outputs it writes."""

    graph: "torch.cuda.CUDAGraph"
    inputs: tuple[torch.Tensor, ...]
    out: tuple[torch.Tensor, ...]
    function: object  # held as long as its graph, and with it every tensor it reads besides its inputs


class FunctionGraphs:
    """CUDA graphs of a companion's small layers outside any decoder pass (Medusa's heads and
    their top tokens): a few dozen launches a step, each a graph of one launch here. One graph
    per kind of call (`key`: the function and whatever else fixes its work) and its inputs'
    shapes and dtypes, captured at its first call. A call copies its inputs into the graph's,
    replays it and returns copies of its outputs, under a lock: requests may share the graphs.
    If a capture fails, it says so once and every call runs its function eagerly (`failed`), as a
    pass does whose graph failed (`static.static_pass`)."""

    def __init__(self):
        self.graphs: dict[tuple, Captured] = {}
        self.pool = None  # the memory pool the graphs share, made at the first capture
        self.lock = threading.Lock()
        self.failed: str | None = None  # why a capture failed: every call then runs eagerly

    def __call__(self, key, function, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`function(*inputs)`, a tuple of tensors, replayed from its graph."""
        kind = (key, *((tuple(tensor.shape), tensor.dtype) for tensor in inputs))
        with self.lock:
            captured = None if self.failed else self.graphs.get(kind)
            if captured is None and not self.failed:
                try:
                    captured = self.graphs[kind] = self.capture(function, tuple(tensor.clone() for tensor in inputs))
                except Exception as error:  # noqa: BLE001 -- any capture failure: warn once, run eagerly from now on
                    self.failed = described(error)
                    log.warning("capturing a CUDA graph of %s failed (%s); running it eagerly", key,
                                self.failed.splitlines()[0])
            if captured is None:
                return tuple(function(*inputs))
            for mine, given in zip(captured.inputs, inputs):
                mine.copy_(given)
            captured.graph.replay()
            return tuple(tensor.clone() for tensor in captured.out)

    def capture(self, function, inputs: tuple[torch.Tensor, ...]) -> Captured:
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        graph, out = recorded(lambda: function(*inputs), inputs[0].device, self.pool)
        return Captured(graph, inputs, out, function)


def padded_inputs(inputs: torch.Tensor, bucket: int) -> torch.Tensor:
    """`inputs` [1, w] (ids, or embeddings [1, w, H]) followed by zeros up to `bucket` nodes, as a
    fresh tensor (a compiled graph is specialised on its inputs' strides too)."""
    fed = inputs.new_zeros(1, bucket, *inputs.shape[2:])
    fed[:, : inputs.shape[1]] = inputs
    return fed
