"""Model presets: a target and the companions each method needs for it (a draft, Medusa heads,
a CLLM), so a person picks one name and every method works.

On a CPU the app offers the embedded SmolLM2-135M-Instruct with the companions we trained for it
(assets/). With CUDA it also offers GPU presets built from public checkpoints: a 7B chat model
with its published Medusa heads, a draft of its family and a published CLLM. A companion left
out (None) means there is none for that target; the method then says so.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from specdemo.assets import EMBEDDED_ANSWERS, EMBEDDED_CLLM, EMBEDDED_EAGLE, EMBEDDED_HEADS
from specdemo.core.errors import SpecDemoError
from specdemo.models import EMBEDDED


@dataclass(frozen=True)
class Preset:
    """A target model spec (see `specdemo.models`) and its companions, as specs or folders."""

    name: str  # what the picker shows
    target: str
    draft: str | None = None  # a causal LM sharing the target's tokenizer (speculative, contrastive)
    feature_draft: str | Path | None = None  # a folder of our EAGLE feature draft: speculative prefers it to `draft`
    medusa_heads: str | Path | None = None  # a folder or Hub id of heads: ours or the published Medusa format
    # the default tree for heads that bring none (published heads)
    medusa_tree: tuple[tuple[int, ...], ...] | None = None
    cllm: str | Path | None = None  # a folder of our adapters, or a whole consistency-trained model
    # a folder of the target's earlier answers (`retrieval`): the guesses of speculative decoding,
    # Medusa, lookahead and CLLM
    datastore: str | Path | None = None
    # where the target's weights go (`placement`): None, one device; "auto" spills a target larger than the GPU
    # onto the CPU, or spreads it over several GPUs
    device_map: str | None = None
    about: str = ""


# The 63-node sparse tree the Medusa authors tuned for their Vicuna-7B heads (`mc_sim_7b_63` in
# their medusa_choices.py; Cai et al. 2024, Sec. 2.1.2), in the medusa_choices form.
MC_SIM_7B_63 = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5), (0, 0, 1),
    (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,), (1, 0, 0),
    (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1), (0, 0, 6), (0, 3, 0),
    (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0), (0, 1, 2), (2, 0, 0), (3, 1),
    (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
)

EMBEDDED_PRESET = Preset(
    name="SmolLM2-135M-Instruct (embedded, CPU)",
    target=EMBEDDED,
    draft=EMBEDDED,  # ours: two of its layers, distilled on its own answers (assets/smollm2-135m-draft)
    feature_draft=EMBEDDED_EAGLE,  # ours: one layer drafting from its features (assets/smollm2-135m-eagle)
    medusa_heads=EMBEDDED_HEADS,
    cllm=EMBEDDED_CLLM,
    datastore=EMBEDDED_ANSWERS,
    about=("Runs offline on a laptop CPU. Its companions learned from the model's own answers to real prompts, by the "
           "scripts in training/: most answers were written and the feature draft trained on a lent GPU, the rest "
           "trained on 2 CPU cores (assets/README.md)."),
)

GPU_PRESETS = (
    Preset(
        name="Vicuna-7B v1.3 + Medusa heads + Vicuna-68M draft",
        target="lmsys/vicuna-7b-v1.3",
        draft="double7/vicuna-68m",  # a 68M Llama distilled for Vicuna, the usual small draft in the literature
        # the Medusa-1 heads of Cai et al. 2024 for this exact model
        medusa_heads="FasterDecoding/medusa-vicuna-7b-v1.3",
        medusa_tree=MC_SIM_7B_63,
        cllm="cllm/consistency-llm-7b-sharegpt48k",  # a CLLM of a sibling Llama-7B chat model (same tokenizer)
        device_map="auto",
        about="The Medusa paper's own model and heads (about 14 GB of float16 weights, downloaded on first use).",
    ),
    Preset(
        name="ShareGPT Llama-7B + its CLLM (Kou et al. 2024)",
        target="cllm/vicuna-7b-sharegpt-gpt4-48k",
        draft="double7/vicuna-68m",
        cllm="cllm/consistency-llm-7b-sharegpt48k",  # consistency-trained from exactly this target
        device_map="auto",
        about="The CLLM paper's ShareGPT target and its consistency-trained copy (two 7B models, about 27 GB).",
    ),
    Preset(
        name="SmolLM2-1.7B-Instruct + SmolLM2-135M-Instruct draft",
        target="HuggingFaceTB/SmolLM2-1.7B-Instruct",
        draft="HuggingFaceTB/SmolLM2-135M-Instruct",  # same family, same tokenizer
        device_map="auto",
        about="A small GPU preset: a 1.7B target and its 135M sibling as the draft. No public Medusa heads or CLLM "
              "exist for it.",
    ),
)


def available_presets(cuda: bool | None = None) -> tuple[Preset, ...]:
    """The presets this machine can run: with CUDA the GPU presets and the embedded one; on a CPU
    only the embedded one (a 7B model is no demo at a few seconds a token)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    return (*GPU_PRESETS, EMBEDDED_PRESET) if cuda else (EMBEDDED_PRESET,)


def preset_for(target_spec: str, presets: tuple[Preset, ...] | None = None) -> Preset | None:
    """The preset whose target is `target_spec`, among `presets` (default: all of them); None for
    a model without known companions."""
    presets = (*GPU_PRESETS, EMBEDDED_PRESET) if presets is None else presets
    return next((preset for preset in presets if preset.target == target_spec), None)


def preset_named(name: str, presets: tuple[Preset, ...]) -> Preset:
    """The preset called `name`; a SpecDemoError lists the others."""
    for preset in presets:
        if preset.name == name:
            return preset
    raise SpecDemoError(f"unknown model preset {name!r}: choose one of {', '.join(p.name for p in presets)}")
