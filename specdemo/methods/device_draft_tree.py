"""EAGLE-2's dynamic draft tree grown on the device: every level in one CUDA graph, read once.

`draft_tree.grow` chooses each level's nodes on the host, so a step waits for the draft once a
level. EAGLE-2's own implementation grows the tree on the GPU instead: each level expands the
`top_k` nodes of highest value among the last level's children, each into its `top_k` best
children, then reranks every candidate (`draft_tree.best_nodes`). Here that growth is one graph
of the draft's buffer (`graphs.CudaGraphs.functions`), its layouts built on the device from the
chosen nodes, and the graph reranks the candidates too: the host reads the tree once. Rules:

- The tree equals `draft_tree.grow`'s: the same nodes are expanded in the same order (a level's
  best first), a node ending the answer is not expanded (its children get no value and are
  dropped), and the rerank is the same. `grow` skips a level no node of which could still be
  kept; here every level runs (fixed shapes), and what it adds the rerank drops.
- One graph for each depth, top-k and size: a step that keeps fewer levels (near an answer's
  end) runs them all and gives the deeper levels' candidates no value, so no graph is captured
  mid-answer.
- A level's nodes sit at the position after their parents' and are written after the nodes fed
  before them; each sees the prefix, its ancestors among them, and itself.
- The graph keeps the candidates of highest value for the largest tree a step may take (`most`),
  and the host cuts them to the step's size once it knows it (`read_tree`): the graph is queued
  before the host guesses a copied branch, whose length sets that size, and one graph serves
  every size.
- Only a feature draft on its graphs' buffer grows this way (`static_draft_tree.level_graphs`);
  elsewhere the host grows the tree.
"""

import math
from typing import NamedTuple

import torch
from transformers import Cache

from specdemo.core.graphs import PassLayout
from specdemo.core.transfer import tensor_on
from specdemo.core.verify import Proposal
from specdemo.methods.draft import Draft
from specdemo.methods.draft_tree import best_children
from specdemo.methods.eagle import FeatureDraft
from specdemo.methods.static_draft_tree import level_graphs


class Candidates(NamedTuple):
    """A tree's candidates on the device, as the graph left them, in the order `draft_tree.best_nodes`
    keeps them: one table [3, n] of their tokens, values and parents (-1: the root's children), in
    float64, which holds every token id, parent and float32 value exactly, so that the host reads
    them in one copy (on a GPU each copy to the host waits for the device)."""

    table: torch.Tensor

    @classmethod
    def of(cls, tokens: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor) -> "Candidates":
        return cls(torch.stack([tokens.double(), scores.double(), parents.double()]))


