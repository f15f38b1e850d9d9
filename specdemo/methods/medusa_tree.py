"""Medusa's candidate trees as data: paths of top-k ranks, the tree they make, and which paths a pass takes.

The candidate tree (Cai et al. 2024, Sec. 2.1.2) is a list of paths of top-k indices, the
`medusa_choices` form: path (2, 0) is head 0's third-best token followed by head 1's best.

The tree is chosen afresh each pass by default (`tree="dynamic"`): the nodes whose paths the heads
are likeliest to get right at this step, by the product of their confidences (EAGLE-2's node
value), so a pass goes deep where the heads are sure and wide where they are not. A static tree
(`tree="static"`, the paths most often right on held-out answers) is the same every pass.
"""

import functools
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specdemo.core.errors import SpecDemoError, check_whole
from specdemo.core.verify import Proposal, leaf_paths, tree_depths
from specdemo.methods.medusa_heads import MedusaHeads

TREES = ("dynamic", "static", "chain")  # or a list of paths
MAX_TREE_SIZE = 128  # heads' nodes in a dynamic tree


@dataclass(frozen=True)
class Tree:
    """A candidate tree's shape. Node i follows `paths[i]`, the heads' nodes ordered by depth, so a
    parent always comes before its children; then `copy_depth` nodes chained from the root hold
    tokens copied from the text. Parent -1 is the root (the last committed token), as in every
    `verify.Proposal`: its mask, depths and candidates are functions of `parents` (`verify.tree_mask`)."""

    paths: tuple[tuple[int, ...], ...]
    copy_depth: int
    parents: tuple[int, ...]  # parent node of each node; -1 for the root
    top_k: tuple[int, ...]  # how many top tokens each head must supply

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> tuple[int, ...]:
        """Per node, its depth (1 for the root's children)."""
        return tree_depths(self.parents)

    @property
    def candidates(self) -> tuple[tuple[int, ...], ...]:
        """The path from the root's child to each leaf (`verify.leaf_paths`)."""
        return leaf_paths(self.parents)


@functools.lru_cache(maxsize=1024)  # dynamic trees of one size take a few hundred shapes
def cached_tree(choices: tuple[tuple[int, ...], ...], copy_depth: int = 0) -> Tree:
    """`build_tree`, once per distinct tree: every pass and run of that shape reuses it."""
    return build_tree(choices, copy_depth)


def build_tree(choices: Iterable[Sequence[int]], copy_depth: int = 0) -> Tree:
    """The tree for `choices` (the medusa_choices form), with a copied chain `copy_depth` long."""
    paths = sorted({tuple(int(i) for i in path) for path in choices}, key=lambda path: (len(path), path))
    if not paths or any(not path or min(path) < 0 for path in paths):
        raise SpecDemoError("a Medusa tree is a non-empty list of non-empty paths of top-k indices (0 = the best)")
    index = {(): -1, **{path: i for i, path in enumerate(paths)}}
    missing = [path for path in paths if path[:-1] not in index]
    if missing:
        raise SpecDemoError(f"the tree path {missing[0]} has no parent {missing[0][:-1]}: list every prefix too")
    copied = tuple(-1 if step == 0 else len(paths) + step - 1 for step in range(copy_depth))  # a chain from the root
    top_k = tuple(1 + max(path[d] for path in paths if len(path) > d) for d in range(max(map(len, paths))))
    return Tree(tuple(paths), copy_depth, (*(index[path[:-1]] for path in paths), *copied), top_k)


def dynamic_paths(log_probs: list[list[float]], size: int) -> tuple[tuple[int, ...], ...]:
    """The `size` rank paths likeliest to be accepted at this step, best first. A path's value is
    the product of its heads' confidences, log p_0(r_0) + ... + log p_d(r_d) (a node's value in
    EAGLE-2's dynamic draft tree, Li et al. 2024, Sec. 4.1; Medusa's heads guess every position
    from the same hidden state, so this treats their guesses as independent). `log_probs` [K][R]:
    head k's log-probability of its r-th best token, best first.

    Best-first search over the paths: each path enters the frontier when its elder sibling
    (for rank r > 0) or its parent (for rank 0) is taken, and neither is worth less than it,
    so paths are taken in order of value and every prefix of the result is a tree."""
    value = lambda path: sum(log_probs[depth][rank] for depth, rank in enumerate(path))  # noqa: E731
    frontier, chosen = [(-value((0,)), (0,))], []
    while frontier and len(chosen) < size:
        _, path = heapq.heappop(frontier)
        chosen.append(path)
        depth, rank = len(path) - 1, path[-1]
        successors = []
        if rank + 1 < len(log_probs[depth]):
            successors.append((*path[:-1], rank + 1))  # the next sibling: this head's next token
        if depth + 1 < len(log_probs):
            successors.append((*path, 0))  # the first child: the next head's best token
        for successor in successors:
            heapq.heappush(frontier, (-value(successor), successor))
    return tuple(chosen)


def proposal(tree: Tree, tokens: list[int], copy_source: str = "copy") -> Proposal:
    """The proposal of a tree whose node i holds `tokens[i]`; its copied chain came from
    `copy_source` ("copy" or "retrieved")."""
    sources = ("head",) * len(tree.paths) + (copy_source,) * tree.copy_depth
    return Proposal(tuple(tokens), tree.parents, sources)


def resolve_tree(heads: MedusaHeads, tree: str | Iterable[Sequence[int]], tree_size: int | None) -> Tree:
    """The static tree for a `tree` setting other than "dynamic"."""
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
    if tree_size is not None:
        check_tree_size(tree_size, len(paths), "this tree's size")
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


def tree_tokens(tree: Tree, top: list[list[int]]) -> list[int]:
    """The token at each heads' node: for path p, head len(p)-1's p[-1]-th best token."""
    return [top[len(path) - 1][path[-1]] for path in tree.paths]
