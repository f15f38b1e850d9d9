"""A dynamic draft tree: the draft proposes several continuations, the target verifies them in one pass.

EAGLE-2 (Li, Wei, Zhang & Zhang 2024, "EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees", Sec. 4): a node's value is the draft's probability of its whole path,
the product of its confidences, which tracks how likely the target is to accept it. The tree
grows `depth` levels; each level expands only the `top_k` nodes of highest value, each into
its draft's `top_k` best children, in one draft pass where every node sees the prefix and its
own ancestors. Then the `size` nodes of highest value form the tree the target verifies
(reranking, their Sec. 4.2). A child's value never exceeds its parent's, so the chosen nodes
always include their ancestors, and a node whose value is already below the `size` best has
no child worth drafting: the tree grows no level in which no node could still be kept
(`kept_value`), so a deep `depth` costs draft passes only where the draft is sure of itself.

A draft tree is a `verify.Proposal` whose `scores` hold each node's value; the functions here
take one and return a new one. The target verifies it as any proposal (`verify`): a child is
accepted when its token is the target's argmax after its parent; the target's own token follows
the deepest accepted node. That is AR's answer exactly, whatever the tree holds.

A draft is a token draft (`draft.Draft`) or a feature draft (`eagle.FeatureDraft`); both step
through `first_logits` and `branch_logits`, which the chain of `speculative` uses too.

A tree may also hold branches that no model drafted: tokens copied from the text (`add_copy`,
prompt lookup), which win where the answer quotes its prompt and the draft does not, or
retrieved from a datastore of earlier answers (`retrieval`, REST); and below its likeliest
branch, what the text or an earlier answer went on with (`extend_likeliest`).

A static tree, whose shape is the same every pass and whose tokens stay on the device, is
`static_draft_tree`'s; this tree grown on the device in one graph, read once, `device_draft_tree`'s.
"""

from collections.abc import Sequence

import numpy as np
import torch
from transformers import Cache

from specdemo.core.kvcache import keep_prefix
from specdemo.core.transfer import tensor_on
from specdemo.core.verify import EMPTY, Proposal
from specdemo.methods.draft import Draft
from specdemo.methods.eagle import FeatureDraft
from specdemo.methods.retrieval import Datastore, guessed_branch


def best_continuation(tree: Proposal, node: int) -> list[int]:
    """The nodes the draft liked best after `node` (-1: the root), following its likeliest child
    down to a leaf (a copied branch only where the draft has none): what the target turned down
    when it stopped at `node`."""
    path = []
    while children := [child for child, parent in enumerate(tree.parents) if parent == node]:
        node = max(children, key=lambda child: (tree.sources[child] == "draft", tree.scores[child]))
        path.append(node)
    return path


