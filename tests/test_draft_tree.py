"""The draft tree (EAGLE-2): greedy equals AR whatever the tree holds, the draft's tree pass
scores each path as a chain would, the target accepts a branch the chain would have missed, and
the feature draft is fed exactly the target's features of the accepted branch."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from specdemo import SpecDemoError
from specdemo.core.events import StepEvent, final_summary
from specdemo.core.sampling import SamplingConfig
from specdemo.core.steps import SamplingCheck, TreeStep
from specdemo.core.verify import Proposal, accept_greedy
from specdemo.methods import ar, draft_tree, speculative
from specdemo.methods.draft import Draft

from conftest import make_tiny_model
from test_eagle import OracleDraft, feature_draft


def answer(model, prompt_ids, **kwargs):
    return final_summary(speculative.generate(model, prompt_ids, **kwargs))


class RunnerUpDraft(Draft):
    """The target itself as a draft, with its two best tokens swapped everywhere: a chain never
    gets a token accepted, while a tree with two children per node always holds the target's."""

    def logits(self, input_ids, cache, logits_to_keep=1, **tree):
        logits = super().logits(input_ids, cache, logits_to_keep, **tree).clone()
        top = logits.topk(2, dim=-1)
        logits.scatter_(-1, top.indices, top.values.flip(-1))
        return logits


@pytest.mark.parametrize("size, gamma, top_k", [(1, 1, 1), (3, 1, 4), (6, 3, 2), (12, 4, 4), (30, 6, 3)])
@pytest.mark.parametrize("draft_kind", ["token_other", "token_subset", "feature"])
def test_greedy_tree_equals_ar(tiny_model, prompt_ids, size, gamma, top_k, draft_kind):
    draft = {
        "token_other": lambda: Draft("other", make_tiny_model(seed=1)),
        "token_subset": lambda: Draft("subset", tiny_model, torch.arange(0, 97, 2)),
        "feature": lambda: feature_draft(tiny_model),
    }[draft_kind]()
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=40)).tokens
    summary = answer(tiny_model, prompt_ids, draft=draft, max_new_tokens=40, gamma=gamma, draft_tree_size=size,
                     draft_tree_top_k=top_k)
    assert summary.tokens == expected and summary.finish_reason == "length"


def test_tree_accepts_the_branch_a_chain_misses(tiny_model, prompt_ids):
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=40)).tokens
    draft = RunnerUpDraft("runner-up", tiny_model)
    chain = answer(tiny_model, prompt_ids, draft=draft, max_new_tokens=40, gamma=3, draft_tree_size=0)
    assert chain.tokens == expected and chain.accepted == 0  # the chain's guess is always the runner-up
    events = list(speculative.generate(tiny_model, prompt_ids, draft=draft, max_new_tokens=40, gamma=3,
                                       draft_tree_size=8, draft_tree_top_k=2))
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert events[-1].tokens == expected
    assert all(e.data.accept_length >= 1 for e in steps[:-1])  # the second child of the root is always right
    trees = [e for e in steps if isinstance(e.data, TreeStep)]
    assert len(trees) >= len(steps) - 1  # only a last pass with room for one token drafts nothing
    for e in trees:  # the event's tree and path spell what was committed
        data = e.data
        assert [data.tree.tokens[node] for node in data.accepted_path] == list(e.accepted)
        assert list(e.committed) == [*e.accepted, data.target_token][: len(e.committed)]
        assert all(data.tree.parents[child] == parent  # a path from the root (-1) down
                   for parent, child in zip([-1, *data.accepted_path], data.accepted_path))


def test_tree_pass_scores_each_path_as_a_chain(tiny_model, prompt_ids):
    """Each node's value is its path's log-probability under the draft: the one tree pass per
    level (mask and positions) gives what running the draft along that path alone gives."""
    draft = Draft("other", tiny_model)
    cache = DynamicCache(config=tiny_model.config)
    tree, draft_passes = draft_tree.grow(draft, cache, prompt_ids, None, depth=4, top_k=3, size=100)
    assert cache.get_seq_length() == prompt_ids.shape[1]  # the branches are dropped again
    # 3 children of 3 expanded nodes per level
    assert tree.size == 3 + 3 * 9 and sorted(set(tree.depths)) == [1, 2, 3, 4]
    # a pass per level grown, kept or not
    assert draft_passes == 4
    for node in range(tree.size):
        parent = tree.parents[node]
        assert parent < node and (parent < 0 or tree.scores[node] <= tree.scores[parent])
        path = [tree.tokens[n] for n in tree.ancestry(node)]
        with torch.no_grad():
            logits = tiny_model(torch.cat([prompt_ids, torch.tensor([path[:-1]], dtype=torch.long)], dim=-1)).logits[0]
        log_probs = torch.log_softmax(logits[prompt_ids.shape[1] - 1 :].float(), dim=-1)
        chain_score = sum(log_probs[i, token].item() for i, token in enumerate(path))
        assert tree.scores[node] == pytest.approx(chain_score, abs=1e-4)
    # the rerank keeps the nodes of highest value, which include their parents
    best = draft_tree.best_nodes(tree, 10)
    assert sorted(best.scores, reverse=True) == sorted(tree.scores, reverse=True)[:10]
    assert all(parent < node for node, parent in enumerate(best.parents))
    # the first level is the draft's own ranking after the prompt
    first = [tree.tokens[n] for n in range(tree.size) if tree.depths[n] == 1]
    with torch.no_grad():
        assert first == tiny_model(prompt_ids).logits[0, -1].topk(3).indices.tolist()


