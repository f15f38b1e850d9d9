"""A target spread over devices or offloaded to disk (`specdemo.placement`, through accelerate):
every method runs on it, and every greedy method still commits AR's tokens (float32)."""

import copy
import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_conformance import MAX_NEW_TOKENS, NAMES, configurations

from specdemo import placement
from specdemo.core.errors import SpecDemoError
from specdemo.core.events import final_summary
from specdemo.core.sampling import SamplingConfig
from specdemo.methods import ar, speculative
from specdemo.methods.draft import Draft
from specdemo.models import compiled, load_model

from conftest import make_tiny_model

PROMPT = torch.tensor([[5, 17, 42, 8, 63, 21]])
CPU_AND_DISK = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu",
                "model.rotary_emb": "cpu", "lm_head": "cpu"}


@pytest.fixture(scope="module")
def dispatched(tmp_path_factory):
    """The tiny target with its first layer in memory and its second on disk (accelerate's hooks
    bring it in at every pass), and an undispatched copy of the same weights."""
    reference, other = make_tiny_model(), make_tiny_model(seed=1)
    target = placement.dispatch(copy.deepcopy(reference), CPU_AND_DISK, tmp_path_factory.mktemp("offload"))
    assert {p.device.type for p in target.model.layers[1].parameters()} == {"meta"}  # its weights are on disk
    return target, reference, other


def answer(generate, model, **options):
    return final_summary(generate(model, PROMPT, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), **options)).tokens


@pytest.mark.parametrize("name", NAMES)
def test_every_method_runs_on_a_target_offloaded_to_disk_and_greedy_ones_keep_ars_answer(dispatched, name):
    target, reference, other = dispatched
    # the drafts and heads are built from the weights in memory (a feature draft starts as a copy of a layer)
    generate, options, must_equal = configurations(reference, other)[name]
    if must_equal is None:  # beam, contrastive: the same answer as on the target kept in memory
        expected = answer(generate, reference, **options)
    else:  # AR's answer on the weights the method decodes (a CLLM's own)
        expected = answer(ar.generate, must_equal)
    got = answer(generate, must_equal if name.startswith("cllm") else target, **options)
    assert got == expected


def test_sampling_runs_on_a_target_offloaded_to_disk(dispatched):
    target, _, other = dispatched
    sampling = SamplingConfig(do_sample=True, temperature=0.8, top_k=20, seed=3)
    for generate, options in ((ar.generate, {}), (speculative.generate, dict(draft=Draft("other", other), gamma=3))):
        tokens = answer(generate, target, sampling=sampling, **options)
        assert len(tokens) == MAX_NEW_TOKENS and all(0 <= t < target.config.vocab_size for t in tokens)


def test_disk_keeps_the_embeddings_norm_and_head_where_the_model_runs():
    model = make_tiny_model()
    assert placement.disk_map(model, torch.device("cpu")) == {
        "model.layers.0": "disk", "model.layers.1": "disk", "model.embed_tokens": "cpu", "model.norm": "cpu",
        "model.rotary_emb": "cpu", "lm_head": "cpu"}
    assert placement.execution_device({"model.embed_tokens": 0, "model.layers.0": "disk"}) == torch.device("cuda:0")
    assert placement.execution_device(CPU_AND_DISK) == torch.device("cpu")
    with pytest.raises(SpecDemoError, match="device_map must be one of"):
        placement.device_map_for(model, "everywhere", torch.device("cpu"))


def test_max_memory_reads_the_command_lines_pairs():
    assert placement.parse_max_memory("0=6GiB, cpu=30GiB") == {0: "6GiB", "cpu": "30GiB"}
    assert placement.parse_max_memory("cuda:1=2GiB") == {1: "2GiB"} and placement.parse_max_memory(None) is None
    with pytest.raises(SpecDemoError, match="DEVICE=SIZE"):
        placement.parse_max_memory("6GiB")


@pytest.mark.slow
def test_the_embedded_model_with_its_layers_on_disk_gives_ars_answer(embedded, tmp_path):
    """float32: every decoder layer read from `tmp_path` at every pass, the same tokens; never compiled."""
    offloaded = load_model("embedded", "float32", "cpu", device_map="disk", offload_folder=tmp_path)
    assert set(offloaded.placed.values()) == {"disk", "cpu"} and placement.is_dispatched(offloaded.model)
    assert sum(1 for name in offloaded.placed if offloaded.placed[name] == "disk") == len(embedded.model.model.layers)
    assert compiled(offloaded) is offloaded  # its weights move in during a pass: no graph can hold them
    input_ids = embedded.encode_chat("Name a colour.")
    expected = final_summary(ar.generate(embedded.model, input_ids, max_new_tokens=12, eos_token_ids=())).tokens
    got = final_summary(ar.generate(offloaded.model, input_ids, max_new_tokens=12, eos_token_ids=())).tokens
    assert got == expected


def test_a_map_onto_one_device_is_an_ordinary_load():
    assert not placement.spread({"": "cpu"}) and not placement.spread({"model.embed_tokens": 0, "lm_head": 0})
    assert placement.spread({"model.layers.0": 0, "model.layers.1": "cpu"}) and placement.spread({"": "disk"})
    assert placement.device_map_for(make_tiny_model(), "auto", torch.device("cpu"), {"cpu": "1GiB"}) == {"": "cpu"}


def test_a_temporary_offload_folder_goes_with_its_model(monkeypatch):
    made = []
    mkdtemp = placement.tempfile.mkdtemp
    monkeypatch.setattr(placement.tempfile, "mkdtemp", lambda **named: made.append(mkdtemp(**named)) or made[-1])
    model = placement.dispatch(make_tiny_model(), CPU_AND_DISK)
    folder = Path(made[0])
    assert any(folder.iterdir())  # the second layer's weights were written there
    assert final_summary(ar.generate(model, PROMPT, max_new_tokens=2, eos_token_ids=())).tokens
    del model
    gc.collect()
    assert not folder.exists()


FOLDER_AT_EXIT = """
import sys

from specdemo import placement
from specdemo.core.events import final_summary
from specdemo.methods import ar
from test_offload import CPU_AND_DISK, PROMPT
from conftest import make_tiny_model

made = []
mkdtemp = placement.tempfile.mkdtemp
placement.tempfile.mkdtemp = lambda **named: made.append(mkdtemp(**named)) or made[-1]
model = placement.dispatch(make_tiny_model(), CPU_AND_DISK)  # as the page's model on disk: no folder given
assert final_summary(ar.generate(model, PROMPT, max_new_tokens=2, eos_token_ids=())).tokens
print(made[0])
sys.exit(0)  # the model still held: only the process's exit removes its folder
"""


def test_a_temporary_offload_folder_is_removed_at_the_processs_exit():
    ran = subprocess.run([sys.executable, "-c", FOLDER_AT_EXIT], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parent, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert ran.returncode == 0, ran.stderr
    folder = Path(ran.stdout.strip().splitlines()[-1])
    assert folder.name.startswith("specdemo-offload-") and not folder.exists()
