"""Shared fixtures: tiny random-init models built here (fast, exact) and the embedded model."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hub
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import importlib.util
import socket
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdemo.models import load_model

# `make test` runs the modules in two processes, a module to a process (pytest-xdist's loadfile): the
# longest start first, so that neither process is left with one long module at the end
LONGEST_FIRST = ("test_browser_lesson.py", "test_browser_views.py", "test_browser.py", "test_static.py",
                 "test_browser_runs.py", "test_divergence.py", "test_bench.py", "test_static_embedded.py",
                 "test_cllm.py", "test_zerogpu.py", "test_models.py", "test_ui.py", "test_speculative.py",
                 "test_medusa.py", "test_lesson_prompts.py", "test_distill.py", "test_eagle.py", "test_offload.py")


def pytest_sessionstart(session):
    """MKL's vector math settled on one thread, as `load_model` does (`core.process`): the tiny models here
    are built, not loaded, and a method's answer is compared with AR's in the same process."""
    from specdemo.core.process import settle_vector_math

    settle_vector_math()


def pytest_collection_modifyitems(items):
    """The modules in LONGEST_FIRST's order, the rest after them as collected; tests within a module keep theirs."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))



def load_script(name: str):
    """`scripts/NAME.py` as a module: the scripts are no package."""
    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

PAGE_DEFAULTS = dict(  # the Generate event's inputs as a fresh page sends them, by name (GENERATE_INPUTS)
    model="", precision="", do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=-1,
    no_repeat_ngram_size=0, gamma=2, adaptive_gamma=False, draft_tree_size=True, copy_length=True, retrieve=True,
    tree="dynamic",
    tree_size=0, typical_acceptance=False, decoder="lookahead", block_size=16, window=0, ngram=3, candidates=3,
    num_beams=4, length_penalty=1.0, early_stopping=False, alpha=0.1, amateur_temperature=0.5,
)


def page_inputs(prompt: str, method: str, max_new_tokens: int, **named) -> list:
    """The Generate handler's positional inputs, built by name: a new control shifts no test's index."""
    from specdemo.app.handlers import GENERATE_INPUTS

    values = {**PAGE_DEFAULTS, "prompt": prompt, "method": method, "max_new_tokens": max_new_tokens, **named}
    return [values[name] for name in GENERATE_INPUTS]


def make_tiny_model(seed: int = 0, vocab_size: int = 97, context: int = 256) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights, float32, on the CPU: small enough for many runs."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0  # quiets generate(); no padding is ever used
    return model


@pytest.fixture(scope="session")
def tiny_model() -> LlamaForCausalLM:
    return make_tiny_model()


@pytest.fixture
def prompt_ids() -> torch.Tensor:
    return torch.tensor([[5, 17, 42, 8, 63, 21]])


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct in float32 (exactness tests run in float32)."""
    return load_model("embedded", "float32", "cpu")


@pytest.fixture(scope="session")
def embedded_ar(embedded):
    """`embedded_ar(prompt, max_new_tokens)`: AR's greedy float32 answer (token ids) on the embedded
    model, decoded once a session by `ar.generate`: several tests compare a method with the same
    AR answer, which costs a pass a token."""
    from specdemo.core.events import final_summary
    from specdemo.methods import ar

    answers = {}

    def answer(prompt: str, max_new_tokens: int) -> tuple[int, ...]:
        if (prompt, max_new_tokens) not in answers:
            answers[prompt, max_new_tokens] = tuple(final_summary(ar.generate(
                embedded.model, embedded.encode_chat(prompt), max_new_tokens=max_new_tokens,
                eos_token_ids=embedded.eos_token_ids)).tokens)
        return answers[prompt, max_new_tokens]

    return answer


def time_one_round(patch: pytest.MonkeyPatch) -> None:
    """One timing round a Generate click or a race, for tests of the page's layout and flow rather than of its
    numbers. Generate times for the click's `LIMITS.timing_s` (`handlers.generate_plan`): a millisecond holds no
    round, so it times the least, one."""
    import dataclasses

    from specdemo.app import handlers, live

    for module, name in ((live, "MIN_ROUNDS"), (handlers, "RACE_MIN_ROUNDS"), (handlers, "RACE_MEASURE_S")):
        patch.setattr(module, name, 1 if name.endswith("ROUNDS") else 0.0)
    patch.setattr(handlers, "LIMITS", dataclasses.replace(handlers.LIMITS, timing_s=0.001))


def serve(app):
    """`app` served on a free local port, for the API and browser tests; `app.close()` stops it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from specdemo.app.ui import serve as serve_page

    # the app's own queue and limits
    serve_page(app, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return app


@pytest.fixture(scope="session")
def served_app(embedded):
    """The app on the embedded model, served for the API and browser tests."""
    from specdemo.app.ui import build_app

    app = serve(build_app(embedded))
    yield app
    app.close()