def test_eos_inside_an_accepted_branch(tiny_model, prompt_ids):
    greedy = list(final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=30)).tokens)
    eos = greedy[4]
    expected = greedy[: greedy.index(eos) + 1]
    summary = answer(tiny_model, prompt_ids, draft=Draft("target", tiny_model), max_new_tokens=30, gamma=8,
                     draft_tree_size=8, draft_tree_top_k=1, eos_token_ids=[eos])
    assert list(summary.tokens) == expected and summary.finish_reason == "eos" and summary.target_forwards == 1


def test_accept_greedy_walks_the_matching_branch():
    tree = Proposal((7, 8, 9, 7, 3), (-1, -1, 0, 0, 1), ("draft",) * 5, scores=(-1, -2, -3, -4, -5))
    assert tree.depths == (1, 1, 2, 2, 2)
    # choices[0] follows the root, choices[1 + i] follows node i
    assert accept_greedy(tree, [8, 0, 3, 0, 0, 0])[0] == [1, 4]
    assert accept_greedy(tree, [7, 7, 0, 0, 0, 0])[0] == [0, 3]
    assert accept_greedy(tree, [5, 0, 0, 0, 0, 0])[0] == []
    assert draft_tree.best_continuation(tree, -1) == [0, 2]


@pytest.mark.parametrize("every", [2, 3])
def test_tree_rollback_feeds_the_feature_draft_the_accepted_branch(tiny_model, prompt_ids, every):
    """After each pass the feature draft's first call continues with the target's own features of
    the committed text: the rows kept are those of the accepted branch, not of its siblings."""
    draft = OracleDraft(tiny_model, prompt_ids[0, 0].item(), every)
    summary = answer(tiny_model, prompt_ids, draft=draft, max_new_tokens=40, gamma=3, draft_tree_size=6,
                     draft_tree_top_k=2)
    assert summary.tokens == final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=40)).tokens
    assert summary.accepted > 0
    sequence = torch.cat([prompt_ids, torch.tensor([summary.tokens])], dim=-1)
    with torch.no_grad():
        true_features = tiny_model.model(sequence).last_hidden_state
    chain_calls = [(seen, features) for seen, features, _, is_tree in draft.log if not is_tree]
    assert len(chain_calls) >= summary.target_forwards - 2
    for seen, features in chain_calls:
        torch.testing.assert_close(features, true_features[:, seen : seen + features.shape[1]], rtol=1e-4, atol=1e-4)


def test_tree_size_follows_the_decoding_rule(tiny_model, prompt_ids):
    draft = Draft("t", tiny_model)
    greedy = next(speculative.generate(tiny_model, prompt_ids, draft=draft, max_new_tokens=8, draft_tree_size=None,
                                       gamma=2))
    assert isinstance(greedy.data, TreeStep)  # plain greedy: a tree
    wider = next(speculative.generate(tiny_model, prompt_ids, draft=draft, max_new_tokens=8, draft_tree_size=None,
                                      gamma=2, auto_tree_size=12, copy_length=0))
    draft_nodes = lambda event: sum(source == "draft" for source in event.data.tree.sources)  # noqa: E731
    assert draft_nodes(greedy) == speculative.AUTO_TREE_SIZE and draft_nodes(wider) == 12  # where a GPU's set asks
    for auto in (None, 12):  # sampling: the chain and its rule, whatever size the method would choose for a tree
        sampled = next(speculative.generate(tiny_model, prompt_ids, draft=draft, max_new_tokens=8, draft_tree_size=None,
                                            sampling=SamplingConfig(do_sample=True, seed=0),
                                            **({} if auto is None else {"auto_tree_size": auto})))
        assert isinstance(sampled.data, SamplingCheck)
    with pytest.raises(SpecDemoError, match="tree"):
        next(speculative.generate(tiny_model, prompt_ids, draft=draft, draft_tree_size=6,
                                  sampling=SamplingConfig(do_sample=True)))
    with pytest.raises(SpecDemoError, match="tree"):
        next(speculative.generate(tiny_model, prompt_ids, draft=draft, draft_tree_size=6,
                                  sampling=SamplingConfig(repetition_penalty=1.2)))
    for bad in [{"draft_tree_size": -1}, {"draft_tree_size": 2.5}, {"draft_tree_top_k": 0}]:
        with pytest.raises(SpecDemoError, match="tree"):
            next(speculative.generate(tiny_model, prompt_ids, draft=draft, **{"draft_tree_size": 4, **bad}))


