"""Trees sized as on CUDA, run on a CPU: `static.fitted_size` sizes a tree by the device its pass
runs on, and on CUDA a tree fills the width its pass is padded to (up to 64 tokens), which no
CPU run otherwise reaches. Here its CUDA branch sizes the GPU set's trees (`defaults.GPU`) while
every pass replays the graphs of `tests/test_graphs.py` on a CPU."""

from collections import Counter

import torch
from test_graphs import PROMPT, ReplayedFunctionGraphs, fed_its_tokens, graphed

from specdemo.core.events import final_summary
from specdemo.core.static import BUCKETS, DRAFT_BUCKETS, fitted_size
from specdemo.methods import ar, medusa, speculative

from conftest import make_tiny_model
from test_eagle import feature_draft
from test_medusa import random_heads

NEW_TOKENS = 48


def sized_as_on_cuda(monkeypatch, module) -> None:
    """`module`'s trees sized by `fitted_size`'s CUDA branch."""
    monkeypatch.setattr(module, "fitted_size", lambda size, copied, bucket, device:
                        fitted_size(size, copied, bucket, torch.device("cuda")))


def fill_their_passes(runs: list[list], target, target_passes: list, source: str) -> None:
    """Checks two runs, the companion eager then through its graphs: both give AR's answer and
    propose the same trees, no target pass outgrew the widest graph, and the trees' `source` nodes
    fill their passes past the 31 asked, in sizes that change with the copy's length."""
    answer = final_summary(ar.generate(target, PROMPT, max_new_tokens=NEW_TOKENS, eos_token_ids=())).tokens
    assert final_summary(runs[1]).tokens == final_summary(runs[0]).tokens == answer
    trees = [[event.data.tree for event in events[1:-1]] for events in runs]
    assert [tree.tokens for tree in trees[0]] == [tree.tokens for tree in trees[1]]
    assert all(passes.runs[0] == 0 for passes in target_passes)
    sizes = Counter(sum(node == source for node in tree.sources) for tree in trees[1])
    assert len(sizes) > 1 and max(sizes) > 31


def test_a_gpu_sized_draft_tree_fills_the_widest_pass_from_one_graph(monkeypatch):
    """The GPU set's tree (31 nodes, 2 deep, `defaults.GPU`) with trees sized as on CUDA
    (`static.fitted_size`: beside a copy, the 64-token pass), its draft's graphs replayed on a CPU:
    the tree, of a size that changes with the copy's length, comes from one graph (the
    children a node that fill the largest), it is the tree the host grows from the draft's eager
    passes, every target pass fits a graph, and the answer is AR's."""
    target = make_tiny_model()
    draft = fed_its_tokens(feature_draft(target))
    sized_as_on_cuda(monkeypatch, speculative)
    options = dict(draft=draft, gamma=2, draft_tree_size=31, draft_tree_top_k=3, max_new_tokens=NEW_TOKENS,
                   eos_token_ids=())
    draft_passes = graphed(draft.model, buckets=DRAFT_BUCKETS, role="draft")
    target_passes = [graphed(target, buckets=BUCKETS) for _ in range(2)]
    runs = [list(speculative.generate(target, PROMPT, passes=passes, draft_passes=drafts, **options))
            for passes, drafts in zip(target_passes, (None, draft_passes))]  # the draft eager, then its graphs
    fill_their_passes(runs, target, target_passes, "draft")
    keys = [kind[0] for kind in draft_passes.graphs.functions.graphs]
    assert len(keys) == len({key[1:5] for key in keys})  # one graph a depth and look-back span
    assert {key[5] for key in keys if key[1] == 2} == {62} and {key[2] for key in keys if key[1] == 2} == {8}


def test_a_gpu_sized_medusa_tree_fills_the_widest_pass_beside_one_graph_of_the_heads(monkeypatch):
    """Medusa's GPU set (a dynamic tree of 31 nodes) sized as on CUDA: beside copies of changing
    length the tree fills the pass's width, one graph of the heads ranks enough tokens for every
    size, each pass proposes the tree the eager heads propose, no pass outgrows the widest
    target graph, and the answer is AR's."""
    target = make_tiny_model()
    heads = random_heads(target, reads_token=True)
    sized_as_on_cuda(monkeypatch, medusa)
    graphs = ReplayedFunctionGraphs()
    target_passes = [graphed(target, buckets=BUCKETS) for _ in range(2)]
    runs = [list(medusa.generate(target, PROMPT, heads=heads, tree_size=31, max_new_tokens=NEW_TOKENS,
                                 eos_token_ids=(), passes=passes, heads_passes=given))
            for passes, given in zip(target_passes, (None, graphs))]
    fill_their_passes(runs, target, target_passes, "head")
    assert len(graphs.graphs) == 1
