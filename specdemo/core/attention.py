"""Attention masks for passes that feed several branches at once (trees, windows, candidates).

A pass appends q new tokens after a cache of `prefix_length` tokens. Every new token sees the
whole prefix; among the new tokens, token i sees token j exactly when `sees[i, j]` is True
(itself included). Its position id is its depth in its own chain, so each branch is laid out
as if it were the only continuation (Medusa's tree attention, Cai et al. 2024, Sec. 2.1.2;
Lookahead decoding's two branches, Fu et al. 2024, Fig. 3).
"""

import numpy as np
import torch


def additive_mask(sees: torch.Tensor, prefix_length: int, dtype: torch.dtype) -> torch.Tensor:
    """A 4D mask [1, 1, q, prefix_length + q] for `sees` [q, q] (bool): 0 where a query may
    attend, the dtype's lowest value where it may not (transformers adds it to the scores,
    for eager and SDPA attention alike)."""
    q = sees.shape[0]
    return additive(torch.cat([sees.new_ones(q, prefix_length), sees], dim=-1), dtype)


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 4D mask [1, 1, q, k] for `allowed` [q, k] (bool): 0 where a query may attend, the
    dtype's lowest value where it may not."""
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)[None, None]


def chain_positions(sees: torch.Tensor, prefix_length: int) -> torch.Tensor:
    """Position ids [1, q] on the CPU for `sees` [q, q] on the CPU: prefix_length + (number of new
    tokens a token sees, minus one). In numpy: no torch operation for the host to dispatch."""
    return torch.from_numpy(prefix_length - 1 + sees.numpy().sum(axis=-1, dtype=np.int64))[None]


def sees_from_parents(parents: list[int]) -> torch.Tensor:
    """`sees` [q, q] for a forest given as each new token's parent index (-1: the prefix):
    a token sees itself and its ancestors. Built on the CPU in numpy, each row a copy of its
    parent's: a few operations a row, not one a token."""
    sees = np.zeros((len(parents), len(parents)), dtype=bool)
    for i, parent in enumerate(parents):
        if parent >= i:
            raise ValueError(f"token {i}'s parent {parent} must come before it")
        if parent >= 0:
            sees[i] = sees[parent]
        sees[i, i] = True
    return torch.from_numpy(sees)
