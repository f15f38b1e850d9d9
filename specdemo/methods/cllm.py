"""CLLM: a consistency-trained copy of the target, decoded in parallel.

Kou et al. 2024, "CLLMs: Consistency Large Language Models". The model is fine-tuned so that
from any state on a Jacobi trajectory it predicts the trajectory's fixed point (the global
consistency loss, their Eq. 4), next to the AR loss that keeps its answers close to the
target's (Eq. 5). The speed comes from the weights, which get more of a block's later tokens
right in one pass than the base model does; the decoding code is the repository's own, unchanged:

- `decoder="jacobi"`: `specdemo.methods.jacobi`, the paper's decoding (blocks of `block_size`);
  the app draws its trajectory.
- `decoder="lookahead"` (the default): `specdemo.methods.lookahead` on the CLLM weights, the
  Jacobi iteration kept in a small window and its n-grams (and copies from the text) verified in
  the same pass. On our CLLM it commits more tokens a pass than Jacobi does (docs/methods/cllm.md).

Either way the greedy answer is AR's greedy answer *on the CLLM weights*, which may differ from
the base model's.

Weights: ours are low-rank adapters (Hu et al. 2021, LoRA) for the embedded target, merged
into a copy of it at load (`assets/smollm2-135m-cllm/`, made by `training/train_cllm.py`); a
published CLLM (e.g. `cllm/consistency-llm-7b-sharegpt48k` on the Hub) is a whole model and
loads as any model spec does.
"""

import copy
import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from specdemo import placement
from specdemo.core.errors import SpecDemoError
from specdemo.core.events import StepEvent, Summary
from specdemo.core.sampling import GREEDY, SamplingConfig
from specdemo.core.static import CompiledPass
from specdemo.methods import jacobi, lookahead
from specdemo.methods.retrieval import Datastore
from specdemo.models import LoadedModel, load_model, read_model

ADAPTER_FILE = "adapter.safetensors"
CONFIG_FILE = "adapter_config.json"
DECODERS = ("lookahead", "jacobi")
# lookahead's window on the CLLM weights: 1 column, not lookahead's 2. Its window's n-grams are rarely what a
# pass accepts, and feeding fewer tokens makes each pass cheaper (`git show 4f4c763:docs/methods/cllm.md`)
WINDOW = 1
QUALITY_FILE = "quality.json"  # training/cllm_quality.py: is the CLLM still a good model? (distinct bigrams, base NLL)


def quality(spec: str | Path) -> dict | None:
    """The quality check stored beside a CLLM folder of ours (`training.cllm_quality`), or None."""
    path = Path(spec) / QUALITY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    cllm_model: PreTrainedModel,
    cllm_passes: CompiledPass | None = None,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    decoder: str = DECODERS[0],
    block_size: int = 16,
    window: int = WINDOW,
    ngram: int = lookahead.NGRAM,
    candidates: int = lookahead.CANDIDATES,
    copy_length: int = lookahead.COPY_LENGTH,
    retrieve: bool = True,
    retrieved_branches: int = 1,
    datastore: Datastore | None = None,
    eos_token_ids: Iterable[int] | None = None,
    stop: threading.Event | None = None,
    passes: CompiledPass | None = None,
) -> Iterator[StepEvent | Summary]:
    """Decode after `input_ids` with `cllm_model` by `decoder`: "jacobi" over blocks of
    `block_size`, or "lookahead" with its `window`, `ngram`, `candidates`, `copy_length`,
    `retrieve` and `retrieved_branches` from `datastore` (`specdemo.methods.lookahead`). `model`,
    the target, only has to share its vocabulary (the prompt was tokenized for it). The CLLM's
    passes run by `cllm_passes`, its own compiled pass, beside a compiled target's `passes` (None:
    eager)."""
    if cllm_model.config.vocab_size != model.config.vocab_size:
        raise SpecDemoError("the CLLM's vocabulary differs from the target's: it was trained for another model")
    common = dict(max_new_tokens=max_new_tokens, sampling=sampling, eos_token_ids=eos_token_ids, stop=stop,
                  method_name="cllm", passes=cllm_passes if passes else None)
    if decoder == "jacobi":
        return jacobi.generate(cllm_model, input_ids, block_size=block_size, **common)
    if decoder == "lookahead":
        return lookahead.generate(cllm_model, input_ids, window=window, ngram=ngram, candidates=candidates,
                                  copy_length=copy_length, retrieve=retrieve, retrieved_branches=retrieved_branches,
                                  datastore=datastore, **common)
    raise SpecDemoError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")


def load_cllm(spec: str | Path, target: LoadedModel) -> PreTrainedModel:
    """The CLLM for `target` (the target's companions hold it once loaded: `methods.method_options`):
    a folder of our adapters (merged into a copy of the target, which stays as it was), or any model
    spec `specdemo.models` loads (a published CLLM, on the target's dtype and device). A target
    spread or offloaded (`LoadedModel.placed`) gets a CLLM placed the same way, merged from a fresh
    copy of its weights."""
    folder = Path(spec)
    if not (folder / ADAPTER_FILE).exists():
        return load_model(str(spec), target.dtype, str(target.device), device_map=target.placed).model
    cllm = copy.deepcopy(target.model) if target.placed is None else read_model(target.spec, target.dtype, False)[1]
    merge_adapters(cllm, load_file(folder / ADAPTER_FILE), json.loads((folder / CONFIG_FILE).read_text())["scale"])
    return cllm.eval() if target.placed is None else placement.dispatch(cllm.eval(), target.placed)


@torch.no_grad()
def merge_adapters(model: PreTrainedModel, tensors: dict[str, torch.Tensor], scale: float) -> None:
    """W <- W + scale * B @ A for every `{module}.lora_A` / `{module}.lora_B` pair (LoRA, Hu et
    al. 2021, Eq. 3), summed in float32 and stored in the model's dtype."""
    modules = {key.rsplit(".", 1)[0] for key in tensors}
    for name in sorted(modules):
        try:
            weight = model.get_submodule(name).weight
        except AttributeError as error:
            raise SpecDemoError(f"the CLLM adapters name {name!r}, which this model has not: they were trained for "
                                "another model") from error
        delta = scale * tensors[f"{name}.lora_B"].float() @ tensors[f"{name}.lora_A"].float()
        if delta.shape != weight.shape:
            raise SpecDemoError(f"the CLLM adapter for {name} is {tuple(delta.shape)}, the model's weight "
                                f"{tuple(weight.shape)}")
        weight.copy_((weight.float() + delta.to(weight.device)).to(weight.dtype))
