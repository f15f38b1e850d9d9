"""Model presets: GPU presets only with CUDA, and each method loads the companions its preset names."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdemo import presets
from specdemo.app import live
from specdemo.core.errors import SpecDemoError
from specdemo.core.events import final_summary
from specdemo.methods import medusa, method_options
from specdemo.models import LoadedModel, load_model
from specdemo.presets import EMBEDDED_PRESET, GPU_PRESETS, Preset, available_presets, preset_for


def test_gpu_presets_are_offered_only_with_cuda():
    assert available_presets(cuda=False) == (EMBEDDED_PRESET,)
    offered = available_presets(cuda=True)
    assert EMBEDDED_PRESET in offered and set(GPU_PRESETS) <= set(offered)


def test_the_gpu_presets_cover_every_companion_with_public_checkpoints():
    assert all(preset.draft for preset in GPU_PRESETS)
    assert any(preset.medusa_heads for preset in GPU_PRESETS)
    assert any(preset.cllm for preset in GPU_PRESETS)
    assert all("/" in preset.target and not preset.target.startswith("/") for preset in GPU_PRESETS)  # Hub ids


def stand_in(spec: str, model) -> LoadedModel:
    """A target that claims to be `spec` (its weights are a tiny model: only the routing is tested)."""
    return LoadedModel(spec, spec, model, None, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize(
    ("method", "companion"),
    [("speculative", "double7/vicuna-68m"), ("medusa", "FasterDecoding/medusa-vicuna-7b-v1.3"),
     ("cllm", "cllm/consistency-llm-7b-sharegpt48k")],
)
def test_a_gpu_preset_target_loads_the_companions_its_preset_names(tiny_model, method, companion):
    """Offline the Hub cannot serve them: the error names exactly the checkpoint the preset chose."""
    with pytest.raises(SpecDemoError, match=companion):
        method_options(method, stand_in("lmsys/vicuna-7b-v1.3", tiny_model))


@pytest.mark.parametrize("method", ["speculative", "medusa", "cllm"])
def test_a_target_without_a_preset_says_what_to_pass(tiny_model, method):
    with pytest.raises(SpecDemoError, match="no preset names"):
        method_options(method, stand_in("someone/some-model", tiny_model))


def test_medusa_heads_from_a_hub_id_fail_clearly_offline(tiny_model):
    with pytest.raises(SpecDemoError, match="Hugging Face Hub could not serve it"):
        medusa.load_heads("FasterDecoding/medusa-vicuna-7b-v1.3", tiny_model)


def save_tiny_llama(folder, tokenizer, layers: int, seed: int) -> str:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_preset_with_local_companions_runs_speculative_exactly(tmp_path, monkeypatch, embedded):
    """What a GPU preset does, on the CPU with local folders: the target and its draft are loaded
    by name, and speculative decoding with that draft equals AR on that target."""
    target_folder = save_tiny_llama(tmp_path / "target", embedded.tokenizer, layers=2, seed=0)
    draft_folder = save_tiny_llama(tmp_path / "draft", embedded.tokenizer, layers=1, seed=1)
    preset = Preset("tiny pair", target_folder, draft=draft_folder)
    monkeypatch.setattr(presets, "GPU_PRESETS", (preset,))
    assert preset_for(target_folder) == preset
    target = load_model(target_folder, "float32", "cpu")
    assert method_options("speculative", target)["draft"].name == draft_folder
    answers = {
        method: final_summary(live.run(target, live.Request("Count to five.", method, 24))).tokens
        for method in ("ar", "speculative")
    }
    assert answers["speculative"] == answers["ar"]


def test_published_heads_get_their_presets_tree(tiny_model, tmp_path, monkeypatch, prompt_ids):
    """Published Medusa heads come without a tree; a preset that names one (the Vicuna preset:
    the authors' mc_sim_7b_63) makes it their static tree and the size of their dynamic one, and
    decoding with either still equals AR."""
    from specdemo.methods import ar
    from specdemo.methods import medusa as medusa_module
    from specdemo.presets import MC_SIM_7B_63

    heads = medusa_module.MedusaHeads(tiny_model.config.hidden_size, tiny_model.config.vocab_size, 3, 1)
    published = torch.nn.ModuleList(
        torch.nn.Sequential(*block, torch.nn.Linear(tiny_model.config.hidden_size, tiny_model.config.vocab_size,
                                                    bias=False)) for block in heads.blocks
    )
    torch.save(published.state_dict(), tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text('{"medusa_num_heads": 3, "medusa_num_layers": 1}')
    tree = ((0,), (1,), (0, 0), (0, 0, 0))
    monkeypatch.setattr(presets, "GPU_PRESETS",
                        (Preset("tiny with heads", "tiny/target", medusa_heads=str(tmp_path), medusa_tree=tree),))
    loaded = method_options("medusa", stand_in("tiny/target", tiny_model))["heads"]
    assert loaded.choices == [[0], [1], [0, 0], [0, 0, 0]]
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=24, eos_token_ids=())).tokens
    for kind in ("static", "dynamic"):
        events = list(medusa_module.generate(tiny_model, prompt_ids, heads=loaded, tree=kind, max_new_tokens=24,
                                             copy_length=0, eos_token_ids=()))
        assert final_summary(events).tokens == expected
        assert len(events[1].proposed) == len(tree)  # the preset's tree, or a dynamic tree of its size
        if kind == "static":
            assert events[1].data.tree.depths == (1, 1, 2, 3)  # the preset's tree itself
    assert len(MC_SIM_7B_63) == 63 and max(map(len, MC_SIM_7B_63)) == 4 and max(max(path) for path in MC_SIM_7B_63) == 9
