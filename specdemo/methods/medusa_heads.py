"""Medusa's heads and their files: the modules, our format (blocks sharing the target's LM head) and the published one.

Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads". Head k (k = 0..K-1) reads the target's last hidden state h_t and predicts the token
k + 2 places ahead (the target's own LM head predicts the next one): `num_layers` residual
blocks x + SiLU(W x + b), then an LM head (Sec. 2.1.1). Heads may also read the token h_t
predicted, the last committed one, which Medusa-1's heads guess past blind (`MedusaHeads`);
ours do. Heads may further read the tokens of their tree path before their own (Hydra's
sequentially dependent heads, `reads_path`): their tree then grows a level a call (`medusa.grow`).
"""

import functools
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from specdemo.core.errors import SpecDemoError
from specdemo.core.graphs import FunctionGraphs
from specdemo.core.prepack import Packed, linear, prepack
from specdemo.core.transfer import tensor_on
from specdemo.methods.draft import ProposesFromVocab
from specdemo.models import local_folder

HEADS_FILE, CONFIG_FILE = "medusa_heads.safetensors", "medusa_config.json"
VOCAB_KEY = "proposal_vocab"  # in HEADS_FILE: the token ids our heads propose from
MIXERS_KEY = "mixers"  # in HEADS_FILE: the prefix of the token mixers' weights, for heads that read the token
PUBLISHED_FILE, PUBLISHED_CONFIG = "medusa_lm_head.pt", "config.json"


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


