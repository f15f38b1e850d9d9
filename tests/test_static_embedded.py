"""The compiled static path on the embedded model's first layers (float32, the shipped draft and
heads): the compiled pass changes no token. Its own module, so that its compile runs beside the
tiny models' (`test_static`) when the suite runs in two processes."""

import copy

import pytest

from specdemo.core.events import final_summary
from specdemo.core.loop import Proposer, decode
from specdemo.core.sampling import GREEDY
from specdemo.core.static import compile_passes
from specdemo.methods import ar, medusa, method_options, speculative

# of its 30: its widths, heads, rotary table, tokenizer and companions stay the model's own; inductor's
# time grows with the layers, and a graph of all 30 takes over a minute on 2 cores
LAYERS = 6
PROMPT = "Name three colours of the rainbow and say why the sky is blue."


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "speculative", "medusa"])
def test_the_embedded_model_gives_ars_answer_through_the_compiled_pass(compiled_embedded, embedded, method):
    """float32, the shipped draft and heads: the compiled pass changes no token."""
    model, passes, expected = compiled_embedded
    input_ids = embedded.encode_chat(PROMPT)
    generate = {"ar": ar.generate, "speculative": speculative.generate, "medusa": medusa.generate}[method]
    options = method_options(method, embedded)
    passes.runs.clear()
    summary = final_summary(generate(model, input_ids, max_new_tokens=40, eos_token_ids=embedded.eos_token_ids,
                                     **options, passes=passes))
    assert summary.tokens == expected
    assert passes.runs[16] >= 10 and not passes.failed  # compiled passes ran (the prompt, wider, runs eagerly)


@pytest.fixture(scope="module")
def compiled_embedded(embedded):
    """A copy of the embedded model's first LAYERS (the session's model stays whole and eager for
    the other tests), its eager AR answer, and its pass compiled for one bucket of 16: AR's one
    token padded to it, a draft tree and a Medusa tree filling it (the tiny models' tests cover
    several buckets)."""
    model = copy.deepcopy(embedded.model)
    model.model.layers = model.model.layers[:LAYERS]
    model.config.num_hidden_layers = LAYERS
    expected = final_summary(decode(model, embedded.encode_chat(PROMPT), Proposer(), method="ar", max_new_tokens=40,
                                    sampling=GREEDY, eos_token_ids=embedded.eos_token_ids)).tokens
    return model, compile_passes(model, buckets=(16,)), expected