def device_grow(draft: Draft | FeatureDraft, cache: Cache, first: tuple[torch.Tensor, torch.Tensor | None], *,
                depth: int, top_k: int, most: int, eos: tuple[int, ...] = (), levels: int | None = None
                ) -> Candidates | None:
    """The candidates of the draft tree `draft_tree.grow` grows `levels` deep (default `depth`) after
    the draft's `first_logits` (`first`) with `top_k` children a node, the `most` of highest value,
    grown in one graph of the CUDA graphs whose buffer the draft's `cache` is a view of and left on
    the device, queued (`read_tree` reads a tree of any size up to `most`); None where the draft
    cannot grow it there (`static_draft_tree.level_graphs`). The graph runs `depth` levels whatever
    `levels` keeps (an input of the graph: a deeper level's candidates get no value), so the graph
    captured for a step of `depth` serves the shallower steps near an answer's end too. The draft's
    cache keeps its length: what the levels wrote lies past it."""
    levels = depth if levels is None else levels
    logits, state = first
    k = min(top_k, logits.shape[-1])
    prefix = cache.get_seq_length()
    reach = prefix + (depth - 1) * k  # the levels' nodes in the draft's cache: the root's children, then k a level
    graphs = level_graphs(draft, cache, reach)
    if graphs is None:
        return None
    forward, span = cache.passes.forward, graphs.window(reach)
    cache = graphs.cache.window(span)

    def grown(logits: torch.Tensor, state: torch.Tensor, numbers: torch.Tensor):  # run once, as the graph captures
        decoder, (prefix, kept_levels) = draft.model.get_decoder(), (numbers[:1], numbers[1:])
        ids, log_probs = best_children(logits, k, draft.token_ids)  # [1, k]
        tokens, scores, chosen = [ids.view(-1)], [log_probs.view(-1)], []
        # made once for every level, each of k nodes: the slots after the prefix (a level's position
        # is one of them too), what a node sees of itself and the frame around it, each candidate's
        # parent's row among its level's states
        after = prefix + torch.arange((depth - 1) * k, device=logits.device)
        itself = torch.eye(k, dtype=torch.bool, device=logits.device)
        framing = itself.new_ones(k, 1), itself.new_zeros(k, 1)
        children_rows = torch.arange(k, device=logits.device)[:, None].expand(k, k).reshape(-1)
        rows, first = torch.zeros_like(tokens[0]), prefix[0] - 1
        seen = itself[:, :0]  # [k, written]: what each node of the last pass saw of the nodes fed before it
        for level in range(2, depth + 1):
            value = scores[-1]
            for token in eos:  # a node that ends the answer is not expanded
                value = value.masked_fill(tokens[-1] == token, -math.inf)
            value, best = value.topk(k)  # best first
            parent_rows, written = rows.index_select(0, best), seen.shape[1]
            sees = torch.cat([framing[0], seen.index_select(0, parent_rows), itself, framing[1]], dim=1)
            layout = PassLayout(after[level - 2].expand(1, k), after[written], first,
                                after[written : written + k], sees)
            cache.start.copy_(layout.start)
            inputs = draft.fuse(state.index_select(0, parent_rows)[None], tokens[-1].index_select(0, best)[None])
            state = forward(decoder, cache, inputs, layout)[0]  # [k, H]
            ids, log_probs = best_children(draft.logits(state), k, draft.token_ids)  # [k, k]
            tokens.append(ids.view(-1))
            scores.append((value[:, None] + log_probs).view(-1).masked_fill(kept_levels < level, -math.inf))
            chosen.append(best)
            rows, seen = children_rows, sees[:, 1:-1]
        return Candidates.of(*preselected(torch.cat(tokens), torch.cat(scores), tree_parents(chosen, tokens[0]),
                                          most))

    key = ("dynamic draft tree", depth, k, eos, span, most)
    return Candidates(*graphs.functions(key, grown, logits, state, tensor_on([prefix, levels], logits.device)))


def tree_parents(chosen: list[torch.Tensor], root_children: torch.Tensor) -> torch.Tensor:
    """Each candidate's parent among all candidates, -1 for the root's k children
    (`root_children` [k]), where from the second level on each level expands the k candidates
    `chosen` [k] of the level before into k children each: that level's candidates start after
    the root's children, k * k a level."""
    k = root_children.shape[0]
    root = torch.full_like(root_children, -1)
    if not chosen:
        return root
    chosen = torch.stack(chosen)  # [levels, k]
    start = torch.arange(k - k * k, k - k * k + chosen.shape[0] * k * k, k * k, device=chosen.device).clamp_(min=0)
    return torch.cat([root, (chosen + start[:, None])[:, :, None].expand(-1, k, k).reshape(-1)])


def preselected(tokens: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor,
                size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `size` candidates of highest value (all, where there are fewer), in their order, their
    parents renumbered among them: those `draft_tree.best_nodes` keeps, ties going to the earlier
    candidate (so the shallower: candidates come level by level). A candidate's value is at most
    its parent's, so each comes with its parent, and the host reads `size` candidates, not all.
    Ascending, they are also in `best_nodes`' order: parents first, level by level."""
    if size >= scores.shape[0]:
        return tokens, scores, parents
    kept = scores.sort(descending=True, stable=True).indices[:size].sort().values
    parents = parents.index_select(0, kept)
    # a kept parent's place among the kept (ascending): where it sorts in
    parents = torch.where(parents < 0, parents, torch.searchsorted(kept, parents))
    return tokens.index_select(0, kept), scores.index_select(0, kept), parents


def read_tree(candidates: Candidates, size: int) -> Proposal:
    """The tree of the `size` candidates of highest value among those `preselected` kept, read on
    the host, ties going to the earlier, less those below a node that ends the answer (no value):
    `draft_tree.best_nodes`' rerank, in its order. Each comes with its parent, which is earlier
    and of at least its value."""
    tokens, scores, parents = candidates.table.tolist()
    best = sorted(range(len(scores)), key=lambda node: -scores[node])[:size]  # stable: ties keep their order
    kept = [node for node in sorted(best) if scores[node] > -math.inf]
    index = {node: i for i, node in enumerate(kept)}
    return Proposal(tuple(int(tokens[n]) for n in kept), tuple(index.get(int(parents[n]), -1) for n in kept),
                    ("draft",) * len(kept), scores=tuple(scores[n] for n in kept))
