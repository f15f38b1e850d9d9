"""A feature-level draft (EAGLE, Li et al. 2024): one transformer layer that predicts the target's
next feature from its current one.

EAGLE ("Speculative Sampling Requires Rethinking Feature Uncertainty", Li, Wei, Zhang & Zhang
2024) drafts at the level of the target's features, the last hidden state f that its LM head
reads. Pair t of the draft's input is (f_t, x_{t+1}): the target's feature at position t and the
token that followed it (which resolves the uncertainty of the next feature, their Sec. 3). The
draft maps fc([embed(x_{t+1}); f_t]) through one decoder layer to f̂_{t+1}, and the target's own
LM head turns f̂_{t+1} into the next token. It drafts further on its own predictions:
(f̂_{t+1}, x̂_{t+2}) and so on.

EAGLE-3 (Li, Wei, Zhang & Zhang 2025) feeds the first pair more of the target than f_t: the
residual stream after a low and a middle layer too, joined and mapped back to H by one linear
layer (`reduce`). With `layers` ours does the same: the first pair of each drafting step reads the
target's f_t with the residual stream after those layers (each RMS-normalised, since the residual
stream's scale is far from a feature's), and later pairs read the draft's own f̂ as before. `reduce`
starts as [0 ... 0 I], so a draft without layers fine-tunes into one with them from where it was.

Ours shares the target's embedding and LM head (never changed, not stored) and, like our token
draft, proposes from the K tokens the target uses most (`draft.Draft`, FR-Spec's idea).
Pair t sits at position t; the draft's KV cache holds the pairs it has seen, and speculative
decoding keeps only the pairs whose feature the target computed (`kvcache.keep_prefix`).
"""

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Cache, LlamaConfig, LlamaModel, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from specdemo.core.errors import SpecDemoError
from specdemo.core.grouped_attention import use_grouped_attention
from specdemo.core.prepack import Packed, linear, prepack
from specdemo.core.static import decoder_pass
from specdemo.methods.draft import ProposesFromVocab

WEIGHTS_FILE, CONFIG_FILE, VOCAB_FILE = "eagle.safetensors", "eagle_config.json", "draft_vocab.json"


