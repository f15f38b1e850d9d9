"""Trees as pictures: a step's candidate tree (Medusa's, or the draft's), its tree attention mask, and
beam search's beams, drawn as the other figures are (`figures`): a node a token, its word cut where it
would reach the next column's markers (`figures.cell_text`) and whole on hover, its line breaks as ↵."""

from collections import Counter
from collections.abc import Callable

import plotly.graph_objects as go

from specdemo.app.views.explain import GUESSED
from specdemo.app.views.figures import COLOURS, cell_text, compact, keyed_title, swiped, titled
from specdemo.app.views.html import apart
from specdemo.core.events import StepEvent
from specdemo.core.steps import TreeStep

# of a node's 12-pixel word, across a tree's depths or a beam figure's steps: more would reach the next column's markers
TREE_CHARACTERS = 60


# symbol, key mark, meaning
MARKS = {"copy": ("square", "■", "copied from the text"), "retrieved": ("diamond", "◆", "from earlier answers")}

TREE_KEY = (  # the tree's nodes, in words under its title: short, as in its headline (the hover says more)
    (COLOURS["accepted"], "●", "accepted"), (COLOURS["rejected"], "●", "rejected"),
    ("#9aa0a6", "○", "not on the best branch"),
    *(("#5f6368", mark, GUESSED[source][0]) for source, (_, mark, _) in MARKS.items()),
)


def rooted(data: TreeStep) -> tuple[list[int], list[int], list[int], set[int], set[int]]:
    """A step's tree as the pictures draw it, the root as node 0 (as in Medusa's figures) and the
    proposal's node i as node i + 1: tokens, parents (-1: none), depths (0: the root), and the nodes
    of the accepted path and of the best candidate, the root among them."""
    drawn = lambda nodes: {0, *(node + 1 for node in nodes)}  # noqa: E731
    tree = data.tree
    return ([data.root_token, *tree.tokens], [-1, *(parent + 1 for parent in tree.parents)], [0, *tree.depths],
            drawn(data.accepted_path), drawn(data.best_candidate))


def tree_figure(event: StepEvent, decode: Callable[[int], str], headline: str | None = None) -> go.Figure:
    """One step's candidate tree (Medusa's, or speculative decoding's draft tree): a node per token (depth left to
    right), edges to parents, the accepted path in green and the rest of the best candidate in red."""
    data = event.data
    tokens, parents, depths, accepted, best = rooted(data)
    rejected = best - accepted
    rows: dict[int, int] = {}
    y = []
    for depth in depths:  # nodes come ordered by depth: stack each depth's nodes downwards
        y.append(-rows.get(depth, 0))
        rows[depth] = rows.get(depth, 0) + 1
    figure = go.Figure()
    for node, parent in enumerate(parents):
        if parent >= 0:
            on_path = node in accepted
            figure.add_scatter(
                x=[depths[parent], depths[node]], y=[y[parent], y[node]], mode="lines", showlegend=False,
                hoverinfo="skip",
                line=dict(color=COLOURS["accepted"] if on_path else "#c4c7cc", width=3 if on_path else 1),
            )
    colour = [COLOURS["accepted"] if n in accepted else COLOURS["rejected"] if n in rejected else COLOURS["waiting"]
              for n in range(len(tokens))]
    marks = [None, *(MARKS.get(source) for source in data.tree.sources)]  # node 0 is the root
    words = [apart(decode(t)) for t in tokens]
    figure.add_scatter(  # a word cut where it would reach the next depth's marker; the hover shows it whole
        x=depths, y=y, mode="markers+text", text=[cell_text(word, len(rows), TREE_CHARACTERS) for word in words],
        textposition="middle right", showlegend=False,
        marker=dict(size=14, color=colour, symbol=[m[0] if m else "circle" for m in marks],
                    line=dict(color="#5f6368", width=1)),
        customdata=[[word, m[2] if m else ""] for word, m in zip(words, marks, strict=True)],
        hovertemplate="%{customdata[0]} %{customdata[1]}<extra></extra>",
    )
    counts = Counter(data.tree.sources)  # short: the title must fit a half-width plot (its label names the tree)
    copies = "".join(f", {counts[source]} {GUESSED[source][0]} {mark}"
                     for source, (_, mark, _) in MARKS.items() if counts[source])
    headline = headline or f"Step {event.step + 1}: {data.tree.size} nodes{copies}, {data.accept_length} accepted"
    figure.update_layout(
        title=keyed_title(headline, list(TREE_KEY)),
        xaxis=dict(title="depth (tokens ahead of the last committed one)", dtick=1), yaxis=dict(visible=False),
    )
    # a row of 22 pixels for each node of the fullest depth: a GPU's wider trees stack 16 or more there
    return swiped(titled(compact(figure), 15 + 22 * max(rows.values())))


def tree_mask_figure(event: StepEvent, decode: Callable[[int], str]) -> go.Figure:
    """The tree attention mask of a Medusa step: node i (row) sees node j (column) when j is i
    or one of its ancestors (Cai et al. 2024, Fig. 2)."""
    tokens, parents, _, _, _ = rooted(event.data)
    lineage = []  # per node, itself and its ancestors
    for node, parent in enumerate(parents):
        lineage.append({node, *(lineage[parent] if parent >= 0 else ())})
    sees = [[j in lineage[i] for j in range(len(parents))] for i in range(len(parents))]
    labels = [f"{i}:{apart(decode(t))}" for i, t in enumerate(tokens)]
    figure = go.Figure(go.Heatmap(z=[[int(v) for v in row] for row in sees], x=labels, y=labels, showscale=False,
                                  colorscale=[[0, "#ffffff"], [1, COLOURS["target"]]], xgap=1, ygap=1))
    figure.update_layout(title="Tree attention mask (row sees column)", yaxis_autorange="reversed")
    # a 12-pixel row a node, below the column labels: a GPU's trees of 30 or more nodes stay legible
    return compact(figure).update_layout(height=max(320, 180 + 12 * len(parents)))


