"""The host's copy of a request's text (`transfer.HostText`, the loop's `Context.text`): the
proposers that read the text every pass read it from the device once, and the copy, grown by the
loop with each pass's committed tokens, is the text itself at every pass."""

import pytest
import torch
from test_conformance import MAX_NEW_TOKENS, configurations

from specdemo.core import transfer
from specdemo.core.events import final_summary

from conftest import make_tiny_model


def test_a_copy_is_read_once_and_grows_with_the_text():
    text = transfer.HostText()
    sequence = torch.tensor([[3, 1, 4]])
    first = text.of(sequence)
    assert first.tolist() == [3, 1, 4] and text.of(sequence) is first  # the same length: the copy, not a read
    text.extend([1, 5])
    assert text.of(torch.tensor([[3, 1, 4, 1, 5]])).tolist() == [3, 1, 4, 1, 5]
    assert text.of(torch.tensor([[2, 7]])).tolist() == [2, 7]  # another length: read again


@pytest.mark.parametrize("name", ["speculative, feature draft, tree", "medusa, dynamic tree", "lookahead",
                                  "cllm, lookahead"])
def test_the_copy_proposers_read_is_the_text_at_every_pass(monkeypatch, prompt_ids, name):
    target, other = make_tiny_model(), make_tiny_model(seed=1)
    generate, options, reference = configurations(target, other)[name]
    reads, seen = [], []
    of = transfer.HostText.of

    def checked(self, sequence):
        reads.append(self.tokens is None or self.tokens.shape[0] != sequence.shape[1])
        copy = of(self, sequence)
        seen.append(copy.tolist() == sequence[0].tolist())
        return copy

    monkeypatch.setattr(transfer.HostText, "of", checked)
    summary = final_summary(generate(reference, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), **options))
    assert len(seen) >= summary.target_forwards - 1 and all(seen)
    assert sum(reads) == 1  # the prompt's text, once
