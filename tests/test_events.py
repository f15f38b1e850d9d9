"""`events.guesses_by_source`: which guessed tokens a method fed, and which the target accepted."""

import pytest

from specdemo.core.events import StepEvent, Summary, final_summary, guesses_by_source
from specdemo.core.steps import LookaheadStep, TreeStep
from specdemo.methods import lookahead, speculative
from tests.test_eagle import feature_draft


def tree_event(sources, parents, depths, path):
    tokens = list(range(10, 11 + len(sources)))
    data = TreeStep(tree_tokens=tokens, tree_parents=parents, tree_depths=depths, tree_sources=sources,
                    accepted_path=path, best_candidate=path, accept_length=len(path) - 1)
    return StepEvent(method="medusa", step=1, committed=(1,), data=data)


def test_a_tree_counts_each_node_by_its_source_and_depth():
    # root 0; heads 1, 2 at depth 1; head 3 under 1; a copy 4 -> 5 under the root; the path 0 -> 1 -> 3
    event = tree_event(["head", "head", "head", "copy", "copy"], [-1, 0, 0, 1, 0, 4], [0, 1, 1, 2, 1, 2], [0, 1, 3])
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
