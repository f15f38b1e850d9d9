"""KV-cache rollback: the one way a cache moves back after a verification pass.

Invariant: a method's cache holds keys and values for exactly the first `length` tokens it has
been fed that are still valid; whatever a rejected proposal wrote past them is dropped here
before the next pass, so it is never attended to.
"""

from collections.abc import Sequence

import torch
from transformers import Cache, DynamicCache


def keep_prefix(cache: Cache, length: int) -> None:
    """Keep the first `length` positions of every layer; drop the rest (rejected proposals)."""
    excess = cache.get_seq_length() - length
    if excess < 0:
        raise ValueError(f"cannot keep {length} positions of a cache that holds {cache.get_seq_length()}")
    cache.crop(-excess)


def keep_positions(cache: DynamicCache, length: int, positions: Sequence[int]) -> None:
    """Keep the first `length` positions, then the entries at `positions` (ascending, all at or
    past `length`) moved right after them: the accepted branch of a pass that fed several
    branches at once (a Medusa tree, a lookahead window beside its candidates)."""
    positions = list(positions)
    if positions != list(range(length, length + len(positions))):
        index = torch.tensor(positions, device=cache.layers[0].keys.device)
        for layer in cache.layers:  # copy only the kept entries into place; the crop drops the rest
            layer.keys[..., length : length + len(positions), :] = layer.keys.index_select(-2, index)
            layer.values[..., length : length + len(positions), :] = layer.values.index_select(-2, index)
    keep_prefix(cache, length + len(positions))