BEAM_MARKERS = {  # a beam-search candidate's marker by its status
    "kept": dict(symbol="circle", size=12, color=COLOURS["target"], line=dict(color="#5f6368", width=1)),
    "finished": dict(symbol="square", size=12, color="#f4b400", line=dict(color="#5f6368", width=1)),
    "pruned": dict(symbol="circle-open", size=8, color="#b0b4ba"),
}


def beam_nodes(events: list[StepEvent]) -> list[dict]:
    """Every candidate of every beam-search step as a node: the event's candidate fields plus its
    place (x: step + 1, y: minus its rank that step), its parent's place (the prompt at (0, 0))
    and whether it lies on the chosen answer's path (only once the last event names the answer)."""
    chosen = events[-1].data.chosen if events else None
    nodes, beam_rows = [], {0: 0}  # beam_rows: the row of each beam of the previous step
    for event in events:
        next_rows = {}
        for rank, candidate in enumerate(event.data.beams):
            tokens = candidate["tokens"]
            on_path = chosen is not None and tokens == chosen[: len(tokens)]
            parent = (event.step, beam_rows.get(candidate["parent"], 0))
            nodes.append(candidate | {"x": event.step + 1, "y": -rank, "parent_xy": parent, "on_path": on_path})
            if candidate["beam"] is not None:
                next_rows[candidate["beam"]] = -rank
        beam_rows = next_rows
    return nodes


BEAM_STEPS_SHOWN = 8  # a beam figure's steps: in half a 1280-pixel page, a column holds a word of 6 characters


def beam_figure(events: list[StepEvent], decode: Callable[[int], str]) -> go.Figure:
    """Beam search so far as a tree: one column per step, each candidate under the beam it extends,
    kept beams filled, finished hypotheses as squares, pruned candidates hollow and grey; once the
    run is done, the chosen answer's path in green. A long run shows its last BEAM_STEPS_SHOWN steps,
    each word cut to its column (`cell_text`); hover shows it whole, with its log-probability and score."""
    nodes = beam_nodes(events)
    figure = go.Figure()
    edges = {  # name: (the nodes whose edge to their parent it draws, line style)
        "pruned": ([n for n in nodes if n["status"] == "pruned"], dict(color="#dadce0", width=1, dash="dot")),
        "beam": ([n for n in nodes if n["status"] != "pruned"], dict(color="#9aa0a6", width=1.5)),
        "chosen path": ([n for n in nodes if n["on_path"]], dict(color=COLOURS["accepted"], width=4)),
    }
    for group, line in edges.values():
        x = [x for n in group for x in (n["parent_xy"][0], n["x"], None)]  # None: a break between edges
        y = [y for n in group for y in (n["parent_xy"][1], n["y"], None)]
        figure.add_scatter(x=x, y=y, mode="lines", line=line, hoverinfo="skip", showlegend=False)
    figure.add_scatter(x=[0], y=[0], mode="markers+text", text=["prompt"], textposition="bottom center",  # in the plot
                       showlegend=False, marker=dict(size=12, color=COLOURS["ar"]), hoverinfo="skip")
    # a long run's labels would overlap: its last steps, room to their right for the last labels
    last = len(events)
    first = last - BEAM_STEPS_SHOWN + 1 if last > BEAM_STEPS_SHOWN else 0  # the first step shown
    columns = last - first + 2  # the steps shown, and the prompt's column or the room right of the last
    for status, marker in BEAM_MARKERS.items():
        group = [n for n in nodes if n["status"] == status]
        words = [apart(decode(n["token"])) for n in group]
        figure.add_scatter(  # a word cut where it would reach the next step's markers, none left of the first shown
            x=[n["x"] for n in group], y=[n["y"] for n in group], mode="markers+text", name=status, marker=marker,
            text=[cell_text(word, columns, TREE_CHARACTERS) if n["x"] >= first else ""
                  for n, word in zip(group, words, strict=True)],
            textposition="middle right", textfont=dict(color="#9aa0a6", size=10) if status == "pruned" else None,
            customdata=[[word, n["log_prob"], n["score"]] for n, word in zip(group, words, strict=True)],
            hovertemplate="%{customdata[0]}<br>log p %{customdata[1]:.3f}, "
                          "score %{customdata[2]:.3f}<extra>" + status + "</extra>",
        )
    path = [n for n in nodes if n["on_path"]]
    figure.add_scatter(x=[n["x"] for n in path], y=[n["y"] for n in path], mode="markers", name="chosen path",
                       hoverinfo="skip",
                       marker=dict(symbol="circle-open", size=20, color=COLOURS["accepted"], line=dict(width=3)))
    k = events[-1].data.num_beams if events else 0
    notes = [f"the last {BEAM_STEPS_SHOWN} shown"] if first else []
    notes += ["done: the chosen answer in green"] if path else []
    span = dict(range=[first - 0.5, last + 1.5]) if first else {}
    figure.update_layout(title=f"Beam search, {k} beams: {len(events)} steps<br><sup>{'; '.join(notes)}</sup>",
                         xaxis=dict(title="step (target pass)", dtick=1, **span),
                         yaxis=dict(visible=False), legend=dict(orientation="h", y=-0.25))
    rows = max((len(e.data.beams) for e in events), default=1)
    return swiped(titled(compact(figure), 25 + 24 * rows))
