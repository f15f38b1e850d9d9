"""The page's plots: pure functions from step events to plotly figures, each sharing the stream's colours and
showing a token's line breaks as the stream shows a guess's (`html.apart`): as ↵, never as a blank."""

from collections.abc import Callable

import plotly.graph_objects as go

from specdemo.app.views.explain import counted
from specdemo.app.views.html import INLINE_REJECTED_LIMIT, apart, own_origin
from specdemo.core.events import StepEvent

# Colours shared by the figures, matching the stream's origins.
COLOURS = {"accepted": "#34a853", "target": "#4a7bd0", "rejected": "#d9534f", "ar": "#9aa0a6", "waiting": "#e8eaed",
           "waiting_dark": "#bdc1c6"}
# Jacobi and lookahead guess many tokens every pass and keep refining them: not failures
REFINED = "guesses not yet right (refined next pass)"


def step_counts(event: StepEvent) -> dict[str, int]:
    """How many tokens of each origin one step produced (rejected: all the pass threw away)."""
    return {"accepted": len(event.accepted), own_origin(event): len(event.committed) - len(event.accepted),
            "rejected": len(event.rejected)}


# a legend in a row under the plot: at the right, as plotly puts it, it takes most of a phone's narrow figure
BELOW = {"orientation": "h", "y": -0.3}

# A title's key holds at most this many characters of 12 pixels, and its headline 60 of 17: longer, a line runs past
# a half-page plot's right edge on a 1024-pixel page (a classroom projector's), where the plot is 470 pixels wide.
KEY_CHARACTERS = 76


def keyed_title(headline: str, key: list[tuple[str, str, str]]) -> str:
    """`headline` over its key: entries (colour, mark, meaning) in one line of at most KEY_CHARACTERS."""
    entries = [f"<span style='color:{colour}'>{mark}</span> {meaning}" for colour, mark, meaning in key]
    return f"{headline}<br><sup>{' '.join(entries)}</sup>"


def title_margin(title: str) -> int:
    """The top margin, in pixels, that holds `title`: 24 for each of its lines, 18 for its key's."""
    headline, _, key = title.partition("<sup>")
    return 30 + 24 * (headline.count("<br>") + (not key)) + 18 * bool(key)


def step_timeline_figure(events: list[StepEvent]) -> go.Figure:
    """Per target pass, the tokens it accepted and supplied (up) and the proposals it threw away (down)."""
    figure = go.Figure()
    steps = [e.step + 1 for e in events]
    # Jacobi, CLLM, lookahead: many guesses a pass, by design
    refines = bool(events) and events[0].method in INLINE_REJECTED_LIMIT
    for origin in ("accepted", "target", "ar", "rejected"):
        counts = [step_counts(e).get(origin, 0) for e in events]
        if any(counts):
            sign = -1 if origin == "rejected" else 1
            name, colour = ((REFINED, COLOURS["waiting_dark"]) if refines and origin == "rejected"
                            else (origin, COLOURS[origin]))
            figure.add_bar(x=steps, y=[sign * c for c in counts], name=name, marker_color=colour)
    figure.update_layout(barmode="relative", title="Tokens per target pass", xaxis_title="step (target pass)",
                         yaxis_title="tokens", legend=BELOW)
    return compact(figure)


def acceptance_by_position_figure(acceptance_by_position: list[float]) -> go.Figure:
    """The share of steps in which draft position i was accepted: where a longer draft stops paying."""
    positions = list(range(1, len(acceptance_by_position) + 1))
    figure = go.Figure(go.Bar(x=positions, y=acceptance_by_position, marker_color=COLOURS["accepted"]))
    figure.update_layout(
        title="Acceptance by draft position", yaxis_title="accepted share", yaxis_range=[0, 1],
        # the positions drafted, no more
        xaxis=dict(title="draft position (a tree's depth)", dtick=1, range=[0.5, len(positions) + 0.5]),
    )
    return compact(figure)


TRAJECTORY_CHARACTERS = 64  # of the cells' 10-pixel text, across the grid: more would spill into a neighbour's cell
TRAJECTORY_STATES = ["not yet correct", "correct", "fast-forwarded", "fixed while its left neighbour was wrong"]
TRAJECTORY_KEY = ["not yet correct", "correct", "fast-forwarded", "fixed early"]  # the states, short for the title


