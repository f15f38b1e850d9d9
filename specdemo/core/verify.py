"""The verification engine: what every proposing method shares, written once.

A `Proposal` is what a method offers one target pass: tokens hanging as a forest from the root
(the last committed token), each given by its parent (-1: the root), the one tree every method
and the engine share: its mask (`tree_mask`), depths (`tree_depths`) and candidates
(`leaf_paths`, Medusa's retrieval indices) are pure functions of its parents. A chain (a
speculative draft, a Jacobi block) is a forest of one path; a tree (EAGLE-2's draft tree,
Medusa's candidates) is many; lookahead's candidates are several chains from the root, and its
Jacobi window rides along as work tokens the pass feeds but never accepts. AR is the empty proposal.

The engine runs the target once over a proposal (`target_pass`: tree attention where the
tokens branch, Medusa's Sec. 2.1.2), reads the target's choice after every node
(`choices_after`), accepts the deepest node whose whole path the target agrees with
(`accept_greedy`, `deepest`), and keeps that path's KV entries and nothing else (`commit`).
Beam search's k beams, side by side, take `batch_pass`: the same pass for one row, transformers'
batched one for more.
Greedy acceptance gives exactly AR's answer whatever the proposal holds: each accepted token
is the target's own argmax after the tokens before it.
"""

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from transformers import Cache, DynamicCache, PreTrainedModel

from specdemo.core.attention import additive_mask, chain_positions, sees_from_parents
from specdemo.core.grouped_attention import per_pass
from specdemo.core.kvcache import StaticKV, keep_positions
from specdemo.core.sampling import TokenChooser
from specdemo.core.static import CompiledPass, request_cache, static_pass, with_layers
from specdemo.core.transfer import tensor_on, to_device


@dataclass(frozen=True)
class Proposal:
    """Tokens offered to one target pass. Node i holds `tokens[i]`, hangs from node `parents[i]`
    (-1: the root; a parent comes before its children) and came from `sources[i]` ("draft",
    "copy", "head", "pool", "guess", "window"...). The last `work` nodes are fed but never
    accepted (lookahead's window); `read` names those of them whose logits the proposer wants.
    `scores`, where the proposer values its nodes (a draft tree), is per node the log of the
    draft's probability of the path to it (EAGLE-2's node value); () where it does not.
    `on_device`: the tokens [size] where they are still on the device, the host not having read
    them (a static tree of a draft or of Medusa's heads, read with the target's choices,
    `read_with_choices`): `tokens` is then () and `accept` returns the proposal as read
    (`loop.Verdict.proposal`)."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    sources: tuple[str, ...] = ()
    work: int = 0
    read: tuple[int, ...] = ()
    scores: tuple[float, ...] = ()
    on_device: torch.Tensor | None = field(default=None, compare=False)

    @classmethod
    def chain(cls, tokens: Sequence[int], source: str) -> "Proposal":
        """Tokens in a row after the root: a speculative draft, a Jacobi block, a copy."""
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)), (source,) * len(tokens))

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def candidates(self) -> int:
        """How many nodes may be accepted: all but the work nodes."""
        return self.size - self.work

    @property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, self.size - 1))

    @property
    def depths(self) -> tuple[int, ...]:
        """Each node's depth, 1 for the root's children (`tree_depths`)."""
        return tree_depths(self.parents)

    def ancestry(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node`, itself included ([] for the root, -1)."""
        return path_to(self.parents, node)


EMPTY = Proposal()


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """The nodes of a forest given by `parents` (-1: the root) from the root's child down to `node`."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@functools.lru_cache(maxsize=1024)  # a tree of one shape recurs every pass: build its mask once
def tree_mask(parents: tuple[int, ...]) -> np.ndarray:
    """`sees` [n, n] (bool) of a forest given by `parents` (-1: the root): node i sees node j when j
    is i or one of its ancestors (`attention.sees_from_parents`). Shared between calls, so read-only."""
    sees = sees_from_parents(list(parents))
    sees.flags.writeable = False
    return sees


@functools.lru_cache(maxsize=1024)
def tree_depths(parents: tuple[int, ...]) -> tuple[int, ...]:
    """Each node's depth in a forest given by `parents` (-1: the root), 1 for the root's children."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return tuple(depths)


