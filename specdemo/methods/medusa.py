"""Medusa decoding (`generate`, `MedusaTree`): extra heads propose a tree of candidates; one target pass verifies it.

Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads". The heads (`medusa_heads`) read the target's last hidden state; their guesses fill a
candidate tree (`medusa_tree`). One target pass feeds the last committed token (the root) and
every node, each node seeing only its ancestors; greedy verification keeps the longest
root-to-leaf path whose every token is the target's argmax after its parent, then the target's
own token after it. Only that path's KV entries are kept. Heads that read their tree path
(Hydra) grow their tree a level a call (`grow`). With sampling on, Medusa's typical acceptance
(`typical_verdicts`) may replace greedy verification.

Beside the heads' nodes the tree may hold a chain copied from the text (`prompt_lookup`): the
tokens that followed the text's last few tokens where they occurred before. The heads guess
from one hidden state and drift after a few tokens; a copy is often right for many more where
the answer quotes its prompt or repeats itself. Where the text offers none, the chain comes
from a datastore of the target's earlier answers (`retrieval`, REST): what most of them wrote
after the text's last few tokens. It is verified like any other branch.
"""

import threading
from collections.abc import Iterable, Iterator, Sequence

import torch
from transformers import PreTrainedModel

from specdemo.core.errors import SpecDemoError, check_whole
from specdemo.core.events import StepEvent, Summary
from specdemo.core.graphs import FunctionGraphs
from specdemo.core.loop import NOTHING, Context, Learned, Proposed, Proposer, Verdict, decode
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.core.static import CompiledPass, fitted_copy, fitted_size
from specdemo.core.steps import ChainStep, TreeStep
from specdemo.core.transfer import tensor_on
from specdemo.core.verify import Proposal, TargetPass, deepest, first_leaf_path, scores_after
from specdemo.methods.draft_tree import expand

# the library's `medusa.load_heads`, as before the split (F401)
from specdemo.methods.medusa_heads import MedusaHeads, load_heads  # noqa: F401
from specdemo.methods.medusa_tree import (
    MAX_TREE_SIZE,
    cached_tree,
    check_dynamic_size,
    dynamic_paths,
    filled,
    gather_index,
    head_tokens,
    on_device,
    rank_paths,
    resolve_tree,
    top_ranks,
)
from specdemo.methods.prompt_lookup import check_copy_length
from specdemo.methods.retrieval import Datastore, guessed_branch


