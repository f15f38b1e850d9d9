"""Medusa: extra decoding heads propose a tree of candidates; the target verifies it in one pass.

Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads". Head k (k = 0..K-1) reads the target's last hidden state h_t and predicts the token
k + 2 places ahead (the target's own LM head predicts the next one): `num_layers` residual
blocks x + SiLU(W x + b), then an LM head (Sec. 2.1.1). Heads may also read the token h_t
predicted, the last committed one, which Medusa-1's heads guess past blind (`MedusaHeads`);
ours do. Heads may further read the tokens of their tree path before their own (Hydra's
sequentially dependent heads, `reads_path`): their tree then grows a level a call (`grow`).

The candidate tree (Sec. 2.1.2) is a list of paths of top-k indices, the `medusa_choices` form:
path (2, 0) is head 0's third-best token followed by head 1's best. One target pass feeds the
last committed token (the root) and every node, each node seeing only its ancestors; greedy
verification keeps the longest root-to-leaf path whose every token is the target's argmax after
its parent, then the target's own token after it. Only that path's KV entries are kept.

The tree is chosen afresh each pass by default (`tree="dynamic"`): the nodes whose paths the heads
are likeliest to get right at this step, by the product of their confidences (EAGLE-2's node
value), so a pass goes deep where the heads are sure and wide where they are not. A static tree
(`tree="static"`, the paths most often right on held-out answers) is the same every pass.

Beside the heads' nodes the tree may hold a chain copied from the text (`prompt_lookup`): the
tokens that followed the text's last few tokens where they occurred before. The heads guess
from one hidden state and drift after a few tokens; a copy is often right for many more where
the answer quotes its prompt or repeats itself. Where the text offers none, the chain comes
from a datastore of the target's earlier answers (`retrieval`, REST): what most of them wrote
after the text's last few tokens. It is verified like any other branch.
"""

import functools
import heapq
import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from specdemo.core.attention import sees_from_parents
from specdemo.core.errors import SpecDemoError, check_whole
from specdemo.core.events import StepEvent, Summary
from specdemo.core.loop import Context, Learned, Proposer, Verdict, decode
from specdemo.core.prepack import linear, prepack
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.core.static import fitted_size
from specdemo.core.steps import ChainStep, TreeStep
from specdemo.core.verify import EMPTY, Proposal, TargetPass, deepest, scores_after
from specdemo.methods.draft import ASSETS
from specdemo.methods.draft_tree import DraftTree, expand
from specdemo.methods.prompt_lookup import check_copy_length
from specdemo.methods.retrieval import Datastore, guessed_branch
from specdemo.models import local_folder

HEADS_FILE, CONFIG_FILE = "medusa_heads.safetensors", "medusa_config.json"
VOCAB_KEY = "proposal_vocab"  # in HEADS_FILE: the token ids our heads propose from
MIXERS_KEY = "mixers"  # in HEADS_FILE: the prefix of the token mixers' weights, for heads that read the token
EMBEDDED_HEADS = ASSETS / "smollm2-135m-medusa"
PUBLISHED_FILE, PUBLISHED_CONFIG = "medusa_lm_head.pt", "config.json"
TREES = ("dynamic", "static", "chain")  # or a list of paths
MAX_TREE_SIZE = 128  # heads' nodes in a dynamic tree


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W initialised to zero so a new head starts as the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class TokenMixer(nn.Module):
    """W [h; e(x_1); ...; e(x_n)]: a head's input from the hidden state h and the embeddings of the
    `tokens` after it (the token h predicted, then for a head that reads its path the tokens its
    tree path holds before its own), W initialised to [I 0 ... 0] so that a new mixer passes h
    through unchanged."""

    def __init__(self, hidden_size: int, tokens: int = 1):
        super().__init__()
        self.linear = nn.Linear((1 + tokens) * hidden_size, hidden_size)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.weight[:, :hidden_size].copy_(torch.eye(hidden_size))
            self.linear.bias.zero_()

    def forward(self, joined: torch.Tensor) -> torch.Tensor:
        """W [h; e(x_1); ...] for `joined` [..., (1 + tokens) H]."""
        return self.linear(joined)


