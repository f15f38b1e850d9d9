"""Draft models for speculative decoding: loading, the vocabulary check, and the draft's logits.

A draft is any causal LM with the target's vocabulary. Ours for the embedded SmolLM2
(assets/smollm2-135m-draft/) is two transformer layers of the target's shape that share the
target's embedding and LM head, and it may propose only its `vocab` subset: the K tokens the
target uses most. Scoring K rows of the LM head instead of all 49,152 is what keeps a draft
step near a tenth of a target pass on a CPU (the head is most of a 2-layer model's cost; the
idea of a frequency-ranked draft vocabulary is FR-Spec's, Zhao et al. 2025). Restricting
what the draft *proposes* never changes what the target *accepts*, so outputs stay exact.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from specdemo.assets import EMBEDDED_DRAFT
from specdemo.core.errors import SpecDemoError
from specdemo.core.grouped_attention import use_grouped_attention
from specdemo.core.prepack import Packed, linear, prepack
from specdemo.core.static import decoder_pass
from specdemo.models import EMBEDDED, LoadedModel


class ProposesFromVocab:
    """What a draft whose head ranks `vocab` (target token ids, ascending; None: the target's own
    first ids) reads of it: the target's ids of its positions, and its logits on the target's vocabulary."""

    vocab: torch.Tensor | None

    def token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Token ids of positions in the draft's vocabulary."""
        return indices if self.vocab is None else self.vocab[indices]

    def spread(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        return spread(logits, self.vocab, vocab_size)


@dataclass
class Draft(ProposesFromVocab):
    """A draft model and the token ids it may propose (None: the whole vocabulary)."""

    name: str
    model: PreTrainedModel
    vocab: torch.Tensor | None = None  # [K] token ids, ascending
    head: torch.Tensor | None = field(init=False, default=None)  # [K, H]: the LM head's rows the draft may propose
    head_packed: Packed = field(init=False, default_factory=Packed)  # their layout for a CPU's products (`prepack`)

    def __post_init__(self):
        if self.vocab is not None:
            head = self.model.get_output_embeddings().weight  # [V, H]
            self.vocab = self.vocab.to(head.device)
            self.head = head[self.vocab]

    def logits(self, input_ids: torch.Tensor, cache, logits_to_keep: int = 1, **tree) -> torch.Tensor:
        """Logits [1, logits_to_keep, K] over the draft's vocabulary for the last positions.
        `tree`: `sees` and `position_ids` when the tokens are branches of a draft tree
        (`static.decoder_pass`, which takes the compiled static path on a `StaticKV`).
        Without a cache: a whole text at once."""
        if cache is None:
            hidden = self.model.get_decoder()(input_ids, use_cache=False).last_hidden_state
        else:
            hidden = decoder_pass(self.model, cache, input_ids, **tree)
        hidden = hidden[:, -logits_to_keep:]
        if self.vocab is None:
            return self.model.get_output_embeddings()(hidden)
        return linear(hidden, self.head, packed=self.head_packed)


def spread(logits: torch.Tensor, vocab: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Draft logits [1, K] over `vocab` laid on the target's vocabulary [1, vocab_size]: -inf where
    the draft cannot propose (outside its vocabulary, or past its own vocabulary size)."""
    full = logits.new_full((logits.shape[0], vocab_size), float("-inf"))
    if vocab is None:
        width = min(vocab_size, logits.shape[-1])
        full[:, :width] = logits[:, :width]
    else:
        full[:, vocab] = logits
    return full


def build_shared_draft(target: PreTrainedModel, layer_ids: tuple[int, ...]) -> LlamaForCausalLM:
    """A Llama of the target's shape with the target's layers `layer_ids`, sharing its embedding
    and LM head (tied weights, not copies)."""
    config = LlamaConfig.from_dict({**target.config.to_dict(), "num_hidden_layers": len(layer_ids)})
    draft = LlamaForCausalLM(config).to(target.dtype)
    draft.model.embed_tokens = target.get_input_embeddings()
    draft.lm_head = target.get_output_embeddings()
    for draft_layer, target_layer in zip(draft.model.layers, layer_ids):
        draft_layer.load_state_dict(target.model.layers[target_layer].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    return draft


def save_shared_draft(draft: LlamaForCausalLM, vocab: torch.Tensor, folder: Path) -> None:
    """Write the draft's own weights (layers and norm; not the shared embedding) and its vocab."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    own = {name: tensor.float().contiguous() for name, tensor in draft.state_dict().items() if _is_own(name)}
    save_file(own, folder / "draft.safetensors")
    (folder / "draft_config.json").write_text(json.dumps({"num_hidden_layers": draft.config.num_hidden_layers}) + "\n")
    (folder / "draft_vocab.json").write_text(json.dumps(vocab.tolist()) + "\n")


def _is_own(name: str) -> bool:
    return name.startswith("model.layers.") or name == "model.norm.weight"


def load_shared_draft(folder: Path, target: LoadedModel) -> Draft:
    """Our trained draft: its layers from `folder`, its embedding and head from the target."""
    if target.model.config.model_type != "llama" or target.model.config.vocab_size != 49152:
        raise SpecDemoError(f"the draft in {folder} was trained for the embedded SmolLM2; choose a draft for "
                            f"{target.spec}")
    num_layers = json.loads((folder / "draft_config.json").read_text())["num_hidden_layers"]
    draft = build_shared_draft(target.model, tuple(range(num_layers)))
    missing, unexpected = draft.load_state_dict(load_file(folder / "draft.safetensors"), strict=False)
    if unexpected or any(_is_own(name) for name in missing):
        raise SpecDemoError(f"{folder}/draft.safetensors does not hold a draft of {num_layers} layers")
    vocab = torch.tensor(json.loads((folder / "draft_vocab.json").read_text()))
    draft.to(device=target.device, dtype=target.dtype).eval()
    prepack(draft)
    use_grouped_attention(draft)
    return Draft(str(folder), draft, vocab)


def load_draft(spec: str, target: LoadedModel, trust_remote_code: bool = False) -> Draft:
    """The draft for `target`: "embedded" (ours, for the embedded SmolLM2), a folder of ours,
    or any causal LM (folder or Hub id) whose tokenizer equals the target's."""
    folder = EMBEDDED_DRAFT if spec == EMBEDDED else Path(spec)
    if (folder / "draft.safetensors").is_file():
        return load_shared_draft(folder, target)
    if spec == EMBEDDED:
        raise SpecDemoError(f"the embedded draft is missing from {folder}: run `python -m training.train_draft`")
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=target.dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise SpecDemoError(f"could not load draft {spec!r}: not a local folder, and the Hub could not "
                            "serve it") from error
    check_same_vocabulary(tokenizer, target)
    model.to(target.device).eval()
    prepack(model)
    use_grouped_attention(model)
    return Draft(spec, model)


def check_same_vocabulary(draft_tokenizer, target: LoadedModel) -> None:
    """Refuse a draft whose tokens mean other strings than the target's: its proposals would be noise."""
    draft_vocab, target_vocab = draft_tokenizer.get_vocab(), target.tokenizer.get_vocab()
    if draft_vocab != target_vocab:
        differing = len(set(draft_vocab.items()) ^ set(target_vocab.items()))
        raise SpecDemoError(
            f"the draft's tokenizer differs from the target's ({len(draft_vocab)} vs {len(target_vocab)} tokens, "
            f"{differing} entries differ): speculative decoding needs a draft with the target's vocabulary"
        )
