"""Attention masks for passes that feed several branches at once (trees, windows, candidates).

A pass appends q new tokens after a cache of `prefix_length` tokens. Every new token sees the
whole prefix; among the new tokens, token i sees token j exactly when `sees[i, j]` is True
(itself included). Its position id is its depth in its own chain, so each branch is laid out
as if it were the only continuation (Medusa's tree attention, Cai et al. 2024, Sec. 2.1.2;
Lookahead decoding's two branches, Fu et al. 2024, Fig. 3).

A pass's layout (what each token sees, its positions) is host data, built from the tree's parents
as numpy arrays, whose small operations cost the host less than torch's and which no reader
mistakes for tensors on the device; it becomes a tensor where a pass reads it (`static.padded_layout`,
and transformers' mask and position ids on the eager path).
"""

import numpy as np
import torch


def additive_mask(sees: np.ndarray, prefix_length: int, dtype: torch.dtype) -> torch.Tensor:
    """A 4D mask [1, 1, q, prefix_length + q] on the CPU for `sees` [q, q] (bool): 0 where a query
    may attend, the dtype's lowest value where it may not (transformers adds it to the scores,
    for eager and SDPA attention alike)."""
    q = sees.shape[0]
    return additive(torch.from_numpy(np.concatenate([np.ones((q, prefix_length), dtype=bool), sees], axis=-1)), dtype)


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 4D mask [1, 1, q, k] for `allowed` [q, k] (bool): 0 where a query may attend, the
    dtype's lowest value where it may not."""
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)[None, None]


def chain_positions(sees: np.ndarray, prefix_length: int) -> np.ndarray:
    """Position ids [q] (int64) for `sees` [q, q]: prefix_length + (number of new tokens a token
    sees, minus one)."""
    return prefix_length - 1 + sees.sum(axis=-1, dtype=np.int64)


def sees_from_parents(parents: list[int]) -> np.ndarray:
    """`sees` [q, q] (bool) for a forest given as each new token's parent index (-1: the prefix):
    a token sees itself and its ancestors. Each row is a copy of its parent's: a few operations a
    row, not one a token."""
    sees = np.zeros((len(parents), len(parents)), dtype=bool)
    for i, parent in enumerate(parents):
        if parent >= i:
            raise ValueError(f"token {i}'s parent {parent} must come before it")
        if parent >= 0:
            sees[i] = sees[parent]
        sees[i, i] = True
    return sees