def test_a_tree_step_is_drawn_and_explained(tiny_model, prompt_ids):
    """The app's views read the step's tree like Medusa's: the accepted branch in green, the
    draft's favourite continuation after it in red, and a sentence that says what happened."""
    from specdemo.app.views.explain import explain_step
    from specdemo.app.views.figures import COLOURS
    from specdemo.app.views.trees import tree_figure
    from specdemo.core.events import acceptance_by_position

    events = speculative.generate(tiny_model, prompt_ids, draft=feature_draft(tiny_model), max_new_tokens=40, gamma=3,
                                  draft_tree_size=12, draft_tree_top_k=3)
    step = next(e for e in events if isinstance(e, StepEvent) and isinstance(e.data, TreeStep) and e.data.accept_length
                and e.rejected)
    colours = list(tree_figure(step, str).data[-1].marker.color)  # the root drawn as node 0, node i as i + 1
    assert [colours[0], *(colours[node + 1] for node in step.data.accepted_path)] \
        == [COLOURS["accepted"]] * (step.data.accept_length + 1)
    assert colours.count(COLOURS["rejected"]) == len(step.rejected) >= 1
    text = explain_step(step, str)
    by_depth = acceptance_by_position([step])  # one share per depth of the tree, not per node
    assert len(by_depth) == max(step.data.tree.depths) \
        and by_depth[: step.data.accept_length] == [1.0] * step.data.accept_length
    drafted = step.data.tree.sources.count("draft")
    assert f"a tree of {drafted} tokens" in text and f"{max(step.data.tree.depths)} deep in all" in text
    accepted = step.data.accept_length
    assert (f"followed one for {accepted} token{'' if accepted == 1 else 's'} (" if accepted
            else "agreed with none of them") in text


def test_a_copy_follows_the_draft_s_nodes_then_branches_off():
    tree = Proposal((7, 8, 9), (-1, -1, 0), ("draft",) * 3, scores=(-1, -2, -3))
    grown = draft_tree.add_copy(tree, [7, 9, 4, 5])
    assert grown.tokens == (7, 8, 9, 4, 5) and grown.parents == (-1, -1, 0, 2, 3) and grown.depths == (1, 1, 2, 3, 4)
    # a copy keeps its parent's value
    assert grown.sources == ("draft",) * 3 + ("copy",) * 2 and grown.scores[3:] == (-3, -3)
    assert tree.size == 3  # the draft's own tree is left as it was
    branched = draft_tree.add_copy(tree, [8, 1])
    assert branched.parents == (-1, -1, 0, 1) and branched.depths[3] == 2
    assert draft_tree.add_copy(tree, []) == tree
    # the target walks into copied nodes like any other; the draft's favourite stays what it turned down
    assert accept_greedy(grown, [7, 9, 0, 4, 5, 6])[0] == [0, 2, 3, 4]
    assert draft_tree.best_continuation(draft_tree.add_copy(tree, [7, 6]), 0) == [2]


def test_the_copied_branch_commits_what_the_text_repeats(tiny_model, prompt_ids):
    """A draft that is never right alone (a one-node tree of the target's runner-up) commits
    nothing; with a copy of the text in the tree, the loops a tiny random model falls into are
    committed several tokens a pass, and the answer is still AR's."""
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=60)).tokens
    draft = RunnerUpDraft("runner-up", tiny_model)
    settings = dict(draft=draft, max_new_tokens=60, gamma=1, draft_tree_size=1, draft_tree_top_k=1)
    alone = answer(tiny_model, prompt_ids, copy_length=0, **settings)
    assert alone.tokens == expected and alone.accepted == 0
    events = [e for e in speculative.generate(tiny_model, prompt_ids, copy_length=6, **settings)]
    assert events[-1].tokens == expected and events[-1].target_forwards < alone.target_forwards
    steps = [e for e in events if isinstance(e, StepEvent) and isinstance(e.data, TreeStep)]
    copied = [e for e in steps if any(e.data.tree.sources[node] == "copy" for node in e.data.accepted_path)]
    assert copied and max(e.data.accept_length for e in copied) >= 2
    # a copy costs no draft pass: the one-level draft runs once a step however deep the copy goes
    assert max(e.data.gamma for e in steps) > 1 and events[-1].draft_forwards == len(steps) == events[-1].steps


