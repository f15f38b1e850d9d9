"""Passes that feed more than they can commit (Medusa's tree, lookahead's candidates and window)
stay inside the model's context: a model with absolute positions (GPT-2) fails outright past it."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from specdemo import SpecDemoError
from specdemo.core.events import final_summary
from specdemo.methods import ar, lookahead, medusa
from specdemo.methods.medusa_heads import MedusaHeads

CONTEXT = 24


@pytest.fixture(scope="module")
def short_model():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2)).eval()


@pytest.mark.parametrize("prompt_length", [1, 4, 9])
@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_medusa_fills_the_context_as_ar_does(short_model, prompt_length, tree):
    torch.manual_seed(prompt_length)
    heads = MedusaHeads(32, 50, 4, shared_lm_head=short_model.get_output_embeddings()).eval()
    prompt = torch.randint(50, (1, prompt_length))
    budget = CONTEXT - prompt_length  # the request fills the context to its last position
    expected = final_summary(ar.generate(short_model, prompt, max_new_tokens=budget, eos_token_ids=())).tokens
    settings = dict(heads=heads, tree=tree, tree_size=8 if tree == "dynamic" else None, copy_length=8)
    assert final_summary(medusa.generate(short_model, prompt, max_new_tokens=budget, eos_token_ids=(),
                                         **settings)).tokens == expected


def test_lookahead_fills_the_context_its_window_leaves(short_model):
    prompt = torch.tensor([[1, 2, 3, 1, 2, 3]])
    reach = 2 + 3 - 3  # window 2, n-gram 3: the window reaches 2 positions past the answer's last token
    with pytest.raises(SpecDemoError, match=f"at most {CONTEXT - 6 - reach} new tokens"):
        next(lookahead.generate(short_model, prompt, max_new_tokens=CONTEXT - 6, window=2, ngram=3, eos_token_ids=()))
    budget = CONTEXT - 6 - reach
    expected = final_summary(ar.generate(short_model, prompt, max_new_tokens=budget, eos_token_ids=())).tokens
    assert final_summary(lookahead.generate(short_model, prompt, max_new_tokens=budget, window=2, ngram=3,
                                            eos_token_ids=())).tokens == expected