def trajectory_cells(block_events: list[StepEvent]) -> list[list[int]]:
    """For one Jacobi block, the state (an index into TRAJECTORY_STATES) of each position at
    each iteration, from the flags of the block's last event."""
    correct_since = block_events[-1].data.correct_since
    fast = {p for e in block_events for p in e.data.fast_forwarded}
    early = {p for e in block_events for p in e.data.fixed_early}
    cells = []
    for event in block_events:
        iteration, row = event.data.iteration, []
        for position, since in enumerate(correct_since):
            if since is None or since > iteration:
                row.append(0)
            else:
                row.append(3 if position in early else 2 if position in fast else 1)
        cells.append(row)
    return cells


def jacobi_blocks(events: list[StepEvent]) -> list[list[StepEvent]]:
    """The events grouped by Jacobi block, in order."""
    blocks: dict[int, list[StepEvent]] = {}
    for event in events:
        blocks.setdefault(event.data.block_start, []).append(event)
    return list(blocks.values())


def trajectory_figure(block_events: list[StepEvent], decode: Callable[[int], str], before: bool = False,
                      above: str = "") -> go.Figure:
    """The Jacobi trajectory of one block as an iterations x positions grid (the CLLM blog's
    figure): each cell the token guessed there, coloured by whether it is already final. Row 0
    is the initial guess, row k the block after pass k. `before`: only the initial guess, before
    any pass has checked it (Step through's step 0). `above`: a title line above the block's."""
    if before:
        block_events = block_events[:1]
        cells = [[0] * len(block_events[0].data.state)]
    else:
        cells = trajectory_cells(block_events)
    tokens = [[apart(decode(t)) for t in e.data.state] for e in block_events]
    colours = [COLOURS["waiting"], "#a8dab5", COLOURS["accepted"], "#f4b400"]
    scale = [[i / 4 + edge / 4, colour] for i, colour in enumerate(colours) for edge in (0.0, 1.0)]
    figure = go.Figure(
        go.Heatmap(
            z=cells, text=[[cell_text(token, len(row)) for token in row] for row in tokens], texttemplate="%{text}",
            textfont=dict(size=10), zmin=-0.5, zmax=3.5, colorscale=scale, showscale=False, hovertext=tokens,
            customdata=[[TRAJECTORY_STATES[c] for c in row] for row in cells],
            hovertemplate="iteration %{y}, position %{x}: %{hovertext} (%{customdata})<extra></extra>",
        )
    )
    start = block_events[0].data.block_start
    tokens, passes = counted(len(cells[0]), "token", "tokens"), counted(len(cells), "pass", "passes")
    # short: the plot's label names the trajectory
    headline = (f"The block at token {start} before any pass: {tokens} guessed" if before
                else f"The block at token {start}: {passes} for {tokens}")
    headline = f"{above}<br>{headline}" if above else headline
    rows = ["initial guess", *(f"after pass {k}" for k in range(1, len(cells)))]
    figure.update_layout(
        title=keyed_title(headline, [(colour, "■", state) for colour, state in zip(colours, TRAJECTORY_KEY)]),
        xaxis_title="position in block", yaxis_autorange="reversed",
        yaxis=dict(tickvals=list(range(len(cells))), ticktext=rows, automargin=True),  # room for its row names
    )
    return swiped(titled(compact(figure), 24 * len(cells)))


def titled(figure: go.Figure, plotted: int) -> go.Figure:
    """`figure` with a top margin for its title's lines and a height that leaves `plotted` pixels
    between its margins (320 at least)."""
    top = title_margin(figure.layout.title.text)
    return figure.update_layout(margin=dict(t=top), height=max(320, top + figure.layout.margin.b + plotted))


def swiped(figure: go.Figure) -> go.Figure:
    """`figure` for a page that scrolls it sideways on a phone (`.specdemo-wide`): neither a drag nor
    the mode bar zooms it, so a swipe over it scrolls the page (a mouse's hover stays; a tap shows none)."""
    return figure.update_layout(dragmode=False).update_xaxes(fixedrange=True).update_yaxes(fixedrange=True)


def needs_width(figure: go.Figure | None) -> bool:
    """Whether `figure` keeps a computer's width on a phone, a swipe to the side: those drawn `swiped`
    (the Jacobi grid, the trees, the beams), whose words would overlap squeezed to a phone's width."""
    return figure is not None and figure.layout.dragmode is False


