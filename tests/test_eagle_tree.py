"""The feature draft's static tree (training/eagle_tree.py): the ranks it counts are those the
draft gives drafting a chain along the true tokens, a path counts where every step is right, and
the paths travel with the draft."""

from types import SimpleNamespace

import torch
from transformers import DynamicCache

from specdemo.methods import speculative
from specdemo.methods.eagle import load_feature_draft, save_feature_draft
from training.eagle_tree import MAX_RANK, rank_rows
from training.train_medusa import count_paths

from conftest import make_tiny_model
from test_eagle import feature_draft


@torch.inference_mode()
def test_the_ranks_are_the_draft_s_drafting_a_chain_along_the_true_tokens():
    target = make_tiny_model()
    draft = feature_draft(target)
    sequence = torch.randint(0, 97, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    start, depth = 6, 3
    rows = rank_rows(draft, SimpleNamespace(model=target), sequence, start, depth)
    ids = torch.tensor([sequence])
    features = target.model(ids).last_hidden_state
    assert len(rows) == len(sequence) - start
    for row, p in zip(rows, range(start - 1, len(sequence) - 1)):  # the text up to p is known
        steps = speculative.draft_logits(draft, DynamicCache(config=draft.model.config), ids[:, : p + 1],
                                         features[:, :p])
        logits, expected = next(steps), []
        for token in sequence[p + 1 : p + 1 + depth]:
            top = draft.token_ids(logits.topk(MAX_RANK, dim=-1).indices)[0].tolist()
            expected.append(top.index(token) if token in top else MAX_RANK)
            logits = steps.send(torch.tensor([[token]]))
        assert row == expected


def test_a_path_counts_where_every_step_is_right():
    rows = [[0, 0, 1], [0, MAX_RANK, 0], [1, 0], [MAX_RANK, 0, 0]]
    assert count_paths(rows, MAX_RANK) == {(0,): 2, (0, 0): 1, (0, 0, 1): 1, (1,): 1, (1, 0): 1}


def test_the_paths_travel_with_the_draft(tmp_path):
    target = make_tiny_model()
    draft = feature_draft(target)
    draft.tree_choices = ((0,), (1,), (0, 0))
    save_feature_draft(draft, tmp_path)
    assert load_feature_draft(tmp_path, target).tree_choices == ((0,), (1,), (0, 0))
