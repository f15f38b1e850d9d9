"""Bad input raises SpecDemoError with a sentence a person understands, before any tensor work."""

import pytest
import torch

from specdemo import SpecDemoError, get_method
from specdemo.bench import parse_methods
from specdemo.core.sampling import SamplingConfig
from specdemo.methods import ar
from specdemo.models import load_model, parse_dtype


def test_empty_prompt(embedded, tiny_model):
    for prompt in ["", "   \n"]:
        with pytest.raises(SpecDemoError, match="empty"):
            embedded.encode_chat(prompt)
    with pytest.raises(SpecDemoError, match="empty"):
        next(ar.generate(tiny_model, torch.zeros(1, 0, dtype=torch.long)))


def test_prompt_longer_than_context(embedded, tiny_model):
    with pytest.raises(SpecDemoError, match="context"):
        embedded.encode_chat("word " * 9000)
    too_long = torch.ones(1, 300, dtype=torch.long)  # the tiny model's context is 256
    with pytest.raises(SpecDemoError, match="context"):
        next(ar.generate(tiny_model, too_long, max_new_tokens=1))
    with pytest.raises(SpecDemoError, match="context"):  # fits alone, not with the answer
        next(ar.generate(tiny_model, torch.ones(1, 200, dtype=torch.long), max_new_tokens=100))


@pytest.mark.parametrize("max_new_tokens", [0, -3, 10**6, 2.5, "12", True])
def test_max_new_tokens_out_of_range(tiny_model, prompt_ids, max_new_tokens):
    with pytest.raises(SpecDemoError, match="max_new_tokens"):
        next(ar.generate(tiny_model, prompt_ids, max_new_tokens=max_new_tokens))


def test_batched_prompt_is_refused(tiny_model):
    with pytest.raises(SpecDemoError, match="one prompt"):
        next(ar.generate(tiny_model, torch.ones(2, 4, dtype=torch.long)))


def test_unknown_method():
    with pytest.raises(SpecDemoError, match="unknown method 'nope'.*ar"):
        get_method("nope")
    with pytest.raises(SpecDemoError, match="hf_generate"):
        parse_methods("ar,nope")


def test_unknown_model_spec(tmp_path):
    with pytest.raises(SpecDemoError, match="could not load model"):
        load_model("no-such-org/no-such-model-xyz", "float32", "cpu")
    with pytest.raises(SpecDemoError, match="could not load model"):
        load_model(str(tmp_path / "missing.gguf"), "float32", "cpu")
    with pytest.raises(SpecDemoError, match="dtype"):
        parse_dtype("float8")


@pytest.mark.parametrize(
    "settings, word",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(seed="abc"), "seed"),
    ],
)
def test_sampling_parameter_out_of_range(settings, word):
    with pytest.raises(SpecDemoError, match=word):
        SamplingConfig(do_sample=True, **settings)