@functools.lru_cache(maxsize=1024)
def leaf_paths(parents: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The candidates a forest given by `parents` holds: the path from the root's child to each leaf,
    leaves in node order (Medusa's retrieval indices, Cai et al. 2024, Sec. 2.1.2)."""
    has_child = set(parents)
    return tuple(tuple(path_to(parents, node)) for node in range(len(parents)) if node not in has_child)


def first_leaf_path(parents: tuple[int, ...], node: int) -> tuple[int, ...]:
    """The first candidate (`leaf_paths`) through `node` (-1: the root, so the first candidate)."""
    above = tuple(path_to(parents, node))
    return next(path for path in leaf_paths(parents) if path[: len(above)] == above)


@dataclass
class TargetPass:
    """What the target's pass over a proposal returned."""

    # [1 + candidates + len(read), V] float32: after the root, each candidate node, each read work node
    logits: torch.Tensor
    # [1, f, H] the last hidden state of every fed position (when asked for; [1, f, (k + 1) H] with k layers)
    hidden: torch.Tensor | None
    cached: int  # cache length before the pass
    pending: int  # committed tokens fed first (the cache had not seen them); the last is the root

    @property
    def root_row(self) -> int:
        """Index of the root among the fed positions (the rows of `hidden`)."""
        return self.pending - 1

    def row(self, node: int) -> int:
        """Index of proposal node `node` (-1: the root) among the fed positions (the rows of `hidden`)."""
        return self.pending + node


def fed_parents(pending: int, proposal: Proposal) -> tuple[int, ...]:
    """Each fed token's parent among the fed tokens (-1: the cache): the `pending` committed
    tokens in a row, then the proposal's nodes, the root being the last committed token."""
    return (*range(-1, pending - 1), *(pending - 1 if p < 0 else pending + p for p in proposal.parents))


def target_pass(model: PreTrainedModel, cache: Cache, sequence: torch.Tensor, proposal: Proposal, *,
                features: bool | tuple[int, ...] = False) -> TargetPass:
    """One target pass over the committed tokens the cache has not seen (`sequence` [1, n] ends
    with them) and then the proposal's nodes, each seeing the committed tokens and its own
    ancestors. A chain needs no mask: the causal one is its tree attention. `features`: also
    return the last hidden state of every fed position (a feature draft's input, Medusa's heads'),
    and with a tuple of layers the residual stream after those layers before it (`static.with_layers`).
    On a `StaticKV` the pass takes the compiled static path (`specdemo.core.static`)."""
    cached = cache.get_seq_length()
    pending = sequence.shape[1] - cached
    layers = features if isinstance(features, tuple) else ()
    fed = sequence[:, cached:]  # [1, pending + size]: AR's pass feeds the last token alone
    if proposal.size:
        drafted = proposal.on_device[None] if proposal.on_device is not None else tensor_on([proposal.tokens],
                                                                                             sequence.device)
        fed = torch.cat([fed, drafted], dim=-1)
    kept = pending + proposal.candidates  # fed rows scored: the root and every candidate ...
    rows = [*range(pending - 1, kept), *(pending + node for node in proposal.read)]  # ... then the read work nodes
    if isinstance(cache, StaticKV):
        sees = tree_mask(fed_parents(pending, proposal))  # on the CPU, as its positions: `static_pass` moves them
        # [1, f, H], [rows, V]
        hidden, logits = static_pass(model, cache, fed, chain_positions(sees, cached), sees, rows=rows, layers=layers,
                                     keep_hidden=bool(features))
        return TargetPass(logits, hidden, cached, pending)
    tree = {}
    if not proposal.is_chain:
        sees = tree_mask(fed_parents(pending, proposal))
        tree = {"attention_mask": to_device(additive_mask(sees, cached, model.dtype), fed.device),
                "position_ids": to_device(torch.from_numpy(chain_positions(sees, cached))[None], fed.device)}
    if features:
        out = model.get_decoder()(input_ids=fed, past_key_values=cache, use_cache=True,
                                  output_hidden_states=bool(layers), **tree, **per_pass(model))
        logits = model.get_output_embeddings()(out.last_hidden_state[0, rows]).float()
        return TargetPass(logits, with_layers(out, layers), cached, pending)  # hidden [1, f, (len(layers) + 1) * H]
    # the rows as a count from the end where they are the last ones, else as indices
    keep = (len(rows) if rows[-1] == fed.shape[1] - 1 and len(rows) == rows[-1] - rows[0] + 1
            else tensor_on(rows, fed.device))
    logits = model(fed, past_key_values=cache, use_cache=True, logits_to_keep=keep, **tree, **per_pass(model)).logits[0]
    return TargetPass(logits.float(), None, cached, pending)


def batch_cache(model: PreTrainedModel, need: int, rows: int, passes: CompiledPass | None = None) -> Cache:
    """The target's cache for `rows` sequences decoded side by side (beam search's k beams) that may
    feed up to `need` positions: `static.request_cache`'s for one row (static, run by `passes`, when
    given); transformers' DynamicCache for more, whose passes run eagerly (a `StaticKV` holds one row)."""
    return request_cache(model, need, passes) if rows == 1 else DynamicCache(config=model.config)


def batch_pass(model: PreTrainedModel, cache: Cache, sequences: torch.Tensor) -> torch.Tensor:
    """The target's logits [k, V] (float32) after each row of `sequences` [k, n]: one pass over the
    tokens the cache has not seen (as many in every row), nothing proposed. One row is `target_pass`
    with the empty proposal (the static path on a `StaticKV`); k rows are transformers' batched pass
    over the cache `batch_cache` made for them."""
    if sequences.shape[0] == 1:
        return target_pass(model, cache, sequences, EMPTY).logits
    fed = sequences[:, cache.get_seq_length() :]  # [k, pending]
    return model(fed, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1].float()


def scores_after(choose: TokenChooser, sequence: torch.Tensor, proposal: Proposal,
                 logits: torch.Tensor) -> torch.Tensor:
    """The target's processed scores [1 + candidates, V] after the root and after each candidate
    node (`logits` rows in that order; `sequence` [1, n] ends with the root). A repetition penalty
    or n-gram ban depends on the tokens before, so each row is processed after its own path, as
    one-token decoding would; without a processor the logits are the scores."""
    logits = logits[: 1 + proposal.candidates]
    if not choose.processors:
        return logits
    rows = []
    for row, node in enumerate(range(-1, proposal.candidates)):
        path = sequence.new_tensor([[proposal.tokens[i] for i in proposal.ancestry(node)]])  # [1, depth]
        rows.append(choose.scores(torch.cat([sequence, path], dim=-1), logits[row : row + 1]))
    return torch.cat(rows)


def choices_after(choose: TokenChooser, sequence: torch.Tensor, proposal: Proposal, logits: torch.Tensor) -> list[int]:
    """The target's greedy choice after the root (index 0) and after each candidate node (1 + i),
    then after each read work node (`Proposal.read`; from its raw logits: a work node is never
    accepted, so nothing processes it), in one read of the device."""
    scores = scores_after(choose, sequence, proposal, logits)
    if proposal.read:
        scores = torch.cat([scores, logits[1 + proposal.candidates :]]) if choose.processors else logits
    return scores.argmax(dim=-1).tolist()


def read_with_choices(proposal: Proposal, logits: torch.Tensor) -> tuple[Proposal, list[int]]:
    """A proposal whose tokens are still on the device (`Proposal.on_device`), read in one read with
    the target's greedy choices after the root and each node (`logits` [1 + size, V]; plain greedy
    decoding, as `choices_after` without processors): the proposal as read, and the choices."""
    size = proposal.size
    read = torch.cat([proposal.on_device, logits[: 1 + size].argmax(dim=-1)]).tolist()
    return replace(proposal, tokens=tuple(read[:size]), on_device=None), read[size:]


def greedy_verdicts(proposal: Proposal, choices: list[int]) -> list[bool]:
    """Greedy verification: a node passes when its token is the target's choice after its parent."""
    return [proposal.tokens[node] == choices[proposal.parents[node] + 1] for node in range(proposal.candidates)]


def deepest(proposal: Proposal, verdicts: list[bool], likelihoods: list[float] | None = None) -> list[int]:
    """The path (from the root's child down) to the deepest candidate whose whole path passes;
    [] when none does. Ties go to the likelier path (`likelihoods`: each node's probability after
    its parent, Medusa's typical acceptance), else to the earlier node. Greedy verdicts pass at
    most one child of a node whose siblings differ; equal siblings (a copy repeating a draft's
    branch) hold the target's same tokens, so either path commits the same answer."""
    passed, depth, log_likelihood, best = {-1}, {-1: 0}, {-1: 0.0}, -1
    for node in range(proposal.candidates):
        parent = proposal.parents[node]
        if parent not in passed or not verdicts[node]:
            continue
        passed.add(node)
        depth[node] = depth[parent] + 1
        log_likelihood[node] = log_likelihood[parent] + (math.log(max(likelihoods[node], 1e-30))
                                                         if likelihoods else 0.0)
        if (depth[node], log_likelihood[node]) > (depth[best], log_likelihood[best]):
            best = node
    return proposal.ancestry(best)


def accept_greedy(proposal: Proposal, choices: list[int]) -> tuple[list[int], int]:
    """The accepted path and the target's own token after it (AR's answer, exactly)."""
    path = deepest(proposal, greedy_verdicts(proposal, choices))
    return path, choices[path[-1] + 1 if path else 0]


def commit(cache: Cache, verified: TargetPass, path: list[int]) -> None:
    """Keep in the cache the committed tokens the pass fed and the accepted path's entries, moved
    right after them; drop the rest (`kvcache.keep_positions`)."""
    length = verified.cached + verified.pending
    keep_positions(cache, length, [length + node for node in path])
