"""Medusa's candidate trees as data: paths of top-k ranks, the tree shape they make, and which paths a pass takes.

The candidate tree (Cai et al. 2024, Sec. 2.1.2) is a list of paths of top-k indices, the
`medusa_choices` form: path (2, 0) is head 0's third-best token followed by head 1's best.
Its shape is a `verify.Proposal` like every tree, whose tokens are ranks: heads' node i (source
"head") holds the rank r of its path's last step, the guess it takes from head depth - 1's r-th
best; after them a chain of "copy" nodes from the root keeps places for tokens copied from the
text (rank 0 until `filled`). Its paths (`rank_paths`), the guesses each head must give
(`top_ranks`), its mask, depths and candidates are pure functions of it (`verify.tree_mask`).

The tree is chosen afresh each pass by default (`tree="dynamic"`): the nodes whose paths the heads
are likeliest to get right at this step, by the product of their confidences (EAGLE-2's node
value), so a pass goes deep where the heads are sure and wide where they are not. A static tree
(`tree="static"`, the paths most often right on held-out answers) is the same every pass.
"""

import functools
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch

from specdemo.core.errors import SpecDemoError, check_whole
from specdemo.core.transfer import tensor_on
from specdemo.core.verify import Proposal
from specdemo.methods.medusa_heads import MedusaHeads

TREES = ("dynamic", "static", "chain")  # or a list of paths
MAX_TREE_SIZE = 128  # heads' nodes in a dynamic tree


@functools.lru_cache(maxsize=1024)  # dynamic trees of one size take a few hundred shapes
def cached_tree(choices: tuple[tuple[int, ...], ...], copy_depth: int = 0) -> Proposal:
    """`build_tree`, once per distinct tree: every pass and run of that shape reuses it."""
    return build_tree(choices, copy_depth)


def build_tree(choices: Iterable[Sequence[int]], copy_depth: int = 0) -> Proposal:
    """The shape for `choices` (the medusa_choices form), with a copied chain `copy_depth` long: the
    heads' nodes ordered by depth, then by path, so a parent always comes before its children."""
    paths = sorted({tuple(int(i) for i in path) for path in choices}, key=lambda path: (len(path), path))
    if not paths or any(not path or min(path) < 0 for path in paths):
        raise SpecDemoError("a Medusa tree is a non-empty list of non-empty paths of top-k indices (0 = the best)")
    index = {(): -1, **{path: i for i, path in enumerate(paths)}}
    missing = [path for path in paths if path[:-1] not in index]
    if missing:
        raise SpecDemoError(f"the tree path {missing[0]} has no parent {missing[0][:-1]}: list every prefix too")
    copied = tuple(-1 if step == 0 else len(paths) + step - 1 for step in range(copy_depth))  # a chain from the root
    ranks = (*(path[-1] for path in paths), *(0,) * copy_depth)
    parents = (*(index[path[:-1]] for path in paths), *copied)
    return Proposal(ranks, parents, ("head",) * len(paths) + ("copy",) * copy_depth)


@functools.lru_cache(maxsize=1024)
def rank_paths(shape: Proposal) -> tuple[tuple[int, ...], ...]:
    """The rank path (the medusa_choices form) of each heads' node of a shape, in node order."""
    heads = shape.sources.count("head")
    return tuple(tuple(shape.tokens[n] for n in shape.ancestry(node)) for node in range(heads))


@functools.lru_cache(maxsize=1024)
def top_ranks(shape: Proposal) -> tuple[int, ...]:
    """How many top tokens each head must supply to fill a shape: 1 + the largest rank at its depth."""
    paths = rank_paths(shape)
    return tuple(1 + max(path[d] for path in paths if len(path) > d) for d in range(max(map(len, paths))))