def test_adaptive_gamma_does_not_shrink_when_a_copy_commits_more(tiny_model, prompt_ids):
    """Adaptive γ shrinks only after an early rejection: a step whose copied branch commits more
    than its γ drafted is no rejection, and the next step drafts at least as deep."""
    settings = dict(draft=Draft("self", tiny_model), gamma=2, adaptive_gamma=True, draft_tree_top_k=1, eos_token_ids=())
    events = speculative.generate(tiny_model, prompt_ids, max_new_tokens=120, draft_tree_size=2, copy_length=8,
                                  **settings)
    steps = [e for e in events if isinstance(e, StepEvent)]
    # totals -> per step
    gammas = [e.draft_forwards - before.draft_forwards for before, e in zip([StepEvent("", 0, ())] + steps, steps)]
    past_gamma = [i for i, e in enumerate(steps[:-2]) if e.data.accept_length > gammas[i]]
    assert past_gamma  # the copy went past γ
    assert all(gammas[i + 1] >= gammas[i] for i in past_gamma), list(zip(gammas, (e.data.accept_length for e in steps)))


def test_copy_length_needs_a_tree(tiny_model, prompt_ids):
    draft = Draft("t", tiny_model)
    sampled = next(speculative.generate(tiny_model, prompt_ids, draft=draft, max_new_tokens=8,
                                        sampling=SamplingConfig(do_sample=True, seed=0)))
    assert not isinstance(sampled.data, TreeStep)  # sampling drafts the chain, with nothing copied
    for bad in [{"draft_tree_size": 0, "copy_length": 3}, {"copy_length": -1}, {"copy_length": 2.0},
                {"copy_length": 17}]:
        with pytest.raises(SpecDemoError, match="copy"):
            next(speculative.generate(tiny_model, prompt_ids, draft=draft, **bad))
    # sampling drafts no tree: the sentence must not send the user to draft_tree_size, which sampling refuses
    with pytest.raises(SpecDemoError, match="only plain greedy decoding drafts"):
        next(speculative.generate(tiny_model, prompt_ids, draft=draft, copy_length=3,
                                  sampling=SamplingConfig(do_sample=True, seed=0)))


@pytest.mark.parametrize("sources, symbols, title, said, unsaid", [
    (["draft", "draft", "copy", "copy"], ["square", "square"], "4 nodes, 2 copied ■, 3 accepted",
     ["a tree of 2 tokens", "2 more were copied", "2 of them copied"], []),
    (["draft", "copy", "retrieved", "retrieved"], ["square", "diamond", "diamond"],
     "4 nodes, 1 copied ■, 2 retrieved ◆, 3 accepted",
     ["a tree of 1 token,", "1 more was copied", "2 more were retrieved from what the model's earlier answers wrote",
      "2 of them retrieved"],
     ["of them copied"]),
])
def test_guessed_branches_are_drawn_and_explained(sources, symbols, title, said, unsaid):
    """Copied nodes are squares, retrieved ones (earlier answers) diamonds, and the sentence says how
    many of each were in the tree and among the accepted tokens."""
    from specdemo.app.views.explain import explain_step
    from specdemo.app.views.trees import tree_figure

    data = TreeStep(  # the root 5; 7 and 8 below it, 9 below 7, 4 below 9
        tree=Proposal((7, 8, 9, 4), (-1, -1, 0, 2), tuple(sources)), root_token=5,
        accepted_path=[0, 2, 3], best_candidate=[0, 2, 3], gamma=3, target_token=6,
    )
    step = StepEvent(method="speculative", step=0, committed=(7, 9, 4, 6), proposed=(7, 8, 9, 4), accepted=(7, 9, 4),
                     data=data)
    figure = tree_figure(step, str)
    assert list(figure.data[-1].marker.symbol) == ["circle"] * (5 - len(symbols)) + symbols
    # the key names each mark in the headline's words; a node's hover says where it came from
    assert title in figure.layout.title.text and "■</span> copied" in figure.layout.title.text \
        and "◆</span> retrieved" in figure.layout.title.text
    meanings = [meaning for _, meaning in figure.data[-1].customdata]
    assert meanings.count("copied from the text") == sources.count("copy")
    assert meanings.count("from earlier answers") == sources.count("retrieved")
    text = explain_step(step, str)
    assert "for 3 tokens" in text and all(words in text for words in said) \
        and not any(words in text for words in unsaid), text