class MedusaHeads(nn.Module, ProposesFromVocab):
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
        self.mixers = (None if embedding is None
                       else nn.ModuleList(TokenMixer(hidden_size, 1 + k * reads_path) for k in range(num_heads)))
        if embedding is not None:  # the target's, never saved with the heads
            self.register_buffer("embedding_weight", embedding.weight.detach(), persistent=False)
        self.blocks = nn.ModuleList(nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)])
                                    for _ in range(num_heads))
        self.lm_heads = (None if shared_lm_head is not None
                         else nn.ModuleList(nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads)))
        # a buffer, so .to() moves it with the heads: a graph of them reads it on their device
        self.register_buffer("vocab", vocab, persistent=False)
        if shared_lm_head is not None:  # a buffer, so .to() moves it, but never saved with the blocks
            weight = shared_lm_head.weight.detach()
            self.register_buffer("proposal_weight", weight if vocab is None else weight[vocab], persistent=False)
            self.proposal_packed = Packed()  # its layout for a CPU's products (`prepack`)
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
                # [..., (1 + K) H]
                joined = torch.cat([hidden, *self.embedded(tokens, hidden.dtype).unbind(-2)], dim=-1)
                inputs = [mixer(joined[..., : (2 + k) * hidden.shape[-1]]) for k, mixer in enumerate(self.mixers)]
            else:
                joined = torch.cat([hidden, self.embedded(tokens, hidden.dtype)], dim=-1)
                inputs = [mixer(joined) for mixer in self.mixers]
        if self.lm_heads is not None:
            return torch.stack([lm_head(block(x)) for x, block, lm_head in zip(inputs, self.blocks, self.lm_heads)])
        # one product for all heads
        return linear(torch.stack([block(x) for x, block in zip(inputs, self.blocks)]), self.proposal_weight,
                      packed=self.proposal_packed)

    def embedded(self, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The target's embeddings of `tokens` [...] -> [..., H], in `dtype`. A lookup, not an index:
        indexing by a tensor of no dimensions reads its value on the host, which a CUDA graph
        cannot capture."""
        return nn.functional.embedding(tokens, self.embedding_weight).to(dtype)

    def head_logits(self, k: int, joined: torch.Tensor) -> torch.Tensor:
        """Head k's logits [q, S] for heads that read their path: `joined` [q, (2 + k) H] is
        [h; e(x); e(y_1); ...; e(y_k)], the hidden state and the tokens of each node's path."""
        x = self.blocks[k](self.mixers[k](joined))
        if self.lm_heads is not None:
            return self.lm_heads[k](x)
        return linear(x, self.proposal_weight, packed=self.proposal_packed)

    def top_tokens(self, hidden: torch.Tensor, top_k: Sequence[int], token: int | None = None,
                   graphs: FunctionGraphs | None = None) -> list[list[int]]:
        """Head k's top_k[k] token ids, best first, for one hidden state [H] (and the token it predicted)."""
        ranked, _ = self.ranked(hidden, max(top_k), token, graphs)
        return [row[:k] for row, k in zip(ranked.tolist(), top_k)]

    def ranked(self, hidden: torch.Tensor, k: int, token: int | None = None,
               graphs: FunctionGraphs | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's k best token ids, best first, and their log-probabilities [K, k] (over
        the heads' vocabulary), for one hidden state [H] (and the token it predicted), on the heads'
        device and not read yet: on a GPU the host may work until it reads them. `graphs`: the heads
        run as CUDA graphs (`methods.method_options` makes them beside a graphed target), one a k:
        their few dozen launches cost one."""
        if self.reads_path:
            raise SpecDemoError("heads that read their tree path guess a level at a time: `medusa.grow` or "
                                "`medusa.path_tokens`")
        tokens = None if token is None else tensor_on(token, hidden.device)
        if graphs is None:
            ids, values = self.best(hidden, tokens, k=k)
        else:
            ids, values = graphs(("medusa heads", k), functools.partial(self.best, k=k), hidden,
                                 *([] if tokens is None else [tokens]))
        return ids, values

    def best(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None, *,
             k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`ranked`'s token ids and log-probabilities [K, k], as tensors on the heads' device."""
        log_probs = torch.log_softmax(self(hidden, tokens), dim=-1, dtype=torch.float32)  # [K, S], one kernel
        best = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)
        return self.token_ids(best.indices), best.values

    def load_trained(self, tensors: dict[str, torch.Tensor]) -> None:
        """The blocks and, for heads that read the token, the mixers from the tensors `save` wrote
        (without the proposal vocabulary). Heads that read the token may start from heads that do
        not: their mixers then stay [I 0]."""
        mixers = {name.removeprefix(f"{MIXERS_KEY}."): tensor for name, tensor in tensors.items()
                  if name.startswith(f"{MIXERS_KEY}.")}
        self.blocks.load_state_dict({name: tensor for name, tensor in tensors.items()
                                     if not name.startswith(f"{MIXERS_KEY}.")})
        if mixers and self.mixers is not None:
            own = self.mixers.state_dict()
            for name, tensor in mixers.items():  # a mixer that read fewer tokens: its columns first, the new ones zero
                if tensor.shape != own[name].shape:
                    tensor = torch.cat(
                        [tensor, tensor.new_zeros(tensor.shape[0], own[name].shape[1] - tensor.shape[1])], dim=1)
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
        config = {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                  "reads_token": self.reads_token, "reads_path": self.reads_path, **metadata}
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def load_heads(folder: str | Path, target: PreTrainedModel, choices: list[list[int]] | None = None) -> MedusaHeads:
    """Heads from `folder`: ours (medusa_heads.safetensors, sharing the target's LM head) or the
    published Medusa format (medusa_lm_head.pt with a config giving medusa_num_heads and
    medusa_num_layers; each head has its own LM head). `folder` may be a Hub id of such files.
    `choices`: the tree paths to use where the heads bring none (published heads bring none)."""
    folder = local_folder(folder, (HEADS_FILE, CONFIG_FILE, PUBLISHED_FILE, PUBLISHED_CONFIG))
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    if (folder / HEADS_FILE).exists():
        config = json.loads((folder / CONFIG_FILE).read_text())
        tensors = load_file(folder / HEADS_FILE)
        proposal_vocab = tensors.pop(VOCAB_KEY, None)
        embedding = target.get_input_embeddings() if config.get("reads_token") else None
        heads = MedusaHeads(hidden, vocab, config["medusa_num_heads"], config["medusa_num_layers"],
                            target.get_output_embeddings(), proposal_vocab, embedding, config.get("reads_path", False))
        heads.load_trained(tensors)
        heads.choices, heads.default_tree_size = config.get("medusa_choices"), config.get("default_tree_size")
    elif (folder / PUBLISHED_FILE).exists():
        config = json.loads((folder / PUBLISHED_CONFIG).read_text())
        heads = MedusaHeads(hidden, vocab, config["medusa_num_heads"], config["medusa_num_layers"])
        heads.load_state_dict(published_to_ours(
            torch.load(folder / PUBLISHED_FILE, map_location="cpu", weights_only=True), heads.num_layers))
    else:
        raise SpecDemoError(f"no Medusa heads in {folder}: expected {HEADS_FILE} or {PUBLISHED_FILE}")
    heads.choices = heads.choices or choices
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