class MedusaHeads(nn.Module):
    """K heads on the target's last hidden state. With `shared_lm_head` (the target's own) the
    heads store only their residual blocks, a few MB instead of an LM head each, and may propose
    from a `vocab` subset (token ids): its rows of the LM head cost a sixth of the full head per
    call, and verification by the target stays exact whatever the heads propose.

    With `embedding` (the target's input embedding) each head also reads the token its hidden
    state predicted, the last committed one, through a `TokenMixer` in front of its blocks. That
    token is known when the heads propose; Medusa-1's heads guess past it blind. Such heads still
    all run in one call (`forward`).

    With `reads_path` as well, head k also reads the k tokens its tree path holds before its own:
    Hydra's sequentially dependent heads (Ankner et al. 2024, "Hydra: Sequentially-Dependent Draft
    Heads for Medusa Decoding"), head k on [h; e(x); e(y_1); ...; e(y_k)]. A head then guesses each
    child of each node from that node's own path, so the tree grows a level a call (`head_logits`),
    as a draft's does, for a few small products more; what it gains is the guesses of the heads
    after the first, which Medusa-1's heads make blind."""

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        num_heads: int,
        num_layers: int = 1,
        shared_lm_head: nn.Module | None = None,
        vocab: torch.Tensor | None = None,
        embedding: nn.Module | None = None,
        reads_path: bool = False,
    ):
        super().__init__()
        if reads_path and embedding is None:
            raise SpecDemoError("heads that read their tree path read the tokens' embeddings: pass the target's")
        self.num_heads, self.num_layers, self.reads_path = num_heads, num_layers, reads_path
        self.mixers = None if embedding is None else nn.ModuleList(TokenMixer(hidden_size, 1 + k * reads_path) for k in range(num_heads))
        if embedding is not None:  # the target's, never saved with the heads
            self.register_buffer("embedding_weight", embedding.weight.detach(), persistent=False)
        self.blocks = nn.ModuleList(nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)]) for _ in range(num_heads))
        self.lm_heads = None if shared_lm_head is not None else nn.ModuleList(nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads))
        self.vocab = vocab
        if shared_lm_head is not None:  # a buffer, so .to() moves it, but never saved with the blocks
            weight = shared_lm_head.weight.detach()
            self.register_buffer("proposal_weight", weight if vocab is None else weight[vocab], persistent=False)
        self.choices: list[list[int]] | None = None  # tree paths that came with the heads, best first
        self.default_tree_size: int | None = None  # how many of them make the default tree

    @property
    def reads_token(self) -> bool:
        return self.mixers is not None

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [K, ..., S] of every head for hidden states [..., H] (and, for heads that read
        it, the token [...] each state predicted; for heads that read their path, the tokens
        [..., K] after each state, teacher-forced: head k reads the first k + 1), over `vocab`
        (S tokens) when the heads have one, else over the whole vocabulary."""
        if self.mixers is None:
            inputs = [hidden] * self.num_heads
        else:
            if tokens is None:
                raise SpecDemoError("these Medusa heads read the token each hidden state predicted: pass it")
            if self.reads_path:
                joined = torch.cat([hidden, *self.embedded(tokens, hidden.dtype).unbind(-2)], dim=-1)  # [..., (1 + K) H]
                inputs = [mixer(joined[..., : (2 + k) * hidden.shape[-1]]) for k, mixer in enumerate(self.mixers)]
            else:
                joined = torch.cat([hidden, self.embedded(tokens, hidden.dtype)], dim=-1)
                inputs = [mixer(joined) for mixer in self.mixers]
        if self.lm_heads is not None:
            return torch.stack([lm_head(block(x)) for x, block, lm_head in zip(inputs, self.blocks, self.lm_heads)])
        return linear(torch.stack([block(x) for x, block in zip(inputs, self.blocks)]), self.proposal_weight)  # one product for all heads

    def embedded(self, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The target's embeddings of `tokens` [...] -> [..., H], in `dtype`."""
        return self.embedding_weight[tokens].to(dtype)

    def head_logits(self, k: int, joined: torch.Tensor) -> torch.Tensor:
        """Head k's logits [q, S] for heads that read their path: `joined` [q, (2 + k) H] is
        [h; e(x); e(y_1); ...; e(y_k)], the hidden state and the tokens of each node's path."""
        x = self.blocks[k](self.mixers[k](joined))
        return self.lm_heads[k](x) if self.lm_heads is not None else linear(x, self.proposal_weight)

    def token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Token ids of indices into the heads' proposal vocabulary."""
        return indices if self.vocab is None else self.vocab.to(indices.device)[indices]

    def top_tokens(self, hidden: torch.Tensor, top_k: Sequence[int], token: int | None = None) -> list[list[int]]:
        """Head k's top_k[k] token ids, best first, for one hidden state [H] (and the token it predicted)."""
        ranked, _ = self.ranked(hidden, max(top_k), token)
        return [row[:k] for row, k in zip(ranked, top_k)]

    def ranked(self, hidden: torch.Tensor, k: int, token: int | None = None) -> tuple[list[list[int]], torch.Tensor]:
        """Each head's k best token ids, best first, and their log-probabilities [K, k] (over
        the heads' vocabulary), for one hidden state [H] (and the token it predicted)."""
        if self.reads_path:
            raise SpecDemoError("heads that read their tree path guess a level at a time: `medusa.grow` or `medusa.path_tokens`")
        tokens = None if token is None else torch.tensor(token, device=hidden.device)
        log_probs = torch.log_softmax(self(hidden, tokens).float(), dim=-1)  # [K, S]
        best = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)
        return self.token_ids(best.indices).tolist(), best.values

    def load_trained(self, tensors: dict[str, torch.Tensor]) -> None:
        """The blocks and, for heads that read the token, the mixers from the tensors `save` wrote
        (without the proposal vocabulary). Heads that read the token may start from heads that do
        not: their mixers then stay [I 0]."""
        mixers = {name.removeprefix(f"{MIXERS_KEY}."): tensor for name, tensor in tensors.items() if name.startswith(f"{MIXERS_KEY}.")}
        self.blocks.load_state_dict({name: tensor for name, tensor in tensors.items() if not name.startswith(f"{MIXERS_KEY}.")})
        if mixers and self.mixers is not None:
            own = self.mixers.state_dict()
            for name, tensor in mixers.items():  # a mixer that read fewer tokens: its columns first, the new ones zero
                if tensor.shape != own[name].shape:
                    tensor = torch.cat([tensor, tensor.new_zeros(tensor.shape[0], own[name].shape[1] - tensor.shape[1])], dim=1)
                own[name] = tensor
            self.mixers.load_state_dict(own)

    def save(self, folder: Path, **metadata) -> None:
        """Our format: the residual blocks (the LM head is the target's), the proposal vocabulary
        if any, and a small config."""
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.contiguous() for k, v in self.blocks.state_dict().items()}
        if self.mixers is not None:
            tensors |= {f"{MIXERS_KEY}.{k}": v.contiguous() for k, v in self.mixers.state_dict().items()}
        if self.vocab is not None:
            tensors[VOCAB_KEY] = self.vocab.cpu()
        save_file(tensors, folder / HEADS_FILE)
        config = {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers, "reads_token": self.reads_token,
                  "reads_path": self.reads_path, **metadata}
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def load_heads(folder: str | Path, target: PreTrainedModel) -> MedusaHeads:
    """Heads from `folder`: ours (medusa_heads.safetensors, sharing the target's LM head) or the
    published Medusa format (medusa_lm_head.pt with a config giving medusa_num_heads and
    medusa_num_layers; each head has its own LM head). `folder` may be a Hub id of such files."""
    folder = local_folder(folder, (HEADS_FILE, CONFIG_FILE, PUBLISHED_FILE, PUBLISHED_CONFIG))
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    if (folder / HEADS_FILE).exists():
        config = json.loads((folder / CONFIG_FILE).read_text())
        tensors = load_file(folder / HEADS_FILE)
        proposal_vocab = tensors.pop(VOCAB_KEY, None)
        embedding = target.get_input_embeddings() if config.get("reads_token") else None
        heads = MedusaHeads(hidden, vocab, config["medusa_num_heads"], config["medusa_num_layers"], target.get_output_embeddings(), proposal_vocab, embedding,
                            config.get("reads_path", False))
        heads.load_trained(tensors)
        heads.choices, heads.default_tree_size = config.get("medusa_choices"), config.get("default_tree_size")
    elif (folder / PUBLISHED_FILE).exists():
        config = json.loads((folder / PUBLISHED_CONFIG).read_text())
        heads = MedusaHeads(hidden, vocab, config["medusa_num_heads"], config["medusa_num_layers"])
        heads.load_state_dict(published_to_ours(torch.load(folder / PUBLISHED_FILE, map_location="cpu", weights_only=True), heads.num_layers))
    else:
        raise SpecDemoError(f"no Medusa heads in {folder}: expected {HEADS_FILE} or {PUBLISHED_FILE}")
    if any(p.shape[-1] != hidden for p in heads.blocks.parameters() if p.dim() == 2):
        raise SpecDemoError(f"the heads in {folder} were trained for another model (hidden size differs from {hidden})")
    parameter = next(target.parameters())
    heads.to(device=parameter.device, dtype=parameter.dtype).eval()
    prepack(heads)
    return heads


