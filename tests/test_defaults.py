"""The devices' sets of defaults (`specdemo.defaults`): data the methods accept, taken by a
run on the device, and given way to by a setting given explicitly."""

import pytest
import torch
from test_conformance import configurations

from specdemo.bench_table import defaults_line, defaults_report
from specdemo.core.events import final_summary
from specdemo.defaults import BY_GPU_NAME, CPU, GPU, Defaults, default_of, defaults_for, with_defaults
from specdemo.methods import METHODS, ar

from conftest import make_tiny_model

SETS = [CPU, GPU, *BY_GPU_NAME.values()]


def test_a_cpu_takes_the_methods_own_defaults():
    assert defaults_for(torch.device("cpu")) is CPU and not CPU.settings


@pytest.mark.parametrize("defaults", SETS, ids=[defaults.name for defaults in SETS])
def test_every_set_names_settings_its_methods_take(defaults):
    assert defaults.chosen
    for method, settings in defaults.settings.items():
        assert set(settings) <= set(METHODS[method].settings), method


def test_a_setting_given_wins_and_none_given_takes_the_sets():
    defaults = Defaults("test", "here", {"speculative": {"gamma": 5, "draft_tree_size": 24}})
    assert with_defaults(defaults, "speculative", {"gamma": 3, "draft_tree_size": None}) == {"gamma": 3,
                                                                                          "draft_tree_size": 24}
    assert with_defaults(defaults, "medusa", {"tree_size": None}) == {}  # the method's own
    assert with_defaults(CPU, "speculative", {"gamma": 3}) == {"gamma": 3}


@pytest.mark.parametrize("defaults", [GPU, *BY_GPU_NAME.values()], ids=lambda defaults: defaults.name)
def test_a_gpu_sets_settings_keep_ars_answer(defaults, prompt_ids):
    """Each method the set changes, run with its values on tiny models (float32, eager): AR's answer
    (a CLLM's: AR's on its own weights)."""
    target, other = make_tiny_model(), make_tiny_model(seed=1)
    configs = configurations(target, other)
    for name, (generate, options, reference) in configs.items():
        method = name.split(",")[0]
        if not defaults.of(method):
            continue
        expected = final_summary(ar.generate(reference, prompt_ids, max_new_tokens=24, eos_token_ids=())).tokens
        given = {**options, **with_defaults(defaults, method, {})}
        answer = final_summary(generate(target, prompt_ids, max_new_tokens=24, eos_token_ids=(), **given)).tokens
        assert answer == expected, name


@pytest.mark.parametrize("defaults", SETS, ids=[defaults.name for defaults in SETS])
def test_the_page_starts_at_the_sets_values_and_names_it(defaults):
    """The method settings' controls start at what the methods run with on the device; a control
    lookahead and the CLLM share starts where both run."""
    import gradio as gr

    from specdemo.app.ui_settings import method_settings

    for shared in ("ngram", "candidates"):
        assert default_of(defaults, "lookahead", shared) == default_of(defaults, "cllm", shared)
    with gr.Blocks() as page:
        controls = method_settings(defaults)
    assert controls["gamma"].value == default_of(defaults, "speculative", "gamma")
    assert controls["candidates"].value == default_of(defaults, "lookahead", "candidates")
    assert controls["block_size"].value == default_of(defaults, "jacobi", "block_size")
    assert f"{default_of(defaults, 'cllm', 'window')} for cllm" in controls["window"].label
    named = [block.value for block in page.blocks.values() if getattr(block, "elem_id", None) == "defaults-set"]
    assert named == [f"The defaults of this device: the {defaults.name} set ({defaults.chosen})."]


def test_a_gpu_takes_the_gpu_set_and_the_bench_names_it_for_twins_too():
    cuda = torch.device("cuda")
    assert defaults_for(cuda) in (GPU, *BY_GPU_NAME.values())  # without CUDA (or a kind of its own): GPU
    report = defaults_report(cuda, ["ar", "medusa", "medusa_eager"])
    assert report["name"] == GPU.name and report["settings"]["medusa_eager"] == report["settings"]["medusa"]
    assert defaults_line(report).startswith("defaults: the GPU set (medusa {")
