"""The device-grown draft tree's candidates (`device_draft_tree`) on the host: the graph keeps the
`most` of highest value (`preselected`) and the host cuts them to a step's size (`read_tree`). Both
are checked here against the brute-force rerank `draft_tree.best_nodes` of every candidate, on
trees laid out as the graph lays them out, with ties and nodes that end the answer."""

import math

import pytest
import torch

from specdemo.methods.device_draft_tree import Candidates, preselected, read_tree, tree_parents
from specdemo.methods.draft_tree import best_nodes


def candidates(depth: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tree's candidates as the graph makes them: the root's k children, then k children for each
    of the k nodes of highest value of the level before, a child's value its parent's plus a
    log-probability drawn from a few values (0 among them: ties with the parent, and among
    siblings); a node with no value (a child of one that ends the answer) here and there."""
    generator = torch.Generator().manual_seed(seed)
    steps = torch.tensor([0.0, -0.5, -1.0, -2.0])

    def draw(n: int) -> torch.Tensor:  # n log-probabilities among `steps`
        return steps[torch.randint(0, len(steps), (n,), generator=generator)]

    scores, chosen = [draw(k)], []
    for _ in range(depth - 1):
        best = scores[-1].topk(k).indices  # the level's best, as the graph expands them
        values = scores[-1][best][:, None] + draw(k * k).view(k, k)
        values[torch.rand(k, generator=generator) < 0.2] = -math.inf  # below a node that ends the answer
        scores.append(values.view(-1))
        chosen.append(best)
    tokens = torch.randint(0, 1000, (k + (depth - 1) * k * k,), generator=generator)
    return tokens, torch.cat(scores), tree_parents(chosen, torch.arange(k))


@pytest.mark.parametrize("depth, k", [(2, 3), (3, 4), (4, 3)])
@pytest.mark.parametrize("seed", range(4))
def test_a_tree_cut_from_the_kept_candidates_is_the_rerank_of_them_all(depth, k, seed):
    every = candidates(depth, k, seed)
    whole = read_tree(Candidates.of(*every), len(every[1]))
    most = len(every[1]) // 2
    kept = Candidates.of(*preselected(*every, most))
    assert kept.table.shape == (3, most)
    for size in range(1, most + 1):
        cut = read_tree(kept, size)
        assert cut == best_nodes(whole, size)
        assert all(parent < node for node, parent in enumerate(cut.parents))  # each after its parent

