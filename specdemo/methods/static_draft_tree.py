"""A static draft tree: one shape every pass, drafted and verified without a read on the host.

EAGLE-1 (Li, Wei, Zhang & Zhang 2024, Sec. 3.3) drafts a tree of a fixed shape; vLLM takes such
a shape as rank paths (`speculative_token_tree`), the form of Medusa's `medusa_choices`: path
(1, 0) is the draft's second-best token after the root followed by its best after that. A node
at depth d is the draft's top-r token after its parent, r its path's last rank.

The shape is known before the step, so nothing about it needs a token on the host: the draft's
passes take each level's tokens and states from the last by fixed indices, on the device, and
the target's pass is queued right after them. The host reads the tree with the target's choices
(`verify.read_with_choices`): on a GPU a step waits once, whatever the tree's depth, and builds
no tree while the device idles. Rules:

- The draft's first pass (`draft_tree.first_logits`) gives the root's children; one pass a level
  after it feeds every node of that level that has children, each seeing the prefix, its
  ancestors and itself, at its own depth's position (`draft_tree.branch_visibility`).
- Every pass takes the same number of best tokens of each row (`StaticPlan.width`), so a level's
  tokens are one gather of the last pass's, and the tree's one gather of all passes'.
- The tree a step drafts is the shape's, whatever the draft's confidences (EAGLE-2's dynamic tree
  drops what the draft is unsure of; here nothing is dropped, and nothing is waited for).
- `full_paths(top_k, depth)`: every node with its draft's `top_k` best children, `depth` deep.
- With CUDA graphs a feature draft's levels after the first pass are one graph, replayed with the
  levels' layouts as its one input (`graphed_levels`); they draft what the passes a level draft.
"""

import functools
import itertools
from dataclasses import dataclass, replace

import numpy as np
import torch
from transformers import Cache

from specdemo.core.graphs import CudaGraphs, layout_views
from specdemo.core.kvcache import keep_prefix
from specdemo.core.static import padded_layout
from specdemo.core.transfer import tensor_on, to_device
from specdemo.core.verify import Proposal
from specdemo.methods.draft import Draft
from specdemo.methods.draft_tree import best_children, branch_logits, branch_visibility
from specdemo.methods.eagle import FeatureDraft
from specdemo.methods.medusa_tree import cached_tree, top_ranks

Paths = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Level:
    """One draft pass after the first: the nodes it feeds (a level's nodes that have children) and
    where their tokens and states lie in the pass before's outputs."""

    nodes: tuple[int, ...]
    tokens: tuple[int, ...]  # each node's index into the pass before's best tokens, flattened [rows * width]
    rows: tuple[int, ...]  # each node's parent's row in the pass before (the state it followed)
    sees: np.ndarray  # [q, fed before + q] what each sees of the nodes fed before it and of its own


@dataclass(frozen=True)
class StaticPlan:
    """How a shape is drafted: the best tokens each row of a pass gives, the passes after the first,
    and each node's index into all passes' best tokens, flattened in pass order."""

    paths: Paths
    shape: Proposal  # ranks as tokens (`medusa_tree.build_tree`)
    width: int
    levels: tuple[Level, ...]
    nodes: tuple[int, ...]


def full_paths(top_k: int, depth: int) -> Paths:
    """Every rank path of up to `depth` steps of ranks below `top_k`: the full tree."""
    return tuple(path for length in range(1, depth + 1) for path in itertools.product(range(top_k), repeat=length))


@functools.lru_cache(maxsize=64)
def static_plan(paths: Paths) -> StaticPlan:
    """The plan of the shape that `paths` make (every path's prefix among them)."""
    shape = cached_tree(paths)
    width, depths = max(top_ranks(shape)), shape.depths
    row, fed, levels = {-1: 0}, [], []  # row: each fed node's row in its pass (the root's in the first)
    for depth in range(2, max(depths) + 1):
        nodes = tuple(n for n in range(shape.size) if depths[n] == depth - 1 and n in shape.parents)
        parent_rows = tuple(row[shape.parents[n]] for n in nodes)
        row.update((node, i) for i, node in enumerate(nodes))
        levels.append(Level(nodes, tuple(r * width + shape.tokens[n] for r, n in zip(parent_rows, nodes)), parent_rows,
                            read_only(branch_visibility(shape, fed, list(nodes)))))
        fed.extend(nodes)
    # pass p's best tokens start at width * (the rows of the passes before it)
    offsets = width * np.cumsum([0, 1, *(len(level.nodes) for level in levels)])
    nodes = tuple(int(offsets[depths[n] - 1]) + row[shape.parents[n]] * width + shape.tokens[n]
                  for n in range(shape.size))
    return StaticPlan(paths, shape, width, tuple(levels), nodes)


