"""Visual builders: pure functions from step events to HTML, figures and words, testable without a browser.

`html` draws the streamed answer and the page's tables, `figures` the plots, `pictures` picks a
run's figures by the kind of its payload, and `explain` says in words what a step did. The page
calls them here, as `views.<name>`.
"""

from specdemo.app.views.explain import (
    cllm_quality_html,
    divergence_sentence,
    explain_step,
    how_html,
    pass_cost_sentence,
)
from specdemo.app.views.figures import (
    REFINED,
    jacobi_blocks,
    needs_width,
    pass_cost_figure,
    race_figure,
    speed_figure,
    step_timeline_figure,
    trajectory_figure,
)
from specdemo.app.views.html import (
    PAGE_STYLE,
    answers_html,
    beats_html,
    legend_html,
    memory_cell,
    race_grid,
    race_note,
    race_table,
    replay_frames,
    stats_html,
    stream_html,
    token_origins,
)
from specdemo.app.views.pictures import BEST, before_pictures, best_event, method_pictures

__all__ = [
    "BEST",
    "PAGE_STYLE",
    "REFINED",
    "answers_html",
    "beats_html",
    "before_pictures",
    "best_event",
    "cllm_quality_html",
    "divergence_sentence",
    "explain_step",
    "how_html",
    "jacobi_blocks",
    "legend_html",
    "memory_cell",
    "needs_width",
    "method_pictures",
    "pass_cost_figure",
    "pass_cost_sentence",
    "race_figure",
    "race_grid",
    "race_note",
    "race_table",
    "replay_frames",
    "speed_figure",
    "stats_html",
    "step_timeline_figure",
    "stream_html",
    "token_origins",
    "trajectory_figure",
]
