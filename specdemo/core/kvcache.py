"""KV-cache rollback: the one way a cache moves back after a verification pass.

Invariant: a method's cache holds keys and values for exactly the first `length` tokens it has
been fed that are still valid; whatever a rejected proposal wrote past them is dropped here
before the next pass, so it is never attended to. transformers' DynamicCache drops it; a
`StaticKV` (the compiled pass's buffer) only moves its valid length, and its pass masks out the rest.
"""

import copy
import functools
from collections.abc import Sequence

import torch
from transformers import Cache, PreTrainedModel
from transformers.cache_utils import StaticLayer

from specdemo.core.transfer import tensor_on


def keep_prefix(cache: Cache, length: int) -> None:
    """Keep the first `length` positions of every layer; drop the rest (rejected proposals)."""
    excess = cache.get_seq_length() - length
    if excess < 0:
        raise ValueError(f"cannot keep {length} positions of a cache that holds {cache.get_seq_length()}")
    if isinstance(cache, StaticKV):
        cache.length = length  # what lies past it is stale, and masked out of every pass
    else:
        cache.crop(-excess)


def keep_positions(cache: Cache, length: int, positions: Sequence[int]) -> None:
    """Keep the first `length` positions, then the entries at `positions` (ascending, all at or
    past `length`) moved right after them: the accepted branch of a pass that fed several
    branches at once (a Medusa tree, a lookahead window beside its candidates)."""
    positions = list(positions)
    if positions != list(range(length, length + len(positions))):
        index = functools.cache(lambda device: tensor_on(positions, device))  # one copy a device (a device map)
        if isinstance(cache, StaticKV):  # two kernels for the whole model where its layers share one buffer
            for pair in [cache.buffer] if cache.buffer is not None else [layer.pair for layer in cache.layers]:
                pair[..., length : length + len(positions), :] = pair.index_select(-2, index(pair.device))
        else:
            for layer in cache.layers:  # copy only the kept entries into place; the crop drops the rest
                kept = index(layer.keys.device)
                layer.keys[..., length : length + len(positions), :] = layer.keys.index_select(-2, kept)
                layer.values[..., length : length + len(positions), :] = layer.values.index_select(-2, kept)
    keep_prefix(cache, length + len(positions))


