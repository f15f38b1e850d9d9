"""The device-grown draft tree's candidates (`device_draft_tree`) on the host: the graph keeps the
`most` of highest value (`preselected`) and the host cuts them to a step's size (`read_tree`). Both
are checked here against the brute-force rerank `draft_tree.best_nodes` of every candidate, on
trees laid out as the graph lays them out, with ties and nodes that end the answer; and a tree
sized as on CUDA through the graphs of `tests/test_graphs.py`, which replay on a CPU."""

import math
from collections import Counter

import pytest
import torch
from test_graphs import PROMPT, fed_its_tokens, graphed

from specdemo.core.events import final_summary
from specdemo.core.static import BUCKETS, DRAFT_BUCKETS, fitted_size
from specdemo.methods import ar, speculative
from specdemo.methods.device_draft_tree import Candidates, preselected, read_tree, tree_parents
from specdemo.methods.draft_tree import best_nodes

from conftest import make_tiny_model
from test_eagle import feature_draft


def candidates(depth: int, k: int, seed: int) -> Candidates:
    """A tree's candidates as the graph makes them: the root's k children, then k children for each
    of the k nodes of highest value of the level before, a child's value its parent's plus a
    log-probability drawn from a few values (0 among them: ties with the parent, and among
    siblings); a node with no value (a child of one that ends the answer) here and there."""
    generator = torch.Generator().manual_seed(seed)
    steps = torch.tensor([0.0, -0.5, -1.0, -2.0])
    draw = lambda n: steps[torch.randint(0, len(steps), (n,), generator=generator)]  # noqa: E731
    scores, chosen = [draw(k)], []
    for _ in range(depth - 1):
        best = scores[-1].topk(k).indices  # the level's best, as the graph expands them
        values = scores[-1][best][:, None] + draw(k * k).view(k, k)
        values[torch.rand(k, generator=generator) < 0.2] = -math.inf  # below a node that ends the answer
        scores.append(values.view(-1))
        chosen.append(best)
    tokens = torch.randint(0, 1000, (k + (depth - 1) * k * k,), generator=generator)
    return Candidates(tokens, torch.cat(scores), tree_parents(chosen, torch.arange(k)))


@pytest.mark.parametrize("depth, k", [(2, 3), (3, 4), (4, 3)])
@pytest.mark.parametrize("seed", range(4))
def test_a_tree_cut_from_the_kept_candidates_is_the_rerank_of_them_all(depth, k, seed):
    every = candidates(depth, k, seed)
    whole = read_tree(every, len(every.scores))
    most = len(every.scores) // 2
    kept = Candidates(*preselected(*every, most))
    assert len(kept.scores) == most
    for size in range(1, most + 1):
        cut = read_tree(kept, size)
        assert cut == best_nodes(whole, size)
        assert all(parent < node for node, parent in enumerate(cut.parents))  # each after its parent


def test_a_gpu_sized_tree_fills_the_widest_pass_from_one_graph(monkeypatch):
    """The GPU set's tree (31 nodes, 2 deep, `defaults.GPU`) with trees sized as on CUDA
    (`static.fitted_size`: beside a copy, the 64-token pass), its draft's graphs replayed on a CPU:
    the tree, of a size that changes with the copy's length, comes from one graph (the
    children a node that fill the largest), it is the tree the host grows from the draft's eager
    passes, every target pass fits a graph, and the answer is AR's."""
    target = make_tiny_model()
    draft = fed_its_tokens(feature_draft(target))
    monkeypatch.setattr(speculative, "fitted_size", lambda size, copied, bucket, device:
                        fitted_size(size, copied, bucket, torch.device("cuda")))
    options = dict(draft=draft, gamma=2, draft_tree_size=31, draft_tree_top_k=3, max_new_tokens=48, eos_token_ids=())
    draft_passes = graphed(draft.model, buckets=DRAFT_BUCKETS, role="draft")
    target_passes = [graphed(target, buckets=BUCKETS) for _ in range(2)]
    runs = [list(speculative.generate(target, PROMPT, passes=passes, draft_passes=drafts, **options))
            for passes, drafts in zip(target_passes, (None, draft_passes))]  # the draft eager, then its graphs
    answer = final_summary(ar.generate(target, PROMPT, max_new_tokens=48, eos_token_ids=())).tokens
    assert final_summary(runs[1]).tokens == final_summary(runs[0]).tokens == answer
    trees = [[event.data.tree for event in events[1:-1]] for events in runs]
    assert [tree.tokens for tree in trees[0]] == [tree.tokens for tree in trees[1]]
    assert all(passes.runs[0] == 0 for passes in target_passes)  # no pass outgrew the widest graph
    drafted = Counter(sum(source == "draft" for source in tree.sources) for tree in trees[1])
    assert len(drafted) > 1 and max(drafted) > 31  # sizes filling their pass, as on CUDA
    keys = [kind[0] for kind in draft_passes.graphs.functions.graphs]
    assert len(keys) == len({key[1:5] for key in keys})  # one graph a depth and look-back span
    assert {key[5] for key in keys if key[1] == 2} == {62} and {key[2] for key in keys if key[1] == 2} == {8}
