"""Model loading: the embedded GGUF loads offline, with its chat template, read once into a
transformers folder that loads the same model."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdemo import SpecDemoError, models
from specdemo.models import EMBEDDED_GGUF, LoadedModel, embedded_gguf_path


def test_embedded_gguf_is_found_without_importing_its_package():
    path = embedded_gguf_path()
    assert path is not None and path.name == EMBEDDED_GGUF and path.stat().st_size > 50_000_000


def test_embedded_model_loads_offline(embedded):
    assert embedded.source == str(embedded_gguf_path())
    assert embedded.dtype == torch.float32 and embedded.device == torch.device("cpu")
    assert next(embedded.model.parameters()).dtype == torch.float32
    assert embedded.model.config.vocab_size == 49152 and embedded.context_length == 8192
    assert embedded.tokenizer.decode(list(embedded.eos_token_ids)) == "<|im_end|>"


def test_a_gguf_file_is_read_once_into_a_folder_that_loads_the_same_model(embedded, monkeypatch):
    """What loads from the converted folder is what transformers reads from the GGUF file itself:
    the same weights, bit for bit, the same tokens and chat template; and a converted file is not read again."""
    path = embedded_gguf_path()
    direct = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).state_dict()
    direct_tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    _, model, tokenizer = models.read_model("embedded", torch.float32, False)
    loaded = model.state_dict()
    assert loaded.keys() == direct.keys() and all(torch.equal(loaded[name], direct[name]) for name in direct)
    chat = [{"role": "user", "content": "Why is the sky blue? Say it in French: «ciel»."}]
    assert tokenizer.apply_chat_template(chat) == direct_tokenizer.apply_chat_template(chat)

    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", refuse)
    assert (models.converted(path) / "model.safetensors").is_file()


def test_chat_template_wraps_the_prompt(embedded):
    text = embedded.tokenizer.decode(embedded.encode_chat("What is 2+2?")[0])
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_is_bfloat16_only_where_the_hardware_multiplies_it(monkeypatch, embedded, native):
    """On a CPU without native bfloat16 (AVX2 only) a k-token bfloat16 pass costs about k one-token
    passes, so "auto" (the app's and the bench's default) takes float32 there; a GPU without it
    (T4, V100) takes float16."""
    monkeypatch.setattr(models, "cpu_multiplies_bfloat16", lambda: native)
    monkeypatch.setattr(models, "gpu_multiplies_bfloat16", lambda: native)
    expected = torch.bfloat16 if native else torch.float32
    assert models.parse_dtype("auto", torch.device("cpu")) == models.default_dtype(torch.device("cpu")) == expected
    assert models.default_dtype(torch.device("cuda")) == (torch.bfloat16 if native else torch.float16)
    with pytest.raises(SpecDemoError, match="auto, float32"):
        models.parse_dtype("float8")


def test_a_chat_model_without_a_chat_template_gets_its_known_format():
    """Vicuna's tokenizer predates chat templates: its prompt is wrapped in FastChat's USER/ASSISTANT
    conversation; an unknown model without a template gets the bare text to continue."""
    class Tokenizer:
        chat_template = None

        def __call__(self, text, return_tensors="pt"):
            self.text = text
            return {"input_ids": torch.tensor([[1, 2, 3]])}

    from types import SimpleNamespace

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=2048))
    vicuna = LoadedModel("lmsys/vicuna-7b-v1.3", "", model, Tokenizer(), torch.device("cpu"), torch.float32)
    vicuna.encode_chat("Hi?")
    assert vicuna.tokenizer.text.endswith("USER: Hi? ASSISTANT:")
    other = LoadedModel("some/base-model", "", model, Tokenizer(), torch.device("cpu"), torch.float32)
    other.encode_chat("Hi?")
    assert other.tokenizer.text == "Hi?"