def read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


Index = int | torch.Tensor  # n: a flat tensor's first n entries in order (a slice), else the entries' indices


@dataclass(frozen=True)
class StaticTree:
    """A static tree ready for a request: its plan and the plan's indices on the device, made once
    (`prepare`), so that a step copies no index to the device."""

    plan: StaticPlan
    tokens: tuple[Index, ...]  # each level's `Level.tokens`
    rows: tuple[Index, ...]  # each level's `Level.rows` but the first's (whose nodes all follow the root)
    nodes: Index

    @property
    def depth(self) -> int:
        return max(self.plan.shape.depths)


def prepare(paths: Paths, device: torch.device) -> StaticTree:
    """The static tree of `paths` for requests on `device`."""
    plan = static_plan(paths)

    def index(entries: tuple[int, ...]) -> Index:
        return len(entries) if entries == tuple(range(len(entries))) else tensor_on(list(entries), device)

    return StaticTree(plan, tuple(index(level.tokens) for level in plan.levels),
                      tuple(index(level.rows) for level in plan.levels[1:]), index(plan.nodes))


def taken(values: torch.Tensor, index: Index) -> torch.Tensor:
    return values[:index] if isinstance(index, int) else values.index_select(0, index)


def static_tree(draft: Draft | FeatureDraft, cache: Cache, first: tuple[torch.Tensor, torch.Tensor | None],
                tree: StaticTree, copied: list[int], source: str) -> tuple[Proposal, torch.Tensor]:
    """The static `tree` after the draft's `first_logits`, then the `copied` branch from the root
    (`source`: "copy" or "retrieved"): its tokens and each drafted node's own log-probability after
    its parent, both on the device. Nothing is read on the host. The draft's cache ends holding
    the prefix only. A feature draft on its CUDA graphs' buffer drafts every level in one graph
    (`graphed_levels`); otherwise each level is a pass of its own."""
    plan = tree.plan
    logits, state = first
    prefix = cache.get_seq_length()
    graphs = level_graphs(draft, cache, prefix + sum(len(level.nodes) for level in plan.levels))
    if graphs is not None:
        ids, log_probs = graphed_levels(graphs, draft, cache.passes.forward, tree, logits, state, prefix)
    else:
        def level_logits(depth: int, level: Level, tokens: torch.Tensor, states: torch.Tensor | None):
            return branch_logits(draft, cache, tokens, states, sees=level.sees,
                                 position_ids=np.full(len(level.nodes), prefix + depth - 1))

        ids, log_probs = drafted_levels(draft, tree, logits, state, level_logits)
    keep_prefix(cache, prefix)
    tokens = torch.cat([ids, tensor_on(copied, logits.device)])
    shape = cached_tree(plan.paths, len(copied))  # the same nodes, then the copied chain from the root
    sources = tuple("draft" if kind == "head" else source for kind in shape.sources)
    return Proposal(parents=shape.parents, sources=sources, on_device=tokens), log_probs


def drafted_levels(draft: Draft | FeatureDraft, tree: StaticTree, logits: torch.Tensor, state: torch.Tensor | None,
                   level_logits) -> tuple[torch.Tensor, torch.Tensor]:
    """Every drafted node's token and own log-probability [n], from the first pass's `logits` [1, K]
    (and a feature draft's predicted `state` [1, H]) and one `level_logits(depth, level, tokens,
    states)` a level after it (the draft's logits [q, K] and predicted states after the level's
    `tokens` [q], each following its parent's `states` [q, H])."""
    plan = tree.plan
    ids, log_probs = best_children(logits, plan.width, draft.token_ids)  # [1, R]
    all_ids, all_log_probs = [ids.view(-1)], [log_probs.view(-1)]
    for depth, (level, tokens) in enumerate(zip(plan.levels, tree.tokens, strict=True), start=1):
        if state is not None:  # the features each node followed: the root's, then its parent's
            state = state.expand(len(level.nodes), -1) if depth == 1 else taken(state, tree.rows[depth - 2])
        logits, state = level_logits(depth, level, taken(all_ids[-1], tokens), state)
        ids, log_probs = best_children(logits, plan.width, draft.token_ids)  # [q, R]
        all_ids.append(ids.view(-1))
        all_log_probs.append(log_probs.view(-1))
    return taken(torch.cat(all_ids), tree.nodes), taken(torch.cat(all_log_probs), tree.nodes)


