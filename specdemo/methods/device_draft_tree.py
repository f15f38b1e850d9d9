"""EAGLE-2's dynamic draft tree grown on the device: every level in one CUDA graph, read once.

`draft_tree.grow` chooses each level's nodes on the host, so a step waits for the draft once a
level. EAGLE-2's own implementation grows the tree on the GPU instead: each level expands the
`top_k` nodes of highest value among the last level's children, each into its `top_k` best
children, and the host reads every candidate once, then reranks (`draft_tree.best_nodes`). Here
that growth is one graph of the draft's buffer (`graphs.CudaGraphs.functions`), its layouts
built on the device from the chosen nodes. Rules:

- The tree equals `draft_tree.grow`'s: the same nodes are expanded in the same order (a level's
  best first), a node ending the answer is not expanded (its children get no value and are
  dropped), and the rerank is the same. `grow` skips a level no node of which could still be
  kept; here every level runs (fixed shapes), and what it adds the rerank drops.
- A level's nodes sit at the position after their parents' and are written after the nodes fed
  before them; each sees the prefix, its ancestors among them, and itself.
- Only a feature draft on its graphs' buffer grows this way (`static_draft_tree.level_graphs`);
  elsewhere the host grows the tree.
"""

import math

import torch
from transformers import Cache

from specdemo.core.graphs import PassLayout
from specdemo.core.transfer import tensor_on
from specdemo.core.verify import Proposal
from specdemo.methods.draft import Draft
from specdemo.methods.draft_tree import best_children, best_nodes
from specdemo.methods.eagle import FeatureDraft
from specdemo.methods.static_draft_tree import level_graphs


def device_grow(draft: Draft | FeatureDraft, cache: Cache, first: tuple[torch.Tensor, torch.Tensor | None], *,
                depth: int, top_k: int, size: int, eos: tuple[int, ...] = ()) -> Proposal | None:
    """The draft tree `draft_tree.grow` grows after the draft's `first_logits` (`first`), grown in
    one graph of the CUDA graphs whose buffer the draft's `cache` is a view of and read on the host
    once; None where the draft cannot grow it there (`static_draft_tree.level_graphs`). The draft's
    cache keeps its length: what the levels wrote lies past it."""
    logits, state = first
    k = min(top_k, logits.shape[-1])
    prefix = cache.get_seq_length()
    reach = prefix + (depth - 1) * k  # the levels' nodes in the draft's cache: the root's children, then k a level
    graphs = level_graphs(draft, cache, reach)
    if graphs is None:
        return None
    forward, span = cache.passes.forward, graphs.window(reach)
    cache, decoder = graphs.cache.window(span), draft.model.get_decoder()

    def grown(logits: torch.Tensor, state: torch.Tensor, prefix: torch.Tensor):
        ids, log_probs = best_children(logits, k, draft.token_ids)  # [1, k]
        tokens, scores, parents = [ids.view(-1)], [log_probs.view(-1)], [torch.full_like(ids.view(-1), -1)]
        rows = torch.zeros_like(tokens[0])  # each candidate's parent's row among the last pass's states
        seen, written = None, 0  # [q, written]: what each node of the last pass saw of the nodes fed, itself too
        for level in range(2, depth + 1):
            start = sum(part.shape[0] for part in tokens[:-1])  # the last level's candidates' first index
            value = scores[-1]
            for token in eos:  # a node that ends the answer is not expanded
                value = value.masked_fill(tokens[-1] == token, -math.inf)
            value, chosen = value.topk(min(k, value.shape[0]))  # best first
            q = chosen.shape[0]
            parent_rows = rows.index_select(0, chosen)
            sees = torch.eye(q, dtype=torch.bool, device=logits.device)
            if seen is not None:
                sees = torch.cat([seen.index_select(0, parent_rows), sees], dim=1)
            layout = level_layout(prefix + level - 2, prefix + written, sees)
            cache.start.copy_(layout.start)
            inputs = draft.fuse(state.index_select(0, parent_rows)[None], tokens[-1].index_select(0, chosen)[None])
            state = forward(decoder, cache, inputs, layout)[0]  # [q, H]
            ids, log_probs = best_children(draft.logits(state), k, draft.token_ids)  # [q, k]
            tokens.append(ids.view(-1))
            scores.append((value[:, None] + log_probs).view(-1))
            parents.append((start + chosen)[:, None].expand(q, k).reshape(-1))
            rows = torch.arange(q, device=logits.device)[:, None].expand(q, k).reshape(-1)
            seen, written = sees, written + q
        return torch.cat(tokens), torch.cat(scores), torch.cat(parents)

    key = ("dynamic draft tree", depth, k, eos, span)
    tokens, scores, parents = graphs.functions(key, grown, logits, state, tensor_on([prefix], logits.device))
    return read_tree(tokens.tolist(), scores.tolist(), parents.tolist(), size)


def level_layout(position: torch.Tensor, start: torch.Tensor, sees: torch.Tensor) -> PassLayout:
    """A level's layout on the device (`static.padded_layout`'s, unpadded): its q nodes at
    `position` [1], written from `start` [1] on, node i seeing what `sees` [q, back + q] says of
    the back nodes written before it and of its own, the cache before them all, nothing past them."""
    q, back = sees.shape[0], sees.shape[1] - sees.shape[0]
    framed = torch.cat([sees.new_ones(q, 1), sees, sees.new_zeros(q, 1)], dim=1)
    slots = start + torch.arange(q, device=sees.device)
    return PassLayout(position.expand(1, q), start[0], start[0] - back - 1, slots, framed)


def read_tree(tokens: list[int], scores: list[float], parents: list[int], size: int) -> Proposal:
    """The candidates read on the host, less those below a node that ends the answer (no value),
    reranked to the `size` of highest value (`draft_tree.best_nodes`)."""
    kept = [node for node, score in enumerate(scores) if score > -math.inf]
    index = {node: i for i, node in enumerate(kept)}
    tree = Proposal(tuple(tokens[n] for n in kept), tuple(index.get(parents[n], -1) for n in kept),
                    ("draft",) * len(kept), scores=tuple(scores[n] for n in kept))
    return best_nodes(tree, size)
