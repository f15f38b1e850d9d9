"""The draft evaluation (`training.eval_draft`) guesses each answer token from what precedes it."""

from types import SimpleNamespace

import torch

from training.eval_draft import TOP, predictions

from test_eagle import feature_draft


def test_the_feature_draft_guesses_each_answer_token_from_what_precedes_it(tiny_model):
    """Pair t (f_t, x_(t+1)) predicts x_(t+2): the guesses for the whole text at once equal those
    from each prefix alone, as speculative decoding's first draft step makes them."""
    draft = feature_draft(tiny_model)
    text, answer_length = torch.tensor([[5, 17, 42, 8, 63, 21, 9, 33, 70]]), 4
    with torch.inference_mode():
        guesses = predictions(draft, SimpleNamespace(model=tiny_model), text, answer_length)
        assert guesses.shape == (answer_length, TOP)
        for i in range(answer_length):
            prefix = text[:, : text.shape[1] - answer_length + i]  # everything before answer token i
            features = tiny_model.model(prefix).last_hidden_state
            predicted = draft.features(features[:, :-1], prefix[:, 1:], None)[:, -1]
            assert guesses[i].tolist() == draft.token_ids(draft.logits(predicted).topk(TOP, dim=-1).indices)[0].tolist()