def published_to_ours(state: dict, num_layers: int) -> dict:
    """Keys of the published format, `{head}.{layer}.linear.*` and `{head}.{num_layers}.weight`
    (one nn.Sequential per head), renamed to ours."""
    renamed = {}
    for key, value in state.items():
        head, layer, *rest = key.split(".")
        if int(layer) == num_layers:
            renamed[f"lm_heads.{head}.{'.'.join(rest)}"] = value
        else:
            renamed[f"blocks.{head}.{layer}.{'.'.join(rest)}"] = value
    return renamed


@dataclass(frozen=True)
class Tree:
    """A candidate tree. Node 0 is the root (the last committed token); node i > 0 follows
    `paths[i - 1]`, heads' nodes ordered by depth, so a parent always comes before its children;
    then `copy_depth` nodes chained from the root hold tokens copied from the text."""

    paths: tuple[tuple[int, ...], ...]
    copy_depth: int
    parents: tuple[int, ...]  # parent node of each node; -1 for the root
    sees: torch.Tensor  # [n, n] bool: node i sees node j (its ancestors and itself)
    ancestry: tuple[tuple[int, ...], ...]  # node indices from the root to each node, itself included
    candidates: tuple[tuple[int, ...], ...]  # the ancestry of each leaf
    candidate_through: tuple[tuple[int, ...], ...]  # per node, the first candidate that passes through it
    depths: tuple[int, ...]  # per node, its depth (the root's is 0)
    top_k: tuple[int, ...]  # how many top tokens each head must supply

    @property
    def size(self) -> int:
        return len(self.parents)

    def depth(self, node: int) -> int:
        return self.depths[node]