class SlotLayer(StaticLayer):
    """One layer of a `StaticKV`: a pass writes its keys and values at the buffer's `start` and on.
    `pair` [2, 1, heads, capacity, head_dim]: its keys and values, a slice of the cache's one buffer
    or (`StaticKV`'s `per_layer`) a buffer of its own."""

    def __init__(self, max_cache_len: int, start: torch.Tensor, pair: torch.Tensor):
        super().__init__(max_cache_len)
        self.start, self.pair = start, pair

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """transformers' initialisation over the buffer's slice, but the addresses are marked static
        only on CUDA, where CUDA graphs need them: on a CPU, inductor's freezing would take a
        static buffer for a constant and read a stale copy of the cache."""
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        self.keys, self.values = self.pair[0], self.pair[1]
        if self.device.type == "cuda":
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def window(self, length: int) -> "SlotLayer":
        """This layer's first `length` positions: views of its buffers, written through."""
        layer = copy.copy(self)
        layer.max_cache_len = length
        layer.pair = self.pair[..., :length, :]
        layer.keys, layer.values = self.keys[:, :, :length], self.values[:, :, :length]
        torch._dynamo.maybe_mark_dynamic(layer.keys, 2)
        torch._dynamo.maybe_mark_dynamic(layer.values, 2)
        return layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return self.write(self.start + torch.arange(key_states.shape[-2], device=self.keys.device), key_states,
                          value_states)

    def write(self, slots: torch.Tensor, key_states: torch.Tensor,
              value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [1, heads, w, head_dim] written at `slots` [w]; returns the buffers."""
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        return self.keys, self.values


class StaticKV(Cache):
    """A KV buffer of `capacity` positions allocated once (gpt-fast's static cache): a pass writes
    at `length` and on, and rollback only moves `length`, so whatever lies past it is stale and
    must never be attended to (the static pass's mask sees to it). `start` is `length` as a
    tensor at a fixed address, set before each pass, so one compiled graph serves every pass.
    Every layer's keys and values are slices of one tensor (`buffer` [layers, 2, 1, heads,
    capacity, head_dim]), so moving an accepted branch into place (`keep_positions`) is one copy
    for the whole model: on a GPU each copy is a kernel launch. With `per_layer` each layer has a
    buffer [2, 1, heads, capacity, head_dim] of its own (`buffer` None), for inductor: a graph
    whose cache writes are views of one tensor compiles about twice as slowly (reinplacing them
    grows with their square), and on a CPU a copy a layer costs next to nothing.
    `passes`: the compiled pass (`static.CompiledPass`) that runs this cache's passes, given when
    the cache is made (`static.request_cache`); None runs them eagerly.
    `buffer`: the one tensor to use, where its caller owns it (an exported pass takes it as an input).
    `rotary`: each position's rotary cosine and sine [capacity, 2, D] where the pass reads them from
    a table (`llama.rotary_table`, made with the buffer as gpt-fast makes its `freqs_cis` with its
    caches); None: the pass computes its own."""

    def __init__(self, model: PreTrainedModel, capacity: int, passes=None, rotary: torch.Tensor | None = None,
                 per_layer: bool = False, buffer: torch.Tensor | None = None):
        config = model.config.get_text_config(decoder=True)
        self.start = torch.zeros((), dtype=torch.long, device=model.device)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape, count = (2, 1, heads, capacity, head_dim), config.num_hidden_layers
        if buffer is None and not per_layer:
            buffer = torch.zeros(count, *shape, dtype=model.dtype, device=model.device)
        self.buffer = buffer
        pairs = [torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in range(count)] if per_layer \
            else self.buffer
        super().__init__(layers=[SlotLayer(capacity, self.start, pair) for pair in pairs])
        self.early_initialization(1, heads, head_dim, model.dtype, model.device)
        if model.device.type == "cuda":
            torch._dynamo.mark_static_address(self.start)
        for layer in self.layers:  # one compiled graph serves every capacity
            torch._dynamo.maybe_mark_dynamic(layer.keys, 2)
            torch._dynamo.maybe_mark_dynamic(layer.values, 2)
        if rotary is not None:
            torch._dynamo.maybe_mark_dynamic(rotary, 0)
        self.capacity = capacity
        self.length = 0
        self.passes, self.rotary = passes, rotary
        self.windows: dict[int, StaticKV] = {}  # by length, built once

    def window(self, length: int) -> "StaticKV":
        """The buffers' first `length` positions as a cache of their own, sharing `start` and
        `length`: views, so a pass through it writes here. A pass that attends over the window
        instead of the whole capacity reads only the positions that may be valid (on a CPU a
        pass's attention costs what it reads)."""
        if length >= self.capacity:
            return self
        if length not in self.windows:
            view = StaticKV.__new__(StaticKV)
            Cache.__init__(view, layers=[layer.window(length) for layer in self.layers])
            view.start, view.capacity, view.windows, view.passes = self.start, length, {}, self.passes
            view.rotary = self.rotary
            view.buffer = None if self.buffer is None else self.buffer[..., :length, :]
            self.windows[length] = view
        self.windows[length].length = self.length
        return self.windows[length]

    def shared(self, passes=None) -> "StaticKV":
        """A second handle on the same buffers and `start`, with a valid length of its own (0), run
        by `passes`: what a request gets of a buffer that outlives it (`graphs.CudaGraphs.lease`)."""
        view = StaticKV.__new__(StaticKV)
        Cache.__init__(view, layers=[copy.copy(layer) for layer in self.layers])
        view.start, view.capacity, view.windows, view.length, view.passes = self.start, self.capacity, {}, 0, passes
        view.rotary = self.rotary
        view.buffer = self.buffer
        return view

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length