class FeatureDraft(nn.Module, ProposesFromVocab):
    """fc([embedding; feature]) -> one Llama decoder layer -> the next feature. With `layers`, a
    target's feature arrives as [residual stream after each layer; f_t] and `reduce` maps it to H."""

    def __init__(self, target: PreTrainedModel, vocab: torch.Tensor | None = None, layers: tuple[int, ...] = (),
                 tree_choices: Sequence[Sequence[int]] = ()):
        super().__init__()
        # the rank paths it gets right most often, best first (`training.eagle_tree`): its static tree's
        self.tree_choices = tuple(tuple(path) for path in tree_choices)
        hidden = target.config.hidden_size
        config = LlamaConfig.from_dict({**target.config.to_dict(), "num_hidden_layers": 1})
        self.layers = tuple(layers)  # the target's layers whose output the first pair reads too (`static.with_layers`)
        if self.layers:
            self.norms = nn.ModuleList(LlamaRMSNorm(hidden, eps=target.config.rms_norm_eps) for _ in self.layers)
            self.reduce = nn.Linear((len(self.layers) + 1) * hidden, hidden, bias=False)
            with torch.no_grad():  # [0 ... 0 I]: it starts as the draft without layers
                self.reduce.weight.zero_()
                self.reduce.weight[:, -hidden:].copy_(torch.eye(hidden))
        self.fc = nn.Linear(2 * hidden, hidden)
        self.model = LlamaModel(config)
        self.model.norm = nn.Identity()  # the target's features are already normalised; the LM head reads f̂ as is
        del self.model.embed_tokens  # shared with the target, kept outside this module's weights
        # a dict: not submodules, so never saved
        self.shared = {"embed": target.get_input_embeddings(), "head": target.get_output_embeddings()}
        # buffers, never saved, so that .to() moves them with the draft: [K] token ids it may propose, ascending
        # (None: all), and their rows of the LM head, gathered once (each step they would cost more than their product)
        self.register_buffer("vocab", vocab, persistent=False)
        self.to(device=target.device, dtype=target.dtype)
        self.register_buffer("head", None if vocab is None else target.get_output_embeddings().weight[self.vocab],
                             persistent=False)  # [K, H]
        self.head_packed = Packed()  # their layout for a CPU's products (`prepack`)

    def features(self, features: torch.Tensor, next_tokens: torch.Tensor, cache: Cache | None, **tree) -> torch.Tensor:
        """Predicted features [1, n, H] at positions t+1 from pairs (f_t [1, n, H], x_{t+1} [1, n]).
        `tree`: `sees` and `position_ids` when the pairs are branches of a draft tree
        (`static.decoder_pass`, which takes the compiled static path on a `StaticKV`)."""
        fused = self.fuse(features, next_tokens)
        if cache is None:  # training: whole sequences at once
            return self.model(inputs_embeds=fused, use_cache=False).last_hidden_state
        return decoder_pass(self.model, cache, fused, **tree)

    def fuse(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """The decoder layer's input [..., H] for pairs (feature, x_{t+1}): fc([embed(x_{t+1}); f]),
        f the draft's own [..., H] or, joined with the layers' residual stream, the target's."""
        embedded = self.shared["embed"](next_tokens)  # [..., H]
        features = features.to(embedded.dtype)
        hidden = embedded.shape[-1]
        if features.shape[-1] > hidden:  # the target's, with its layers' residual stream first
            parts = features.split(hidden, dim=-1)
            features = self.reduce(torch.cat([*(norm(part) for norm, part in zip(self.norms, parts)), parts[-1]],
                                             dim=-1))
        return self.fc(torch.cat([embedded, features], dim=-1))

    @property
    def feature_request(self) -> bool | tuple[int, ...]:
        """What the target's pass returns for it (`loop.Proposer.features`)."""
        return self.layers or True

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits [..., K] of the draft's vocabulary from (predicted) features [..., H]."""
        if self.head is None:
            return self.shared["head"](features)
        return linear(features, self.head, packed=self.head_packed)


def init_from_target(draft: FeatureDraft, target: PreTrainedModel) -> None:
    """Start from the target's last layer, with fc passing the feature through: before training,
    the draft already maps a feature into the target's feature space."""
    draft.model.layers[0].load_state_dict(target.model.layers[-1].state_dict())
    hidden = target.config.hidden_size
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, hidden:].copy_(torch.eye(hidden))
        draft.fc.bias.zero_()


def save_feature_draft(draft: FeatureDraft, folder: Path, metadata: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.to(torch.float16).contiguous() for name, tensor in draft.state_dict().items()},
              folder / WEIGHTS_FILE)
    shape = {"tree_choices": [list(path) for path in draft.tree_choices]} if draft.tree_choices else {}
    (folder / CONFIG_FILE).write_text(json.dumps({"kind": "eagle", "layers": list(draft.layers), **shape,
                                                  **(metadata or {})}, indent=2) + "\n")
    if draft.vocab is not None:
        (folder / VOCAB_FILE).write_text(json.dumps(draft.vocab.tolist()) + "\n")


def load_feature_draft(folder: Path, target: PreTrainedModel) -> FeatureDraft:
    """Our feature draft from `folder`, on the target's device and dtype, sharing its embedding and head."""
    vocab_path = folder / VOCAB_FILE
    vocab = torch.tensor(json.loads(vocab_path.read_text()), device=target.device) if vocab_path.exists() else None
    config = json.loads((folder / CONFIG_FILE).read_text())
    draft = FeatureDraft(target, vocab, tuple(config.get("layers", ())), config.get("tree_choices", ()))
    try:
        draft.load_state_dict({name: tensor.to(target.dtype)
                               for name, tensor in load_file(folder / WEIGHTS_FILE).items()})
    except RuntimeError as error:
        raise SpecDemoError(f"the feature draft in {folder} was trained for another model: {error}") from error
    prepack(draft)
    use_grouped_attention(draft)
    return draft.eval()