def level_graphs(draft: Draft | FeatureDraft, cache: Cache, reach: int) -> CudaGraphs | None:
    """The CUDA graphs whose buffer `cache` is a view of, where a feature draft's levels may run as
    one graph of them: the pass is graphed and the levels' nodes, written from the prefix on, end
    at `reach` within the buffer. None: each level runs as a pass of its own."""
    passes = getattr(cache, "passes", None)
    if (not isinstance(draft, FeatureDraft) or passes is None or passes.graphs is None or not passes.serves(cache)
            or reach > passes.graphs.cache.capacity):
        return None
    return passes.graphs


def level_layouts(plan: StaticPlan, prefix: int) -> tuple[torch.Tensor, list[slice]]:
    """Every level's layout (`static.padded_layout`, unpadded: the graph has each level's shape)
    after `prefix` positions, as one byte buffer on the CPU, and where each lies in it (from a
    multiple of 8 bytes, where its int64 part may be viewed): a level's nodes sit at the position
    after their parents' and are written after the levels fed before, at which they look back."""
    layouts, fed = [], 0
    for depth, level in enumerate(plan.levels, start=1):
        width = len(level.nodes)
        layouts.append(padded_layout(np.full(width, prefix + depth - 1), level.sees, width, fed, prefix + fed))
        fed += width
    starts = (8 * np.cumsum([0, *(-(-layout.shape[0] // 8) for layout in layouts)])).tolist()
    joined = torch.zeros(max(starts[-1], 8), dtype=torch.uint8)
    bounds = [slice(start, start + layout.shape[0]) for start, layout in zip(starts, layouts)]
    for bound, layout in zip(bounds, layouts):
        joined[bound] = layout
    return joined, bounds


def graphed_levels(graphs: CudaGraphs, draft: FeatureDraft, forward, tree: StaticTree, logits: torch.Tensor,
                   state: torch.Tensor, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`drafted_levels` replayed as one CUDA graph of `graphs` (`graphs.FunctionGraphs`), the
    levels' passes `forward` (the draft's `static.CompiledPass.forward`) over the graphs' buffer:
    on a GPU one launch for every level after the first pass, where each level took a dozen. The
    levels' layouts are its input, one copy; its function holds the tree's indices."""
    layouts, bounds = level_layouts(tree.plan, prefix)
    span = graphs.window(prefix + sum(len(level.nodes) for level in tree.plan.levels))
    cache = graphs.cache.window(span)

    def draft_tree(logits: torch.Tensor, state: torch.Tensor, layouts: torch.Tensor):  # run once, as it is captured
        decoder = draft.model.get_decoder()

        def level_logits(depth: int, level: Level, tokens: torch.Tensor, states: torch.Tensor):
            views = layout_views(layouts[bounds[depth - 1]], len(level.nodes))
            cache.start.copy_(views.start)
            predicted = forward(decoder, cache, draft.fuse(states[None], tokens[None]), views)[0]  # [q, H]
            return draft.logits(predicted), predicted

        return drafted_levels(draft, tree, logits, state, level_logits)

    return graphs.functions(("static draft tree", tree.plan.paths, span), draft_tree, logits, state,
                            to_device(layouts, logits.device))


def static_values(tree: Proposal, log_probs: torch.Tensor) -> Proposal:
    """A static tree read on the host (`verify.read_with_choices`) with its nodes' values, for its
    event, from the drafted nodes' `log_probs` (on a device done by then): a node's value is its
    parent's plus its own log-probability, as in `draft_tree.add_children`; a copied node has none
    of its own and takes its parent's."""
    own = log_probs.tolist()
    values: list[float] = []
    for node, parent in enumerate(tree.parents):
        values.append((own[node] if node < len(own) else 0.0) + (values[parent] if parent >= 0 else 0.0))
    return replace(tree, scores=tuple(values))