def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    heads: MedusaHeads,
    tree: str | Iterable[Sequence[int]] = "dynamic",
    tree_size: int | None = None,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    typical_acceptance: bool = False,
    typical_epsilon: float = 0.09,
    typical_alpha: float = 0.3,
    copy_length: int | None = None,
    retrieve: bool = True,
    datastore: Datastore | None = None,
    tree_top_k: int = 3,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
    passes: CompiledPass | None = None,
    heads_passes: FunctionGraphs | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L], verifying a tree of the heads' candidates each pass.
    `tree`: "dynamic" (each pass, the `tree_size` nodes of highest value by the heads'
    confidences: `dynamic_paths`), "static" (the paths that came with the heads, else the
    chain), "chain" (each head's best token only), or paths in the medusa_choices form. For a
    static tree `tree_size` keeps its first paths, at most all of them (a tree grown by estimated
    acceptance lists parents first, so any prefix is a tree); by default a dynamic tree has as
    many nodes as the heads' default static tree.
    Greedy verification gives exactly AR's answer. `typical_acceptance` (with sampling on) is
    Medusa's rule for sampling, ε and α as in the paper: it does NOT keep the target's
    distribution (see `typical_verdicts`). `copy_length` > 0 adds a chain of up to that many
    tokens copied from the text (prompt lookup) to each pass's tree; None: COPY_LENGTH. Where the
    text offers no copy, `retrieve` takes the chain from `datastore` (earlier answers of the
    target: `retrieval`, REST).
    Heads that read their path (Hydra) grow a dynamic tree as EAGLE-2 grows a draft's
    (`draft_tree.expand`): level by level, the `tree_top_k` nodes of highest value each get their
    `tree_top_k` likeliest children, then the `tree_size` best nodes stay.
    `passes`: the model's compiled static pass (None: eager); `heads_passes`: CUDA graphs of the
    heads (`MedusaHeads.ranked`), run only beside the target's compiled pass."""
    check_acceptance(sampling, typical_acceptance, typical_epsilon, typical_alpha)
    if tree == "dynamic":
        static, dynamic_size = None, check_dynamic_size(heads, tree_size)
    else:
        static, dynamic_size = resolve_tree(heads, tree, tree_size), 0
    if static is not None and max(static.depths) > heads.num_heads:
        raise SpecDemoError(f"the tree is {max(static.depths)} deep but there are only {heads.num_heads} heads")
    typical = (typical_epsilon, typical_alpha) if typical_acceptance else None
    check_whole("tree_top_k", tree_top_k, 1, MAX_TREE_SIZE)
    proposer = MedusaTree(heads, static, dynamic_size, check_copy_length(copy_length), typical, tree_top_k,
                          datastore if retrieve else None, heads_passes if passes else None)
    return decode(model, input_ids, proposer, method="medusa", max_new_tokens=max_new_tokens, sampling=sampling,
                  eos_token_ids=eos_token_ids, stop=stop, passes=passes)


class MedusaTree(Proposer):
    """Proposes the heads' candidate tree (and a chain copied from the text) after the last
    committed token; learns the hidden state the heads read next, the accepted node's, and queues
    the heads on it for the next proposal (on a GPU they run while the host records this one)."""

    features = True  # the heads read the target's last hidden state

    def __init__(self, heads: MedusaHeads, static: Proposal | None, dynamic_size: int, copy_length: int,
                 typical: tuple[float, float] | None, top_k: int = 3, datastore: Datastore | None = None,
                 graphs: FunctionGraphs | None = None):
        self.heads, self.static, self.dynamic_size, self.copy_length, self.typical = (heads, static, dynamic_size,
                                                                                      copy_length, typical)
        self.datastore, self.graphs = datastore, graphs
        # where the static tree's nodes take their tokens among the heads' best, on their device once a request
        self.gather = None if static is None else gather_index(static, max(top_ranks(static)),
                                                               next(heads.parameters()).device)
        self.top_k = top_k  # a path-reading dynamic tree's children per expanded node, and nodes expanded per level
        self.hidden: torch.Tensor | None = None  # [H] the last committed token's parent position's hidden state
        # the heads' ranked tokens and log-probabilities after `hidden`, queued by `learn` for the next proposal
        self.ranked: tuple[torch.Tensor, torch.Tensor] | None = None

    def propose(self, context: Context, sequence: torch.Tensor, room: int) -> Proposed:
        if self.hidden is None:  # the prefill: its last hidden state gives the first token and the first proposals
            return NOTHING
        # The heads read the hidden state of the last committed token's parent position; a static tree
        # takes their top tokens, a dynamic one first chooses which paths by their confidences. Near the
        # end of the answer no path goes deeper than what can still be committed, so no node sits past
        # the request's last position (nor past the model's context).
        depth_limit = max(room - 1, 1)
        text = context.text.of(sequence)
        root = int(text[-1])
        ranked = self.ranked  # queued as the last pass was learned
        copied, copy_source = guessed_branch(text, min(self.copy_length, room - 1), context.eos, self.datastore)
        if self.heads.reads_path:  # each node's children guessed from its own path, a level a call
            if self.static is None:
                size = fitted_size(self.dynamic_size, len(copied), context.bucket, context.device)
                depth = min(self.heads.num_heads, depth_limit)
                token_at = paths_of(grow(self.heads, self.hidden, root, depth=depth, top_k=self.top_k, size=size,
                                         eos=context.eos))
            else:
                token_at = path_tokens(self.heads, self.hidden, root,
                                       [p for p in rank_paths(self.static) if len(p) <= depth_limit])
            shape = cached_tree(tuple(sorted(token_at)), len(copied))
            return Proposed(filled(shape, [*(token_at[path] for path in rank_paths(shape)), *copied], copy_source))
        if self.static is None:
            size = fitted_size(self.dynamic_size, len(copied), context.bucket, context.device)
            top, log_probs = ranked[0].tolist(), ranked[1].tolist()
            # sorted: one cache entry per shape. The paths take ranks below `size` alone: more ranked change nothing
            paths = tuple(sorted(dynamic_paths(log_probs[:depth_limit], size)))
        else:
            paths = tuple(p for p in rank_paths(self.static) if len(p) <= depth_limit)
            copied = copied[: fitted_copy(len(paths), len(copied), context.bucket)]
            if self.typical is None and not context.choose.processors:  # plain greedy: read with the choices
                whole = len(paths) == self.static.size  # near the end a shallower tree, gathered at its own index
                return Proposed(on_device(cached_tree(paths, len(copied)), ranked[0], copied, copy_source,
                                          self.gather if whole else None))
            top = self.heads.top_tokens(self.hidden, top_ranks(self.static), self.token(root), self.graphs)
        shape = cached_tree(paths, len(copied))
        return Proposed(filled(shape, [*head_tokens(shape, top), *copied], copy_source))

    def ranks(self, context: Context, root: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The heads' ranked tokens and their log-probabilities after `hidden` and `root` (the last
        committed token), queued on the device (`MedusaHeads.ranked`), for the proposals that read them
        so: a dynamic tree, which takes as many as any tree may (eager, the size asked; padded,
        MAX_TREE_SIZE, more than the slots of `static.BUCKETS`' widest), so that one graph of the heads
        serves every pass; a static tree under plain greedy decoding, its ranks. None where a proposal
        reads the heads otherwise: heads that read their path, a static tree's top tokens under sampling or
        logits processors."""
        if self.heads.reads_path:
            return None
        if self.static is None:
            size = self.dynamic_size if context.bucket is None else MAX_TREE_SIZE
            return self.heads.ranked(self.hidden, size, self.token(root), self.graphs)
        if self.typical is None and not context.choose.processors:
            return self.heads.ranked(self.hidden, max(top_ranks(self.static)), self.token(root), self.graphs)
        return None

    def token(self, root: int) -> int | None:
        """The last committed token (`root`), the one the heads' hidden state predicted, for heads that read it."""
        return root if self.heads.reads_token else None

    def accept(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass) -> Verdict:
        """Greedy verification, or typical acceptance (`typical_verdicts`) when sampling."""
        proposal = proposed.proposal
        if self.typical is None or not proposal.size:
            return super().accept(context, sequence, proposed, verified)
        scores = scores_after(context.choose, sequence, proposal, verified.logits)  # [1 + n, V]: root, nodes
        probs = torch.softmax(scores.float(), dim=-1)
        token_probs = probs_after_parents(proposal.parents, proposal.tokens, probs)
        verdicts, thresholds = typical_verdicts(proposal.parents, token_probs, probs, *self.typical)
        path = deepest(proposal, verdicts, token_probs)
        token = int(torch.multinomial(probs[path[-1] + 1 if path else 0], 1, generator=context.choose.generator))
        return Verdict(path, token, {"token_probs": token_probs, "thresholds": thresholds})

    def learn(self, context: Context, sequence: torch.Tensor, proposed: Proposed, verified: TargetPass,
              verdict: Verdict, kept: list[int], room: int) -> Learned:
        node = verdict.path[-1] if verdict.path else -1  # the accepted node, -1 the root
        self.hidden = verified.hidden[0, verified.row(node)]
        # the next proposal's heads, queued now: on a GPU they run while the host records this pass
        self.ranked = self.ranks(context, verdict.token) if room else None
        proposal = proposed.proposal
        if not proposal.size:  # the prefill: an empty chain
            return Learned(data=ChainStep(gamma=0, accept_length=0, target_token=verdict.token, proposer="heads"))
        best = first_leaf_path(proposal.parents, node)
        root = int(context.text.of(sequence)[-len(verdict.path) - 2])  # the last token before this pass committed
        return Learned(
            rejected=[proposal.tokens[i] for i in best[len(verdict.path) :]],
            data=TreeStep(
                proposal, root, verdict.path, list(best), proposer="heads",
                tree_kind="static" if self.static is not None else "dynamic",
                acceptance_rule="typical" if self.typical else "greedy", **verdict.details,
            ),
        )


def grow(heads: MedusaHeads, hidden: torch.Tensor, token: int, *, depth: int, top_k: int, size: int,
         eos: tuple[int, ...] = ()) -> Proposal:
    """The dynamic tree of heads that read their path (Hydra), after the hidden state `hidden` [H]
    and the token it predicted: EAGLE-2's expand and rerank (`draft_tree.expand`), head k guessing
    the children of the nodes at depth k from [h; e(x); e(y_1); ...; e(y_k)], their paths. The
    root may get all `size` nodes as children: head 0 is right far less often than a draft's first
    guess (it sees one hidden state, no attention), and its alternatives are most of what a small
    tree gains."""
    # [1, 2H]
    joined = torch.cat([hidden, heads.embedded(tensor_on(token, hidden.device), hidden.dtype)])[None]

    def level_logits(tree: Proposal, nodes: list[int], tokens: torch.Tensor, states: torch.Tensor, level: int):
        joined = torch.cat([states, heads.embedded(tokens, states.dtype)], dim=-1)  # [q, (1 + level) H]
        return heads.head_logits(level - 1, joined), joined

    tree, _ = expand(heads.token_ids, heads.head_logits(0, joined), joined, level_logits, depth=depth, top_k=top_k,
                     size=size, eos=eos, first_k=size)
    return tree


def paths_of(tree: Proposal) -> dict[tuple[int, ...], int]:
    """A grown tree as rank paths (the medusa_choices form) and their tokens. The expansion adds a
    node's children best first and the rerank keeps a prefix of them (a child is never worth
    more than its elder sibling), so a node's rank is its place among its kept siblings."""
    paths, token_at = [], {}
    for node, parent in enumerate(tree.parents):
        above = () if parent < 0 else paths[parent]
        rank = sum(1 for earlier in range(node) if tree.parents[earlier] == parent)
        paths.append((*above, rank))
        token_at[paths[-1]] = tree.tokens[node]
    return token_at


def path_tokens(heads: MedusaHeads, hidden: torch.Tensor, token: int,
                paths: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], int]:
    """The token at each rank path of a static tree for heads that read their path: head d - 1's
    r-th best guess after the node's parent's path, one call a level."""
    embed = lambda t: heads.embedded(tensor_on(t, hidden.device), hidden.dtype)  # noqa: E731
    joined, token_at = {(): torch.cat([hidden, embed(token)])}, {}
    for depth in range(1, max(map(len, paths), default=0) + 1):
        level = [path for path in paths if len(path) == depth]
        parents = sorted({path[:-1] for path in level})
        logits = heads.head_logits(depth - 1, torch.stack([joined[parent] for parent in parents]))
        top = heads.token_ids(logits.topk(1 + max(path[-1] for path in level), dim=-1).indices).tolist()
        for path in level:
            token_at[path] = top[parents.index(path[:-1])][path[-1]]
            joined[path] = torch.cat([joined[path[:-1]], embed(token_at[path])])
    return token_at


def check_acceptance(sampling: SamplingConfig, typical_acceptance: bool, epsilon: float, alpha: float) -> None:
    if sampling.do_sample and not typical_acceptance:
        raise SpecDemoError(
            "medusa verifies greedily unless you opt in to typical acceptance (typical_acceptance=True), "
            "which samples but does not keep the target's distribution; or choose ar or speculative to sample exactly"
        )
    if typical_acceptance and not sampling.do_sample:
        raise SpecDemoError("typical acceptance is Medusa's rule for sampling: turn sampling on, or turn it off for "
                            "greedy verification")
    if not (0 < epsilon <= 1 and 0 < alpha <= 1):
        raise SpecDemoError(f"typical acceptance needs 0 < epsilon <= 1 and 0 < alpha <= 1, got {epsilon} and {alpha}")


def probs_after_parents(parents: Sequence[int], tokens: Sequence[int], probs: torch.Tensor) -> list[float]:
    """Each node's token's probability under the target after its parent (`probs` [1 + n, V]: row 0
    after the root, row 1 + i after node i), one gather."""
    return probs[[parent + 1 for parent in parents], list(tokens)].tolist()


def typical_verdicts(parents: Sequence[int], token_probs: list[float], probs: torch.Tensor, epsilon: float,
                     alpha: float) -> tuple[list[bool], list[float]]:
    """Typical acceptance (Cai et al. 2024, Sec. 2.3.1): a node passes when the target gives its
    token, after its parent, a probability (`token_probs`) above min(ε, α exp(-H(p))), H the
    entropy of the target's distribution p there (`probs` [1 + n, V], row 0 after the root). It
    accepts plausible tokens, more of them where the target is unsure; it is NOT distribution-preserving
    (unlike speculative sampling's rejection rule). Returns each node's verdict and each row's
    threshold (for the token after the root, then after each node)."""
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(dim=-1)  # [1 + n]
    thresholds = torch.minimum(torch.full_like(entropy, epsilon), alpha * torch.exp(-entropy)).tolist()
    return [token_probs[node] > thresholds[parent + 1] for node, parent in enumerate(parents)], thresholds