def dynamic_paths(log_probs: list[list[float]], size: int) -> tuple[tuple[int, ...], ...]:
    """The `size` rank paths likeliest to be accepted at this step, best first. A path's value is
    the product of its heads' confidences, log p_0(r_0) + ... + log p_d(r_d) (a node's value in
    EAGLE-2's dynamic draft tree, Li et al. 2024, Sec. 4.1; Medusa's heads guess every position
    from the same hidden state, so this treats their guesses as independent). `log_probs` [K][R]:
    head k's log-probability of its r-th best token, best first.

    Best-first search over the paths: each path enters the frontier when its elder sibling
    (for rank r > 0) or its parent (for rank 0) is taken, and neither is worth less than it,
    so paths are taken in order of value and every prefix of the result is a tree."""
    # (-value, path, its parent's value): a value is summed root first, as a path's own sum would be
    frontier, chosen = [(-(0.0 + log_probs[0][0]), (0,), 0.0)], []
    while frontier and len(chosen) < size:
        value, path, above = heapq.heappop(frontier)
        chosen.append(path)
        depth, rank = len(path) - 1, path[-1]
        if rank + 1 < len(log_probs[depth]):  # the next sibling: this head's next token
            heapq.heappush(frontier, (-(above + log_probs[depth][rank + 1]), (*path[:-1], rank + 1), above))
        if depth + 1 < len(log_probs):  # the first child: the next head's best token
            heapq.heappush(frontier, (value - log_probs[depth + 1][0], (*path, 0), -value))
    return tuple(chosen)


def filled(shape: Proposal, tokens: Sequence[int], copy_source: str = "copy") -> Proposal:
    """The proposal of a shape whose node i holds `tokens[i]`: the heads' tokens, then the copied
    chain's, which came from `copy_source` ("copy" or "retrieved")."""
    sources = tuple(copy_source if source == "copy" else source for source in shape.sources)
    return Proposal(tuple(tokens), shape.parents, sources)


def resolve_tree(heads: MedusaHeads, tree: str | Iterable[Sequence[int]], tree_size: int | None) -> Proposal:
    """The static tree's shape for a `tree` setting other than "dynamic"."""
    chain_paths = [[0] * depth for depth in range(1, heads.num_heads + 1)]
    if tree == "static":
        paths = heads.choices or chain_paths
        tree_size = tree_size or heads.default_tree_size
    elif tree == "chain":
        paths = chain_paths
    elif isinstance(tree, str):
        raise SpecDemoError(f"tree must be one of {', '.join(TREES)} or a list of paths, got {tree!r}")
    else:
        paths = list(tree)
    if tree_size is not None:  # at most the whole tree: a device's default size is a dynamic tree's (`defaults`)
        check_tree_size(tree_size, MAX_TREE_SIZE, "a static tree's first paths, at most all of them")
        paths = paths[:tree_size]
    return cached_tree(tuple(tuple(path) for path in paths))


def check_dynamic_size(heads: MedusaHeads, tree_size: int | None) -> int:
    """The heads' nodes of a dynamic tree: `tree_size`, else as many as the heads' default static tree."""
    if tree_size is None:
        return heads.default_tree_size or len(heads.choices or ()) or heads.num_heads
    check_tree_size(tree_size, MAX_TREE_SIZE, "the most a dynamic tree takes")
    return tree_size


def check_tree_size(tree_size: int, largest: int, what: str) -> None:
    check_whole("tree_size", tree_size, 1, largest, what)


def gather_index(shape: Proposal, width: int, device: torch.device) -> torch.Tensor:
    """Where each heads' node of a shape takes its token among the heads' `width` best each,
    flattened (`MedusaHeads.ranked` [K, width]): for rank r at depth d, (d - 1) * width + r; on `device`."""
    depths = shape.depths
    return tensor_on([(depths[node] - 1) * width + shape.tokens[node] for node in range(shape.sources.count("head"))],
                     device)


def on_device(shape: Proposal, ranked: torch.Tensor, copied: list[int], copy_source: str = "copy",
              index: torch.Tensor | None = None) -> Proposal:
    """`filled` without a read: the proposal of a shape whose heads' tokens are gathered on the
    device from `ranked` [K, R] (each head's R best, `MedusaHeads.ranked`) at `index` (`gather_index`,
    made here where None), then the copied chain's; the host reads them with the target's choices
    (`verify.read_with_choices`)."""
    index = gather_index(shape, ranked.shape[1], ranked.device) if index is None else index
    tokens = torch.cat([ranked.view(-1).index_select(0, index), tensor_on(copied, ranked.device)])
    return replace(filled(shape, (), copy_source), on_device=tokens)


def head_tokens(shape: Proposal, top: list[list[int]]) -> list[int]:
    """The token at each heads' node of a shape: for rank r at depth d, head d - 1's r-th best (`top` [K][R])."""
    depths = shape.depths
    return [top[depths[node] - 1][shape.tokens[node]] for node in range(shape.sources.count("head"))]
