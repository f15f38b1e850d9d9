"""The static draft tree: each node is the draft's token of its rank after its path, drafted with
no read on the host, read once with the target's choices; greedy equals AR whatever its shape."""

import pytest
import torch
from transformers import DynamicCache

from specdemo import SpecDemoError
from specdemo.core.events import final_summary
from specdemo.core.sampling import SamplingConfig
from specdemo.core.verify import read_with_choices
from specdemo.methods import ar, draft_tree, speculative, static_draft_tree
from specdemo.methods.draft import Draft
from specdemo.methods.static_draft_tree import full_paths, prepare, static_plan

from test_eagle import feature_draft

# an irregular shape, 4 deep: wide at the root, a chain below the likeliest branch
IRREGULAR = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
             (0, 0, 0, 0))


def answer(model, prompt_ids, **kwargs):
    return final_summary(speculative.generate(model, prompt_ids, **kwargs))


def a_draft(kind, model):
    return Draft("other", model) if kind == "token" else feature_draft(model)


def features_of(kind, model, prompt_ids):
    return None if kind == "token" else torch.randn(1, prompt_ids.shape[1] - 1, model.config.hidden_size)


@pytest.mark.parametrize("draft_kind", ["token", "feature"])
def test_a_two_deep_full_tree_is_the_tree_grow_builds_keeping_every_node(tiny_model, prompt_ids, draft_kind):
    """Read with the choices (`verify.read_with_choices`, its values by `static_values`), the full
    tree 2 deep holds the tree `grow` builds 2 deep when the rerank keeps every node (each of the
    root's k children and each of theirs, best first, with their values), then the copied branch
    from the root, valued as the root; the choices are the target's argmax after the root and each
    node. Its tokens stay on the device until then."""
    draft, features = a_draft(draft_kind, tiny_model), features_of(draft_kind, tiny_model, prompt_ids)
    grown, _ = draft_tree.grow(draft, DynamicCache(config=tiny_model.config), prompt_ids, features, depth=2, top_k=3,
                               size=12)
    cache = DynamicCache(config=tiny_model.config)
    first = draft_tree.first_logits(draft, cache, prompt_ids, features)
    tree, log_probs = static_draft_tree.static_tree(draft, cache, first, prepare(full_paths(3, 2), prompt_ids.device),
                                                      [41, 42], "copy")
    assert tree.tokens == () and tree.size == 14 and cache.get_seq_length() == prompt_ids.shape[1] - 1 + (
        draft_kind == "token")
    logits = torch.randn(1 + tree.size, 97)
    read, choices = read_with_choices(tree, logits)
    read = static_draft_tree.static_values(read, log_probs)
    assert read.tokens == (*grown.tokens, 41, 42) and read.parents == (*grown.parents, -1, 12)
    assert read.sources == ("draft",) * 12 + ("copy",) * 2 and read.on_device is None
    assert read.scores == pytest.approx((*grown.scores, 0.0, 0.0), abs=1e-5)
    assert choices == logits.argmax(-1).tolist()


@torch.inference_mode()
@pytest.mark.parametrize("paths", [full_paths(2, 3), IRREGULAR], ids=["full, 2 children, 3 deep", "irregular"])
@pytest.mark.parametrize("draft_kind", ["token", "feature"])
def test_each_node_is_the_draft_s_token_of_its_rank_after_its_path(tiny_model, prompt_ids, draft_kind, paths):
    """Brute force: for every node, the draft run as a chain along its ancestors' tokens (a fresh
    cache, no tree attention) ranks the node's token at its path's last rank, with its value."""
    draft, features = a_draft(draft_kind, tiny_model), features_of(draft_kind, tiny_model, prompt_ids)
    if draft_kind == "feature":  # fed its tokens too (`fc` starts passing the feature through): siblings differ
        with torch.no_grad():
            draft.fc.weight.add_(0.1 * torch.randn_like(draft.fc.weight))
    cache = DynamicCache(config=tiny_model.config)
    first = draft_tree.first_logits(draft, cache, prompt_ids, features)
    tree, log_probs = static_draft_tree.static_tree(draft, cache, first, prepare(paths, prompt_ids.device), [], "copy")
    read, _ = read_with_choices(tree, torch.zeros(1 + tree.size, 97))
    read = static_draft_tree.static_values(read, log_probs)
    shape = static_plan(paths).shape
    assert read.parents == shape.parents and read.size == len(paths)
    for node in range(read.size):
        steps = speculative.draft_logits(draft, DynamicCache(config=tiny_model.config), prompt_ids, features)
        logits = next(steps)
        for ancestor in read.ancestry(read.parents[node]):
            logits = steps.send(torch.tensor([[read.tokens[ancestor]]]))
        rank = shape.tokens[node]
        ids, values = draft_tree.best_children(logits, rank + 1, draft.token_ids)
        assert read.tokens[node] == int(ids[0, rank])
        parent_value = read.scores[read.parents[node]] if read.parents[node] >= 0 else 0.0
        assert read.scores[node] - parent_value == pytest.approx(float(values[0, rank]), abs=1e-4)