def test_children_to_fill_a_tree_of_a_given_size():
    """A tree 2 levels deep holds top_k + top_k^2 nodes at most: 7 slots need 3 children per node
    (the compiled path's padded slot, tests/test_static.py); an asked top_k that suffices is kept."""
    assert [draft_tree.children_to_fill(size, 2, 2) for size in (4, 6, 7, 12, 13)] == [2, 2, 3, 3, 4]
    assert draft_tree.children_to_fill(8, 1, 2) == 8 and draft_tree.children_to_fill(8, 3, 2) == 2 \
        and draft_tree.children_to_fill(1, 1, 1) == 1


@pytest.mark.parametrize("depth,top_k,size", [(4, 3, 7), (6, 2, 5), (5, 3, 12), (3, 1, 2)])
def test_grow_skips_only_nodes_the_rerank_would_drop(tiny_model, prompt_ids, depth, top_k, size):
    """Growing skips a node whose value is at or below the `size` best so far (none of its
    children could be kept): the tree is the brute force's, the whole tree grown and then
    reranked, with no more draft passes."""
    draft = Draft("other", tiny_model)
    for prefix in (prompt_ids[:, :2], prompt_ids[:, :4], prompt_ids, prompt_ids.flip(-1)):
        whole, whole_passes = draft_tree.grow(draft, DynamicCache(config=tiny_model.config), prefix, None,
                                              depth=depth, top_k=top_k, size=10**6)
        brute = draft_tree.best_nodes(whole, size)
        tree, passes = draft_tree.grow(draft, DynamicCache(config=tiny_model.config), prefix, None, depth=depth,
                                       top_k=top_k, size=size)
        assert (tree.tokens, tree.parents, tree.depths) == (brute.tokens, brute.parents, brute.depths)
        assert tree.scores == pytest.approx(brute.scores, abs=1e-5)
        assert passes < whole_passes == depth  # a random draft is unsure: levels were skipped


def test_kept_value_is_the_size_th_best():
    assert draft_tree.kept_value([-1.0, -3.0, -2.0], 2) == -2.0
    assert draft_tree.kept_value([-1.0, -3.0], 3) == float("-inf")


@pytest.mark.parametrize("draft_kind", ["token", "feature"])
def test_a_second_level_queued_ahead_grows_the_tree_fed_a_level_at_a_time(tiny_model, prompt_ids, draft_kind):
    """`grow` queues the second level, and its best children, for every child of the root before it
    reads the first; the tree equals the one grown a level at a time, feeding each level only the
    nodes it expands, also where a child of the root ends the answer or falls below what the rerank
    keeps (not expanded, its row unread) and a third level looks back at the second level's branches."""
    draft = Draft("other", tiny_model) if draft_kind == "token" else feature_draft(tiny_model)
    features = None if draft_kind == "token" else torch.randn(1, prompt_ids.shape[1] - 1, tiny_model.config.hidden_size)
    root_children = draft_tree.grow(draft, DynamicCache(config=tiny_model.config), prompt_ids, features, depth=1,
                                    top_k=3, size=3)[0].tokens
    for eos, size in [((), 10**6), ((root_children[1],), 10**6), ((), 2), ((), 5)]:
        tree, passes = draft_tree.grow(draft, DynamicCache(config=tiny_model.config), prompt_ids, features, depth=3,
                                       top_k=3, size=size, eos=eos)
        cache = DynamicCache(config=tiny_model.config)
        logits, state = draft_tree.first_logits(draft, cache, prompt_ids, features)
        prefix, fed = cache.get_seq_length(), []

        def level_logits(tree, nodes, tokens, states, level, cache=cache, prefix=prefix, fed=fed):
            sees = draft_tree.branch_visibility(tree, fed, nodes)
            fed.extend(nodes)
            return draft_tree.branch_logits(draft, cache, tokens, states, sees=sees,
                                            position_ids=np.full(len(nodes), prefix + level - 2))

        reference, reference_passes = draft_tree.expand(draft.token_ids, logits, state, level_logits, depth=3,
                                                        top_k=3, size=size, eos=eos)
        assert (tree.tokens, tree.parents) == (reference.tokens, reference.parents) and passes == reference_passes
        assert tree.scores == pytest.approx(reference.scores, abs=1e-5)
        if size > 100:
            assert passes == 3 and sum(1 for node in range(tree.size) if tree.parents[node] == 1) == (0 if eos else 3)
