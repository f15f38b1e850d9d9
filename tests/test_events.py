"""`events.guesses_by_source`: which guessed tokens a method fed, and which the target accepted."""

import pytest

from specdemo.core.events import StepEvent, Summary, final_summary, guesses_by_source
from specdemo.core.steps import LookaheadStep, TreeStep
from specdemo.core.verify import Proposal
from specdemo.methods import lookahead, speculative
from tests.test_eagle import feature_draft


def tree_event(sources, parents, depths, path):
    tree = Proposal(tuple(range(10, 10 + len(sources))), tuple(parents), tuple(sources))
    assert tree.depths == tuple(depths)
    data = TreeStep(tree=tree, root_token=9, accepted_path=path, best_candidate=path)
    return StepEvent(method="medusa", step=1, committed=(1,), data=data)


def test_a_tree_counts_each_node_by_its_source_and_depth():
    # heads 0, 1 at depth 1 below the root; head 2 under 0; a copy 3 -> 4 under the root; the path 0 -> 2
    event = tree_event(["head", "head", "head", "copy", "copy"], [-1, -1, 0, -1, 3], [1, 1, 2, 1, 2], [0, 2])
    lookahead_event = StepEvent(method="lookahead", step=2, committed=(1,), data=LookaheadStep(
        window=[[5, 6], [7, 8]], new_level=[9, 9], candidates=[[1, 2, 3], [4, 5]], candidate_sources=["copy", "pool"],
        candidate_accept_lengths=[0, 2], best_candidate=1, accept_length=2, pool_size=3))
    summary = Summary(method="medusa", tokens=(1,), finish_reason="length", steps=2, target_forwards=2)
    assert guesses_by_source([event, lookahead_event, StepEvent(method="ar", step=0, committed=(1,)), summary]) == {
        "head": {"fed": [2, 1], "accepted": [1, 1]},
        "copy": {"fed": [2, 2, 1], "accepted": [0, 0, 0]},
        "window": {"fed": [1, 2, 1], "accepted": [0, 0, 0]},  # column c of level l sits c + l + 1 ahead
        "pool": {"fed": [1, 1], "accepted": [1, 1]},
    }


@pytest.mark.parametrize("method", ["speculative", "lookahead"])
def test_the_counts_add_up_to_what_the_summary_says(tiny_model, prompt_ids, method):
    """Every token a pass proposed is counted once under its source, every accepted one once more."""
    if method == "speculative":
        events = list(speculative.generate(tiny_model, prompt_ids, draft=feature_draft(tiny_model), max_new_tokens=40,
                                           gamma=3, draft_tree_size=8, eos_token_ids=()))
    else:
        events = list(lookahead.generate(tiny_model, prompt_ids, max_new_tokens=40, eos_token_ids=()))
    summary, counts = final_summary(events), guesses_by_source(events)
    windows = sum(len(level) for event in events[:-1] if isinstance(event.data, LookaheadStep)
                  for level in event.data.window)
    assert sum(sum(c["fed"]) for c in counts.values()) == summary.proposed + windows
    assert sum(sum(c["accepted"]) for c in counts.values()) == summary.accepted > 0