def test_a_level_feeds_only_the_nodes_that_have_children():
    plan = static_plan(IRREGULAR)
    assert plan.width == 4 and [level.nodes for level in plan.levels] == [(0, 1, 2), (4, 5, 6), (8,)]
    # node 12 (0, 0, 0, 0) sees its ancestors 0 and 4, fed before it, and itself
    assert plan.levels[2].sees.tolist() == [[True, False, False, True, False, False, True]]
    assert not plan.levels[0].sees.flags.writeable


@pytest.mark.parametrize("static_tree, gamma, top_k", [(True, 3, 2), (True, 1, 3), (IRREGULAR, 4, 3),
                                                         (IRREGULAR, 6, 3)])
@pytest.mark.parametrize("draft_kind", ["token", "feature"])
def test_greedy_with_a_static_tree_equals_ar(tiny_model, prompt_ids, draft_kind, static_tree, gamma, top_k):
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=24)).tokens
    got = answer(tiny_model, prompt_ids, draft=a_draft(draft_kind, tiny_model), max_new_tokens=24, gamma=gamma,
                 draft_tree_top_k=top_k, static_tree=static_tree)
    assert got.tokens == expected


def test_a_static_tree_needs_plain_greedy_decoding_and_fits_its_depth(tiny_model, prompt_ids):
    draft = Draft("other", tiny_model)
    for options in (dict(draft_tree_size=0), dict(sampling=SamplingConfig(do_sample=True)),
                    dict(static_tree=IRREGULAR, gamma=3), dict(draft_tree_top_k=5, gamma=3)):
        with pytest.raises(SpecDemoError, match="static draft tree"):
            answer(tiny_model, prompt_ids, draft=draft, **{"static_tree": True, "gamma": 2, **options})


def test_a_static_tree_takes_the_paths_the_draft_brings():
    """True: the first `draft_tree_size` of the draft's paths at most `gamma` deep (still a tree:
    a path comes after its prefixes), else the full tree; paths given are taken as they are."""
    assert speculative.static_paths(True, IRREGULAR, 3, 2, 6) == IRREGULAR[:6]
    assert speculative.static_paths(True, IRREGULAR, 3, 4, 100) == IRREGULAR
    assert speculative.static_paths(True, (), 2, 3, 6) == full_paths(2, 3)
    assert speculative.static_paths([[0], [0, 0]], IRREGULAR, 3, 2, 6) == ((0,), (0, 0))
    assert speculative.static_paths(False, IRREGULAR, 3, 2, 6) == ()


def test_greedy_with_the_draft_s_own_paths_equals_ar(tiny_model, prompt_ids):
    draft = feature_draft(tiny_model)
    draft.tree_choices = IRREGULAR
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=24)).tokens
    events = list(speculative.generate(tiny_model, prompt_ids, draft=draft, max_new_tokens=24, gamma=4,
                                       draft_tree_size=10, static_tree=True))
    assert final_summary(events).tokens == expected
    trees = [event.data.tree for event in events[1:-1] if event.data.gamma == 3]  # near the end: a grown tree
    assert len(trees) > 2 and all(tree.parents[:10] == static_plan(IRREGULAR[:10]).shape.parents for tree in trees)