@functools.lru_cache(maxsize=1024)  # dynamic trees of one size take a few hundred shapes
def cached_tree(choices: tuple[tuple[int, ...], ...], copy_depth: int = 0) -> Tree:
    """`build_tree`, once per distinct tree: its mask and depths are reused by every pass and run."""
    return build_tree(choices, copy_depth)


def build_tree(choices: Iterable[Sequence[int]], copy_depth: int = 0) -> Tree:
    """The tree for `choices` (the medusa_choices form), with a copied chain `copy_depth` long."""
    paths = sorted({tuple(int(i) for i in path) for path in choices}, key=lambda path: (len(path), path))
    if not paths or any(not path or min(path) < 0 for path in paths):
        raise SpecDemoError("a Medusa tree is a non-empty list of non-empty paths of top-k indices (0 = the best)")
    index = {(): 0, **{path: i + 1 for i, path in enumerate(paths)}}
    missing = [path for path in paths if path[:-1] not in index]
    if missing:
        raise SpecDemoError(f"the tree path {missing[0]} has no parent {missing[0][:-1]}: list every prefix too")
    parents = (-1, *(index[path[:-1]] for path in paths))
    ancestry = ((0,), *((0, *(index[path[:d]] for d in range(1, len(path) + 1))) for path in paths))
    for node in range(len(parents), len(parents) + copy_depth):  # the copied chain, from the root
        parents += (0 if node == len(paths) + 1 else node - 1,)
        ancestry += ((*ancestry[parents[-1]], node),)
    has_child = set(parents)
    candidates = tuple(nodes for node, nodes in enumerate(ancestry) if node not in has_child)
    candidate_through = tuple(next(c for c in candidates if c[: len(nodes)] == nodes) for nodes in ancestry)
    depth = max(len(path) for path in paths)
    top_k = tuple(1 + max(path[d] for path in paths if len(path) > d) for d in range(depth))
    depths = tuple(len(nodes) - 1 for nodes in ancestry)
    return Tree(tuple(paths), copy_depth, parents, sees_from_parents(list(parents)), ancestry, candidates, candidate_through, depths, top_k)


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
    compiled: bool = True,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` [1, L], verifying a tree of the heads' candidates each pass.
    `tree`: "dynamic" (each pass, the `tree_size` nodes of highest value by the heads'
    confidences: `dynamic_paths`), "static" (the paths that came with the heads, else the
    chain), "chain" (each head's best token only), or paths in the medusa_choices form. For a
    static tree `tree_size` keeps its first paths (a tree grown by estimated acceptance lists
    parents first, so any prefix is a tree); by default a dynamic tree has as many nodes as the
    heads' default static tree.
    Greedy verification gives exactly AR's answer. `typical_acceptance` (with sampling on) is
    Medusa's rule for sampling, ε and α as in the paper: it does NOT keep the target's
    distribution (see `typical_verdicts`). `copy_length` > 0 adds a chain of up to that many
    tokens copied from the text (prompt lookup) to each pass's tree; None: COPY_LENGTH. Where the
    text offers no copy, `retrieve` takes the chain from `datastore` (earlier answers of the
    target: `retrieval`, REST).
    Heads that read their path (Hydra) grow a dynamic tree as EAGLE-2 grows a draft's
    (`draft_tree.expand`): level by level, the `tree_top_k` nodes of highest value each get their
    `tree_top_k` likeliest children, then the `tree_size` best nodes stay.
    `compiled`: take the model's compiled static pass when it has one."""
    check_acceptance(sampling, typical_acceptance, typical_epsilon, typical_alpha)
    if tree == "dynamic":
        static, dynamic_size = None, check_dynamic_size(heads, tree_size)
    else:
        static, dynamic_size = resolve_tree(heads, tree, tree_size), 0
    if static is not None and len(static.top_k) > heads.num_heads:
        raise SpecDemoError(f"the tree is {len(static.top_k)} deep but there are only {heads.num_heads} heads")
    typical = (typical_epsilon, typical_alpha) if typical_acceptance else None
    check_whole("tree_top_k", tree_top_k, 1, MAX_TREE_SIZE)
    proposer = MedusaTree(heads, static, dynamic_size, check_copy_length(copy_length), typical, tree_top_k, datastore if retrieve else None)
    return decode(model, input_ids, proposer, method="medusa", max_new_tokens=max_new_tokens, sampling=sampling, eos_token_ids=eos_token_ids, stop=stop,
                  compiled=compiled)


class MedusaTree(Proposer):
    """Proposes the heads' candidate tree (and a chain copied from the text) after the last
    committed token; learns the hidden state the heads read next: the accepted node's."""

    features = True  # the heads read the target's last hidden state

    def __init__(self, heads: MedusaHeads, static: Tree | None, dynamic_size: int, copy_length: int, typical: tuple[float, float] | None,
                 top_k: int = 3, datastore: Datastore | None = None):
        self.heads, self.static, self.dynamic_size, self.copy_length, self.typical = heads, static, dynamic_size, copy_length, typical
        self.datastore = datastore
        self.copy_source = "copy"  # where this pass's chain came from: the text ("copy") or the datastore ("retrieved")
        self.top_k = top_k  # a path-reading dynamic tree's children per expanded node, and nodes expanded per level
        self.hidden: torch.Tensor | None = None  # [H] the last committed token's parent position's hidden state
        self.tree: Tree | None = None  # this pass's tree

    def propose(self, context: Context, sequence: torch.Tensor, room: int) -> Proposal:
        if self.hidden is None:  # the prefill: its last hidden state gives the first token and the first proposals
            return EMPTY
        # The heads read the hidden state of the last committed token's parent position; a static tree
        # takes their top tokens, a dynamic one first chooses which paths by their confidences. Near the
        # end of the answer no path goes deeper than what can still be committed, so no node sits past
        # the request's last position (nor past the model's context).
        depth_limit = max(room - 1, 1)
        copied, self.copy_source = guessed_branch(sequence[0], min(self.copy_length, room - 1), context.eos, self.datastore)
        root = int(sequence[0, -1])
        if self.heads.reads_path:  # each node's children guessed from its own path, a level a call
            if self.static is None:
                size = fitted_size(self.dynamic_size, len(copied), context.bucket, context.model.device)
                depth = min(self.heads.num_heads, depth_limit)
                token_at = paths_of(grow(self.heads, self.hidden, root, depth=depth, top_k=self.top_k, size=size, eos=context.eos))
            else:
                token_at = path_tokens(self.heads, self.hidden, root, [p for p in self.static.paths if len(p) <= depth_limit])
            self.tree = cached_tree(tuple(sorted(token_at)), len(copied))
            return proposal(self.tree, [root, *(token_at[path] for path in self.tree.paths), *copied], self.copy_source)
        if self.static is None:
            size = fitted_size(self.dynamic_size, len(copied), context.bucket, context.model.device)
            top, log_probs = self.heads.ranked(self.hidden, size, self.token(sequence))
            paths = tuple(sorted(dynamic_paths(log_probs.tolist()[:depth_limit], size)))  # sorted: one cache entry per shape
        else:
            paths = tuple(p for p in self.static.paths if len(p) <= depth_limit)
            top = self.heads.top_tokens(self.hidden, self.static.top_k, self.token(sequence))
        self.tree = cached_tree(paths, len(copied))
        return proposal(self.tree, [*tree_tokens(self.tree, root, top), *copied], self.copy_source)

    def token(self, sequence: torch.Tensor) -> int | None:
        """The last committed token, the one the heads' hidden state predicted, for heads that read it."""
        return int(sequence[0, -1]) if self.heads.reads_token else None

    def accept(self, context: Context, sequence: torch.Tensor, proposal: Proposal, verified: TargetPass) -> Verdict:
        """Greedy verification, or typical acceptance (`typical_verdicts`) when sampling."""
        if self.typical is None or not proposal.size:
            return super().accept(context, sequence, proposal, verified)
        probs = torch.softmax(scores_after(context.choose, sequence, proposal, verified.logits).float(), dim=-1)  # [n, V]
        tokens = [int(sequence[0, -1]), *proposal.tokens]
        token_probs = probs_after_parents(self.tree, tokens, probs)
        verdicts, thresholds = typical_verdicts(self.tree, token_probs, probs, *self.typical)
        path = deepest(proposal, verdicts[1:], token_probs[1:])
        token = int(torch.multinomial(probs[path[-1] + 1 if path else 0], 1, generator=context.choose.generator))
        return Verdict(path, token, {"token_probs": token_probs, "thresholds": thresholds})

    def learn(self, context: Context, sequence: torch.Tensor, proposal: Proposal, verified: TargetPass, verdict: Verdict, kept: list[int]) -> Learned:
        node = verdict.path[-1] + 1 if verdict.path else 0  # the accepted node, 0 the root
        self.hidden = verified.hidden[0, verified.root_row + node]
        if not proposal.size:  # the prefill: an empty chain
            return Learned(data=ChainStep(gamma=0, accept_length=0, target_token=verdict.token, proposer="heads"))
        tree, tokens = self.tree, [int(sequence[0, -len(verdict.path) - 2]), *proposal.tokens]
        best = tree.candidate_through[node]
        return Learned(
            rejected=[tokens[i] for i in best[len(verdict.path) + 1 :]],
            data=TreeStep(
                tree_tokens=tokens,
                tree_parents=list(tree.parents),
                tree_depths=list(tree.depths),
                tree_sources=["head"] * len(tree.paths) + [self.copy_source] * tree.copy_depth,
                accepted_path=[0, *(n + 1 for n in verdict.path)],
                best_candidate=list(best),
                accept_length=len(verdict.path),
                proposer="heads",
                tree_kind="static" if self.static is not None else "dynamic",
                acceptance_rule="typical" if self.typical else "greedy",
                **verdict.details,
            ),
        )


def grow(heads: MedusaHeads, hidden: torch.Tensor, token: int, *, depth: int, top_k: int, size: int, eos: tuple[int, ...] = ()) -> DraftTree:
    """The dynamic tree of heads that read their path (Hydra), after the hidden state `hidden` [H]
    and the token it predicted: EAGLE-2's expand and rerank (`draft_tree.expand`), head k guessing
    the children of the nodes at depth k from [h; e(x); e(y_1); ...; e(y_k)], their paths. The
    root may get all `size` nodes as children: head 0 is right far less often than a draft's first
    guess (it sees one hidden state, no attention), and its alternatives are most of what a tree
    of 8 gains (26 Spec-Bench questions, bfloat16: 2.44 tokens a pass, against 2.34 with at most
    3 children at the root as at every other level)."""
    joined = torch.cat([hidden, heads.embedded(torch.tensor(token, device=hidden.device), hidden.dtype)])[None]  # [1, 2H]

    def level_logits(tree: DraftTree, nodes: list[int], tokens: torch.Tensor, states: torch.Tensor, level: int):
        joined = torch.cat([states, heads.embedded(tokens, states.dtype)], dim=-1)  # [q, (1 + level) H]
        return heads.head_logits(level - 1, joined), joined

    return expand(heads.token_ids, heads.head_logits(0, joined), joined, level_logits, depth=depth, top_k=top_k, size=size, eos=eos, first_k=size)


def paths_of(tree: DraftTree) -> dict[tuple[int, ...], int]:
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


def path_tokens(heads: MedusaHeads, hidden: torch.Tensor, token: int, paths: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], int]:
    """The token at each rank path of a static tree for heads that read their path: head d - 1's
    r-th best guess after the node's parent's path, one call a level."""
    embed = lambda t: heads.embedded(torch.tensor(t, device=hidden.device), hidden.dtype)  # noqa: E731
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


def proposal(tree: Tree, tokens: list[int], copy_source: str = "copy") -> Proposal:
    """The proposal of a tree whose node i holds `tokens[i]` (node 0, the root, is the last
    committed token); its copied chain came from `copy_source` ("copy" or "retrieved")."""
    sources = ("head",) * len(tree.paths) + (copy_source,) * tree.copy_depth
    return Proposal(tuple(tokens[1:]), tuple(parent - 1 for parent in tree.parents[1:]), sources)


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


def tree_tokens(tree: Tree, root: int, top: list[list[int]]) -> list[int]:
    """The token at every node: the root, then for path p head len(p)-1's p[-1]-th best token."""
    return [root, *(top[len(path) - 1][path[-1]] for path in tree.paths)]


def check_acceptance(sampling: SamplingConfig, typical_acceptance: bool, epsilon: float, alpha: float) -> None:
    if sampling.do_sample and not typical_acceptance:
        raise SpecDemoError(
            "medusa verifies greedily unless you opt in to typical acceptance (typical_acceptance=True), "
            "which samples but does not keep the target's distribution; or choose ar or speculative to sample exactly"
        )
    if typical_acceptance and not sampling.do_sample:
        raise SpecDemoError("typical acceptance is Medusa's rule for sampling: turn sampling on, or turn it off for greedy verification")
    if not (0 < epsilon <= 1 and 0 < alpha <= 1):
        raise SpecDemoError(f"typical acceptance needs 0 < epsilon <= 1 and 0 < alpha <= 1, got {epsilon} and {alpha}")


def probs_after_parents(tree: Tree, tokens: list[int], probs: torch.Tensor) -> list[float]:
    """Each node's token's probability under the target after its parent (1 for the root), one gather."""
    return [1.0, *probs[list(tree.parents[1:]), tokens[1:]].tolist()]


def typical_verdicts(tree: Tree, token_probs: list[float], probs: torch.Tensor, epsilon: float, alpha: float) -> tuple[list[bool], list[float]]:
    """Typical acceptance (Cai et al. 2024, Sec. 2.3.1): a node passes when the target gives its
    token, after its parent, a probability (`token_probs`) above min(ε, α exp(-H(p))), H the
    entropy of the target's distribution p there (`probs` [n, V]). It accepts plausible tokens,
    more of them where the target is unsure; it is NOT distribution-preserving (unlike speculative
    sampling's rejection rule). Returns the verdicts and each node's threshold (for the token after it)."""
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(dim=-1)  # [n]
    thresholds = torch.minimum(torch.full_like(entropy, epsilon), alpha * torch.exp(-entropy)).tolist()
    return [True, *(token_probs[node] > thresholds[tree.parents[node]] for node in range(1, tree.size))], thresholds
