"""The public /generate endpoint through gradio_client, for every method and for bad input."""

import pytest
from gradio_client import Client

from specdemo.methods import METHODS


@pytest.fixture(scope="module")
def client(served_app):
    return Client(served_app.local_url, verbose=False)


STATS_KEYS = {"method", "tokens", "forward_passes", "wall_s", "tokens_per_s", "tokens_per_forward"}


@pytest.mark.parametrize("method", list(METHODS))
def test_generate_for_each_method(client, method, embedded):
    text, numbers = client.predict(prompt="Name two fruits.", method=method, max_new_tokens=12, api_name="/generate")
    assert STATS_KEYS <= set(numbers) and numbers["method"] == method
    assert 1 <= numbers["tokens"] <= 12 and numbers["forward_passes"] >= 1 and text.strip()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(prompt="", method="ar"), "empty"),
        (dict(prompt="hi", method="nope"), "unknown method"),
        (dict(prompt="hi", method="ar", max_new_tokens=100000), "max_new_tokens"),
        (dict(prompt="hi " * 3000, method="ar"), "at most"),
        (dict(prompt="hi", method="jacobi", do_sample=True), "does not sample"),
        (dict(prompt="hi", method="contrastive", repetition_penalty=1.3), "does not apply a repetition penalty"),
        # wrong-typed values, as a careless or hostile client sends them: each gets a sentence naming the setting
        (dict(prompt="hi", method=["ar", "medusa"]), "method must be text"),
        (dict(prompt="hi", method="ar", do_sample="false"), "do_sample must be true or false"),
        (dict(prompt="hi", method="ar", do_sample=True, seed=10**20), "seed must be a whole number"),
        (dict(prompt="hi", method="ar", do_sample=True, temperature=1e-45), "temperature must be a number from"),
        (dict(prompt=["hi"], method="ar"), "prompt must be text"),
        (dict(prompt="hi", method="ar", model=3), "model must be text"),
    ],  # NaN: gradio_client cannot send it (not JSON); tests/test_hosting.py posts it to the handlers
)
def test_bad_input_is_a_clear_error_and_the_app_keeps_serving(client, kwargs, message):
    with pytest.raises(Exception, match=message):
        client.predict(**{"max_new_tokens": 8, **kwargs}, api_name="/generate")
    _, numbers = client.predict(prompt="Say hi.", method="ar", max_new_tokens=4, api_name="/generate")
    assert numbers["tokens"] >= 1