def first_logits(
    draft: Draft | FeatureDraft, cache: Cache, sequence: torch.Tensor, features: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The draft's logits [1, K] for the token after `sequence` [1, n], and for a feature draft
    its predicted feature [1, H] there. A token draft reads the tokens its cache has not seen; a
    feature draft the pairs (f_t, x_{t+1}) whose feature f_t the target computed (`features`)."""
    if isinstance(draft, FeatureDraft):
        seen = cache.get_seq_length()
        predicted = draft.features(features[:, seen:], sequence[:, seen + 1 :], cache)[0, -1:]  # [1, H]
        return draft.logits(predicted), predicted
    return draft.logits(sequence[:, cache.get_seq_length() :], cache)[0], None


def branch_logits(
    draft: Draft | FeatureDraft, cache: Cache, tokens: torch.Tensor, states: torch.Tensor | None, **tree
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The draft's logits [q, K] after each of `tokens` [q] (drafted tokens appended to the
    cache), and a feature draft's predicted features [q, H]; `states` [q, H] are the predicted
    features each token followed. `tree`: `sees` and `position_ids` when the tokens are
    branches rather than a chain (`static.decoder_pass`)."""
    if isinstance(draft, FeatureDraft):
        predicted = draft.features(states[None], tokens[None], cache, **tree)[0]  # [q, H]
        return draft.logits(predicted), predicted
    return draft.logits(tokens[None], cache, logits_to_keep=tokens.shape[0], **tree)[0], None


@torch.inference_mode()
def grow(
    draft: Draft | FeatureDraft,
    cache: Cache,
    sequence: torch.Tensor,
    features: torch.Tensor | None,
    *,
    depth: int,
    top_k: int,
    size: int,
    eos: tuple[int, ...] = (),
    first: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> tuple[Proposal, int]:
    """The draft tree after `sequence` [1, n] (EAGLE-2's expand and rerank, `expand`) and the draft's
    passes that grew it. The draft's cache ends holding the prefix only: the branches it fed are dropped.
    `first`: `first_logits`' result where the caller asked for it already (on a GPU its pass then
    runs while the host does other work, until the first level reads its top tokens).
    The second level's pass, and its best children of every child of the root, are queued before
    the host reads the first level (`second_level`), so on a GPU the two passes run back to back
    and the host waits once for both levels' top tokens."""
    logits, state = first or first_logits(draft, cache, sequence, features)
    prefix = cache.get_seq_length()
    best = best_children(logits, top_k, draft.token_ids)
    if depth > 1:
        second, states = second_level(draft, cache, best, state, prefix)
        second_best = best_children(second, top_k, draft.token_ids)
    best = on_host(best)  # the one wait, for both passes
    ahead = (*on_host(second_best), states) if depth > 1 else None
    # nodes in the draft's cache after the prefix, in cache order: the second level fed every child of the root
    fed = [] if ahead is None else list(range(len(best[0][0])))

    def level_logits(tree: Proposal, nodes: list[int], tokens: torch.Tensor, states: torch.Tensor | None, level: int):
        sees = branch_visibility(tree, fed, nodes)  # the host's, as the positions: the pass moves them
        positions = np.full(len(nodes), prefix + level - 2)
        fed.extend(nodes)
        return branch_logits(draft, cache, tokens, states, sees=sees, position_ids=positions)

    grown, passes = expand(draft.token_ids, logits, state, level_logits, depth=depth, top_k=top_k, size=size, eos=eos,
                           best=best, ahead=ahead)
    keep_prefix(cache, prefix)
    return grown, max(passes, 1 if ahead is None else 2)


def picked(rows: torch.Tensor, nodes: list[int]) -> torch.Tensor:
    """`rows[nodes]`: a slice where the nodes are the first ones in order (no index to move to the device)."""
    if nodes == list(range(len(nodes))):
        return rows[: len(nodes)]
    return rows.index_select(0, tensor_on(nodes, rows.device))


def second_level(draft: Draft | FeatureDraft, cache: Cache, best, state: torch.Tensor | None,
                 prefix: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The draft's logits [k, K] (and a feature draft's predicted features [k, H]) after each of
    the root's k children (`best`: the root's `best_children`), in their order, from one pass
    queued without reading them on the host: each child sees the prefix and itself. `expand`
    then takes the rows of the children it expands: all of them but those that end the answer
    or that the rerank would drop, whose rows cost nothing it waits for."""
    tokens = best[0][0]  # [k], on the device
    k = tokens.shape[0]
    states = None if state is None else state.expand(k, -1)
    return branch_logits(draft, cache, tokens, states, sees=np.eye(k, dtype=bool), position_ids=np.full(k, prefix))


def expand(token_ids, logits: torch.Tensor, state: torch.Tensor | None, level_logits, *, depth: int,
           top_k: int, size: int, eos: tuple[int, ...] = (), first_k: int | None = None, best=None,
           ahead: tuple[list, list, torch.Tensor | None] | None = None) -> tuple[Proposal, int]:
    """EAGLE-2's expand and rerank for any drafter, and the drafter's passes it took (one a level):
    `logits` [1, K] are its guesses for the root's children (`state` [1, H]: what their own
    children's guesses read, or None); level by level, `level_logits(tree, nodes, tokens, states,
    level)` gives its guesses [q, K] after each of the `nodes` expanded at `level` (holding `tokens`
    [q]; `states` [q, H] the states they were guessed from) and the states [q, H] their children
    read. `token_ids` maps indices into the drafter's vocabulary to token ids. A feature draft's
    state is its predicted feature; a Hydra head's, the path it read. `first_k`: the root's
    children, if not `top_k`; `best`: their `best_children` read on the host (`on_host`), where
    the caller has them already. `ahead`: the second level's best children of each of the root's k
    children, in order, read on the host, and their states [k, H], where the caller queued that
    level before the first was read (`second_level`): the level takes the rows of the nodes it
    expands."""
    first = best if best is not None else on_host(best_children(logits, first_k or top_k, token_ids))
    tree, passes = add_children(EMPTY, first, [-1]), 1
    frontier = range(tree.size)  # the nodes the last level added, as many children to each row of `state`
    for level in range(2, depth + 1):
        bar = kept_value(tree.scores, size)
        nodes = sorted((n for n in frontier if tree.tokens[n] not in eos and tree.scores[n] > bar),
                       key=lambda n: -tree.scores[n])[:top_k]
        if not nodes:
            break
        if level == 2 and ahead is not None:
            ids, values, states = ahead
            chosen = [ids[n] for n in nodes], [values[n] for n in nodes]
            state = None if states is None or level == depth else picked(states, nodes)
        else:
            tokens = tensor_on([tree.tokens[n] for n in nodes], logits.device)
            # one index for the level, not a slice a node: on a GPU every tensor operation is a launch
            parent_states = None if state is None else state.index_select(0, tensor_on(
                [(n - frontier.start) * len(state) // len(frontier) for n in nodes], state.device))
            logits, state = level_logits(tree, nodes, tokens, parent_states, level)
            chosen = on_host(best_children(logits, top_k, token_ids))
        grown, passes = add_children(tree, chosen, nodes), level
        tree, frontier = grown, range(tree.size, grown.size)
    return best_nodes(tree, size), passes


def kept_value(scores: tuple[float, ...], size: int) -> float:
    """The value a node must beat for a child of it to be among the `size` the rerank keeps: the
    size-th best value so far (-inf while fewer nodes). A child's value never exceeds its parent's,
    and ties go to the shallower node, so expanding a node at or below it changes nothing but
    costs a draft pass: `grow` skips it, and stops early when no node beats it. The tree is the
    same as without the skip; a deep `depth` costs passes only while the draft is confident."""
    return sorted(scores, reverse=True)[size - 1] if len(scores) >= size else float("-inf")


def children_to_fill(size: int, depth: int, top_k: int) -> int:
    """The fewest children per expanded node, at least `top_k`, with which a tree of `depth` levels
    can hold `size` nodes: it holds top_k + (depth - 1) * top_k^2 at most (top_k nodes expanded a
    level). On the compiled path a tree is given the slots its padded pass has (`static.fitted_size`),
    and a slot left empty is a node verified for nothing, so the tree takes as many children a
    node as fill them (`git show 4f4c763:docs/methods/speculative.md` measured the default tree both ways)."""
    while top_k < size and top_k + (depth - 1) * top_k * top_k < size:
        top_k += 1
    return top_k


def best_children(logits: torch.Tensor, top_k: int, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The `top_k` best children of each row of `logits` [q, K] by the drafter's log-probability, best
    first: their token ids [q, k] (`token_ids` maps indices into the drafter's vocabulary to them)
    and log-probabilities [q, k], on its device."""
    # in float32 (`dtype` casts inside the one kernel, as `.float()` would before it)
    best = torch.log_softmax(logits, dim=-1, dtype=torch.float32).topk(min(top_k, logits.shape[-1]), dim=-1)
    return token_ids(best.indices), best.values


def on_host(best: tuple[torch.Tensor, torch.Tensor]) -> tuple[list[list[int]], list[list[float]]]:
    """`best_children`' token ids and log-probabilities as lists: one copy from the device each,
    not one a row (on a GPU every such copy waits for the device)."""
    return best[0].tolist(), best[1].tolist()


def add_children(tree: Proposal, best: tuple[list[list[int]], list[list[float]]], parents: list[int]) -> Proposal:
    """The tree with each of `parents`' best children (`best`: `best_children` read by `on_host`, one
    row per parent) appended, parent by parent, best first; a child's value is its parent's plus its
    own log-probability."""
    token_ids, values = best
    tokens, hung, scores = list(tree.tokens), list(tree.parents), list(tree.scores)
    for row, parent in enumerate(parents):
        parent_score = 0.0 if parent < 0 else tree.scores[parent]
        for token, log_prob in zip(token_ids[row], values[row]):
            tokens.append(token)
            hung.append(parent)
            scores.append(parent_score + log_prob)
    added = len(tokens) - tree.size
    return Proposal(tuple(tokens), tuple(hung), (*tree.sources, *("draft",) * added), scores=tuple(scores))


def branch_visibility(tree: Proposal, fed: list[int], expand: list[int]) -> np.ndarray:
    """sees [q, len(fed) + q] (bool, the host's: `attention`): among the branches already in the draft's cache (`fed`,
    after the prefix, which every node sees) and the expanded nodes, each of these sees its own
    ancestors and itself."""
    cache_slot = {node: i for i, node in enumerate(fed)}
    sees = np.zeros((len(expand), len(fed) + len(expand)), dtype=bool)
    for row, node in enumerate(expand):
        sees[row, [cache_slot[ancestor] for ancestor in tree.ancestry(tree.parents[node])]] = True
        sees[row, len(fed) + row] = True
    return sees


def best_nodes(tree: Proposal, size: int) -> Proposal:
    """The `size` nodes of highest value, renumbered with parents before children (EAGLE-2's
    rerank). Ties go to the shallower node, so a node never comes without its parent."""
    depths, scores = tree.depths, tree.scores
    chosen = sorted(range(tree.size), key=lambda n: (-scores[n], depths[n], n))[:size]
    chosen.sort(key=lambda n: (depths[n], n))
    index = {node: i for i, node in enumerate(chosen)}
    kept = lambda values: tuple(values[n] for n in chosen)  # noqa: E731
    return Proposal(kept(tree.tokens), tuple(-1 if tree.parents[n] < 0 else index[tree.parents[n]] for n in chosen),
                    kept(tree.sources), scores=kept(scores))


def add_copy(tree: Proposal, copied: list[int], below: int = -1, source: str = "copy") -> Proposal:
    """The draft tree with `copied` as a branch from node `below` (-1: the root): the copy follows
    the draft's nodes while they hold its tokens, and its remaining tokens hang below as new nodes
    (`source`: "copy" from the text, "retrieved" from a datastore). A copied node has no draft
    probability of its own; it takes its parent's value."""
    tokens, parents, sources, scores = list(tree.tokens), list(tree.parents), list(tree.sources), list(tree.scores)
    node = below
    for token in copied:
        child = next((c for c, p in enumerate(parents) if p == node and tokens[c] == token), None)
        if child is None:
            child = len(tokens)
            tokens.append(token)
            parents.append(node)
            sources.append(source)
            scores.append(scores[node] if node >= 0 else 0.0)
        node = child
    return Proposal(tuple(tokens), tuple(parents), tuple(sources), scores=tuple(scores))


def extend_likeliest(tree: Proposal, sequence: Sequence[int], length: int, eos: tuple[int, ...],
                     datastore: Datastore | None, least_share: float = 0.0) -> Proposal:
    """The tree with up to `length` more tokens below the end of the draft's likeliest branch,
    guessed without a model pass after the text `sequence` [n] (on the host) and that branch:
    copied from the text, else retrieved (`retrieval.guessed_branch`). The draft stops `depth`
    deep, where a branch it is sure of often goes on as the text or an earlier answer did; the
    guess then lets a pass commit more than the draft's depth. Nothing is added below a leaf
    that already has children (a copied branch) or that ends the answer."""
    branch = [node for node in best_continuation(tree, -1) if tree.sources[node] == "draft"]
    if not branch or length <= 0 or tree.tokens[branch[-1]] in eos or branch[-1] in tree.parents:
        return tree
    text = np.concatenate([np.asarray(sequence, dtype=np.int64), [tree.tokens[node] for node in branch]])
    guessed, source = guessed_branch(text, length, eos, datastore, least_share)
    return add_copy(tree, guessed, below=branch[-1], source=source)
