"""Which pictures a run gets, by its payload's kind: for its latest event, its best pass and Step through's step 0."""

from collections.abc import Callable

import plotly.graph_objects as go

from specdemo.app.views.explain import counted
from specdemo.app.views.figures import (
    acceptance_by_position_figure,
    contrastive_figure,
    jacobi_blocks,
    pool_figure,
    step_timeline_figure,
    trajectory_figure,
)
from specdemo.app.views.html import lookahead_html
from specdemo.app.views.trees import beam_figure, tree_figure, tree_mask_figure
from specdemo.core.events import StepEvent, acceptance_by_position
from specdemo.core.steps import BeamStep, ChainStep, ContrastiveStep, JacobiStep, LookaheadStep, SamplingCheck, TreeStep


def method_pictures(events: list[StepEvent], decode: Callable[[int], str]) -> dict:
    """The method's own pictures after its latest event, by the kind of its payload: a figure (or
    None) per plot of the page, and an HTML view."""
    pictures = {"timeline": None, "detail": None, "trajectory": None, "tree": None, "best": None, "html": ""}
    if not events:
        return pictures
    event, data = events[-1], events[-1].data
    pictures["timeline"] = step_timeline_figure(events)
    pictures["best"], best_html = best_pictures(events, decode)
    if isinstance(data, JacobiStep):
        pictures["trajectory"] = trajectory_figure(jacobi_blocks(events)[-1], decode)
    elif isinstance(data, LookaheadStep):
        pictures["detail"], pictures["html"] = (pool_figure(events),
                                                best_html + f"<h4>The latest pass</h4>{lookahead_html(event, decode)}")
    elif isinstance(data, BeamStep):
        pictures["detail"] = beam_figure(events, decode)
    elif isinstance(data, ContrastiveStep):
        pictures["detail"] = contrastive_figure(event, decode)
    elif isinstance(data, TreeStep) and data.proposer == "heads":
        pictures["tree"], pictures["detail"] = tree_figure(event, decode), tree_mask_figure(event, decode)
    elif isinstance(data, (ChainStep, SamplingCheck, TreeStep)) and data.proposer == "draft":
        pictures["detail"] = acceptance_by_position_figure(acceptance_by_position(events))
        # a last one-token pass drafts none
        drafted_tree = next((e for e in reversed(events) if isinstance(e.data, TreeStep)), None)
        if drafted_tree is not None:
            pictures["tree"] = tree_figure(drafted_tree, decode)
    return pictures


# ----- Representative pictures: the pass that committed the most -----

def best_event(events: list[StepEvent]) -> StepEvent:
    """The pass that committed the most tokens (the first such): a run's best moment, where the
    latest pass may have committed only one."""
    return max(events, key=lambda event: len(event.committed))


BEST = "The pass that committed the most"


def best_pictures(events: list[StepEvent], decode: Callable[[int], str]) -> tuple[go.Figure | None, str]:
    """A figure (and HTML) of the run's best pass for the methods whose pictures show one pass:
    Medusa's and the draft's trees, the Jacobi block, lookahead's window. (None, "") otherwise."""
    proposing = [e for e in events if e.proposed]
    if not proposing:
        return None, ""
    best = best_event(proposing)
    data, tokens = best.data, counted(len(best.committed), "token", "tokens")
    if isinstance(data, TreeStep):
        return tree_figure(best, decode, f"{BEST}: step {best.step + 1}, {tokens}"), ""
    if isinstance(data, JacobiStep):
        block = next(b for b in jacobi_blocks(events) if best in b)
        return trajectory_figure(block, decode, above=f"{BEST}: step {best.step + 1}, {tokens}"), ""
    if isinstance(data, LookaheadStep):
        return None, (f"<h4>{BEST} (step {best.step + 1}, {tokens})</h4>"
                      f"{lookahead_html(best, decode)}")
    return None, ""


def before_pictures(events: list[StepEvent], decode: Callable[[int], str]) -> dict:
    """Step through's step 0, before the first target pass: nothing is committed; a Jacobi run
    shows its initial guess, the block its first pass will refine."""
    pictures = method_pictures([], decode)
    if events and isinstance(events[0].data, JacobiStep):
        pictures["trajectory"] = trajectory_figure(jacobi_blocks(events)[0], decode, before=True)
    return pictures