def cell_text(token: str, columns: int, characters: int = TRAJECTORY_CHARACTERS) -> str:
    """`token` as a grid of `columns` cells shows it: cut, with an ellipsis, where it would spill into
    its neighbours (`characters` fit the grid's width; the hover shows it whole)."""
    room = max(3, characters // max(columns, 1))
    if len(token) <= room:
        return token
    shown = token.strip()  # a leading space shows as nothing, yet takes a character's width
    return shown if len(shown) <= room else shown[: room - 1] + "…"


def speed_figure(events: list[StepEvent], baseline: list[StepEvent] | None = None, timed: bool = False) -> go.Figure:
    """Tokens committed against time for this run, and for the AR baseline on the same prompt: as
    they streamed, the page drawing them (a page's first run pays for more drawing than its later
    ones), or, `timed`, each side's timed run of median speed, undrawn: the runs the speedup is
    measured on, so the picture and the number agree."""
    figure = go.Figure()
    for name, run in ((events[0].method if events else "run", events), ("ar baseline", baseline or [])):
        if run:
            times, totals = cumulative_tokens(run)
            figure.add_scatter(x=times, y=totals, mode="lines", name=name, line_shape="hv")
    title = "Tokens over time: each side's timed run of median speed" if timed else "Tokens over time, as streamed"
    figure.update_layout(title=title, xaxis_title="seconds", yaxis_title="tokens committed", legend=BELOW)
    return compact(figure)


def cumulative_tokens(events: list[StepEvent]) -> tuple[list[float], list[int]]:
    times, totals, total = [0.0], [0], 0
    for event in events:
        total += len(event.committed)
        times.append(event.elapsed_s)
        totals.append(total)
    return times, totals


def compact(figure: go.Figure) -> go.Figure:
    figure.update_layout(height=320, margin=dict(l=50, r=20, t=50, b=45), template="plotly_white")
    return figure


def pool_figure(events: list[StepEvent]) -> go.Figure:
    """Lookahead's n-gram pool over the run: its size, and how many tokens each pass took from it."""
    steps = [e.step + 1 for e in events]
    figure = go.Figure()
    figure.add_bar(x=steps, y=[e.data.accept_length for e in events], name="tokens accepted from a candidate",
                   marker_color=COLOURS["accepted"])
    figure.add_scatter(x=steps, y=[e.data.pool_size for e in events], name="n-grams in the pool", yaxis="y2",
                       mode="lines")
    figure.update_layout(
        title="The n-gram pool", xaxis_title="step (target pass)", yaxis_title="accepted tokens",
        yaxis2=dict(title="pool size", overlaying="y", side="right"), legend=BELOW,
    )
    return compact(figure)


def contrastive_figure(event: StepEvent, decode: Callable[[int], str]) -> go.Figure:
    """One contrastive-decoding step (Li et al. 2023): the expert's and the amateur's log-probs of
    the expert's top candidates, the plausibility cut-off (log α + max log p_EXP) as a dashed line,
    candidates under it greyed, and a star over the chosen token, the best log p_EXP - log p_AMA."""
    data = event.data
    candidates = data.candidates
    positions = list(range(len(candidates)))  # token texts may repeat: place bars by index, label by text
    grey = lambda colour: [colour if c["plausible"] else "#d5d7db" for c in candidates]  # noqa: E731
    scores = [f"score {c['score']:.2f}" if c["plausible"] else "implausible" for c in candidates]
    figure = go.Figure()
    for name, key, colour in (("expert log p", "expert_logprob", COLOURS["target"]),
                              ("amateur log p", "amateur_logprob", "#f4b400")):
        figure.add_bar(
            x=positions, y=[c[key] for c in candidates], name=name, marker_color=grey(colour), customdata=scores,
            hovertemplate="%{y:.2f} (%{customdata})<extra>" + name + "</extra>",
        )
    chosen = next(i for i, c in enumerate(candidates) if c["token"] == data.chosen)
    figure.add_scatter(
        x=[chosen], y=[0], mode="markers+text", name="chosen", text=["chosen"], textposition="top center",
        marker=dict(symbol="star", size=16, color=COLOURS["accepted"]), hoverinfo="skip",
    )
    figure.add_hline(y=data.cutoff_logprob, line_dash="dash", line_color=COLOURS["rejected"],
                     annotation_text="plausibility cut-off")
    # the axis follows the expert's bars and the cut-off: an amateur bar far below them is cut
    # (its hover keeps the value)
    floor = min(min(c["expert_logprob"] for c in candidates), data.cutoff_logprob) - 4
    figure.update_layout(
        title=f"Step {event.step + 1}: chose {decode(data.chosen)!r}; the expert alone would take "
        f"{decode(data.expert_choice)!r}",
        barmode="group", yaxis=dict(title="log-probability", range=[floor, 1]), legend=dict(orientation="h", y=-0.25),
        xaxis=dict(tickvals=positions, ticktext=[apart(decode(c["token"])) for c in candidates]),
    )
    return compact(figure)


# ----- The race's ending: speedup and tokens per pass, with their spreads -----

def race_figure(results: list[dict]) -> go.Figure:
    """Bars of each raced method's speedup against AR (the median over its timed runs, whiskers
    from the slowest pairing to the fastest: `live.Spread`) and of its tokens per target pass
    (whiskers: the fewest and most over its runs). `results`: per method, in the race's order,
    {"method", "speedup" (a Spread), "tokens_per_pass": [one per run]}. AR against itself shows the noise."""
    from plotly.subplots import make_subplots

    methods = [r["method"] for r in results]
    figure = make_subplots(rows=1, cols=2, subplot_titles=("Speedup against AR<br>(median, whiskers: range)",
                                                           "Tokens per pass<br>(whiskers: range)"))
    medians = [r["speedup"].median for r in results]
    figure.add_bar(
        x=methods, y=medians, marker_color=[COLOURS["ar"] if m == "ar" else COLOURS["accepted"] for m in methods],
        showlegend=False,
        error_y=dict(type="data", symmetric=False, array=[r["speedup"].high - r["speedup"].median for r in results],
                     arrayminus=[r["speedup"].median - r["speedup"].low for r in results]),
        text=[f"{m:.2f}x" for m in medians], textposition="inside", insidetextanchor="start", row=1, col=1,
    )
    per_pass = [sorted(r["tokens_per_pass"]) for r in results]
    middle = [values[(len(values) - 1) // 2] for values in per_pass]
    figure.add_bar(
        x=methods, y=middle, marker_color=COLOURS["target"], showlegend=False, text=[f"{v:.2f}" for v in middle],
        textposition="inside", insidetextanchor="start",
        error_y=dict(type="data", symmetric=False, array=[v[-1] - m for v, m in zip(per_pass, middle)],
                     arrayminus=[m - v[0] for v, m in zip(per_pass, middle)]),
        row=1, col=2,
    )
    figure.add_hline(y=1, line_dash="dash", line_color="#5f6368", row=1, col=1)
    runs = min((r["speedup"].runs for r in results), default=0)
    # short, and the subplots' titles in two short lines and a smaller font: a phone's figure is a third as wide
    figure.update_layout(title=f"The race: {runs} timed run{'s' if runs != 1 else ''} of each")
    figure.update_annotations(font_size=12)
    return compact(figure).update_layout(margin=dict(t=100), height=360)


# ----- What one target pass costs by how many tokens it feeds -----

PASS_COST_TITLE = ("Checking more tokens is nearly free when the line is flat<br><sup>what one target pass costs by "
                   "the tokens it checks, against a pass of 1 token</sup>")


def pass_cost_figure(costs: dict[str, dict[int, float]]) -> go.Figure:
    """One line for each place the weights are (`costs`: {"in memory": {tokens fed: ms}, "offloaded": ...}),
    each pass's cost divided by that line's narrowest pass (a pass of 1 token, once measured), so
    the lines compare whatever their milliseconds; the milliseconds show on hover. A line for
    tokens costing a pass each would rise as steeply as the tokens fed; a flat line is the gain."""
    figure = go.Figure()
    for name, by_width in costs.items():
        widths = sorted(by_width)
        if not widths:
            continue
        unit = by_width[widths[0]]
        figure.add_scatter(x=widths, y=[by_width[w] / unit for w in widths], mode="lines+markers", name=name,
                           customdata=[by_width[w] for w in widths],
                           hovertemplate="%{x} tokens: %{y:.2f}x a 1-token pass (%{customdata:.1f} ms)")
    figure.add_hline(y=1, line_dash="dash", line_color="#5f6368")
    figure.update_layout(title=dict(text=PASS_COST_TITLE, font=dict(size=14)), xaxis_title="tokens checked in one pass",
                         yaxis_title="cost against a 1-token pass", xaxis_type="log", yaxis_rangemode="tozero")
    figure.update_xaxes(tickvals=sorted({w for by_width in costs.values() for w in by_width}))
    return compact(figure).update_layout(margin=dict(t=70))
