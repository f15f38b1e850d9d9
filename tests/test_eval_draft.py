"""The draft evaluation (`training.eval_draft`) guesses each answer token from what precedes it."""

from types import SimpleNamespace

import pytest
import torch

from specdemo.core.static import with_layers
from training.eval_draft import TOP, count_agreement, predictions

from test_eagle import feature_draft


@pytest.mark.parametrize("layers", [(), (1,)])
def test_the_feature_draft_guesses_each_answer_token_from_what_precedes_it(tiny_model, layers):
    """Pair t (f_t, x_(t+1)) predicts x_(t+2): the guesses for the whole text at once equal those
    from each prefix alone, as speculative decoding's first draft step makes them; a draft that
    reads the target's layers gets their residual stream beside f_t, as the verification pass gives it."""
    draft = feature_draft(tiny_model, layers=layers)
    text, answer_length = torch.tensor([[5, 17, 42, 8, 63, 21, 9, 33, 70]]), 4
    with torch.inference_mode():
        guesses = predictions(draft, SimpleNamespace(model=tiny_model), text, answer_length)
        assert guesses.shape == (answer_length, TOP)
        for i in range(answer_length):
            prefix = text[:, : text.shape[1] - answer_length + i]  # everything before answer token i
            features = with_layers(tiny_model.model(prefix, output_hidden_states=True), layers)
            predicted = draft.features(features[:, :-1], prefix[:, 1:], None)[:, -1]
            assert guesses[i].tolist() == draft.token_ids(draft.logits(predicted).topk(TOP, dim=-1).indices)[0].tolist()


def test_drafts_compared_side_by_side_read_the_same_answers(tiny_model):
    """Two drafts counted in one call get exactly the counts each gets alone: the target's answer is
    made once a prompt and read by both."""
    target = SimpleNamespace(model=tiny_model, encode_chat=lambda text: torch.tensor([[3 + len(text) % 50, 11, 29]]),
                             eos_token_ids=())
    rows = [{"turns": ["a question"], "category": "qa"}, {"turns": ["another, longer one"], "category": "math"}]
    drafts = {"plain": feature_draft(tiny_model), "layered": feature_draft(tiny_model, seed=1, layers=(1,))}
    with torch.inference_mode():
        together = count_agreement(target, drafts, rows, max_new_tokens=12)
        for name, draft in drafts.items():
            assert together[name] == count_agreement(target, {name: draft}, rows, max_new_tokens=12)[name]
    assert together["plain"]["overall"]["tokens"] == 24 and set(together["plain"]) == {"qa", "math", "overall"}
    assert together["plain"] != together["layered"]
