"""Visual builders: pure functions from step events to HTML (and figures), testable without a browser.

The streamed answer is one `<span class="tok" data-origin="...">` per token:
    ar        the target's next token in plain autoregressive decoding
    accepted  a proposed token (draft, tree, n-gram, Jacobi guess) the target confirmed
    target    the target's own token in a verification pass (its correction or bonus)
    rejected  a proposed token the pass threw away, struck through where it was rejected
Each token's tooltip names its step (target pass), and for speculative sampling the numbers of
the acceptance rule: p, q, min(1, p/q) and the uniform draw.
"""

import html
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import plotly.graph_objects as go

from specdemo.core.events import StepEvent, acceptance_by_position
from specdemo.core.steps import BeamStep, ChainStep, ContrastiveStep, JacobiStep, LookaheadStep, SamplingCheck, TreeStep

ORIGINS = {
    "ar": "autoregressive: the target's next token",
    "accepted": "proposed, and accepted by the target",
    "target": "the target's own token after verification (correction or bonus)",
    "rejected": "proposed, then rejected by the target",
}

# Jacobi guesses every position of a block each pass, lookahead verifies several n-grams:
# inline, only the guess the target's token replaced is struck through, so the text stays
# readable; the whole block or every candidate is in the method's own view.
ONE_TOKEN_METHODS = ("ar", "beam", "contrastive")  # the target's next tokens, no proposal to verify
INLINE_REJECTED_LIMIT = {"jacobi": 1, "cllm": 1, "lookahead": 1}

STYLE = """
<style>
.specdemo-stream { font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.7; }
.tok { border-radius: 3px; padding: 0 1px; }
.tok[data-origin="ar"] { background: #eef0f3; }
.tok[data-origin="accepted"] { background: #c7f0d2; }
.tok[data-origin="target"] { background: #c9dcff; }
.tok[data-origin="rejected"] { color: #b3261e; text-decoration: line-through; opacity: 0.65; font-size: 0.85em; }
.specdemo-legend .tok { margin-right: 0.8em; }
.specdemo-answer-only .specdemo-stream .tok[data-origin="rejected"] { display: none; }
.specdemo-answer-only .specdemo-stream .tok { background: none; }
.tok[data-current] { outline: 2px solid #f4b400; outline-offset: 1px; }
.specdemo-answer-only .specdemo-stream .tok[data-current] { outline: none; }
</style>
"""


def token_origins(event: StepEvent) -> list[tuple[int, str, str]]:
    """(token, origin, tooltip) for one step, in display order: the accepted proposals, the
    rejected ones (where they were rejected), then the target's own tokens."""
    step = f"step {event.step + 1}"
    accepted = len(event.accepted)
    shown_rejected = event.rejected[: INLINE_REJECTED_LIMIT.get(event.method, len(event.rejected))]
    numbers = sampling_numbers(event)
    out = [(t, "accepted", step + numbers.get(i, "")) for i, t in enumerate(event.committed[:accepted])]
    out += [(t, "rejected", step + numbers.get(accepted + i, "")) for i, t in enumerate(shown_rejected)]
    out += [(t, own_origin(event), step) for t in event.committed[accepted:]]
    return out


def own_origin(event: StepEvent) -> str:
    """The origin of the target's own committed tokens: `ar` for a method without proposals to
    verify, `target` (a correction or bonus token) for the others."""
    return "ar" if event.method in ONE_TOKEN_METHODS else "target"


def sampling_numbers(event: StepEvent) -> dict[int, str]:
    """Per draft position, the acceptance rule's numbers (speculative sampling only)."""
    data = event.data
    if not isinstance(data, SamplingCheck):
        return {}
    return {
        i: f": p={p:.3f}, q={q:.3f}, min(1, p/q)={a:.3f}, draw={r:.3f}"
        for i, (p, q, a, r) in enumerate(zip(data.p, data.q, data.acceptance, data.draws))
    }


def stream_html(
    events: Iterable[StepEvent], decode: Callable[[int], str], decode_tokens: Callable[[list[int]], str] | None = None, current: bool = False
) -> str:
    """The answer so far, every token a span coloured by its origin. With `decode_tokens`, a
    committed token shows what it adds to the text (`committed_texts`), so a character split
    over several tokens is whole; a rejected one is never part of the text and shows alone, its
    line breaks as ↵: a rejected newline must not break the answer's lines. `current`: the last
    event's tokens are outlined (`data-current`), as Step through shows the step it explains."""
    events = list(events)
    committed = [token for event in events for token in event.committed]
    texts = iter(committed_texts(committed, decode_tokens) if decode_tokens else map(decode, committed))
    spans = []
    for index, event in enumerate(events):
        mark = " data-current" if current and index == len(events) - 1 else ""
        for token, origin, tooltip in token_origins(event):
            text = html.escape(apart(decode(token)) if origin == "rejected" else next(texts))
            spans.append(f'<span class="tok" data-origin="{origin}"{mark} title="{html.escape(tooltip)}">{text}</span>')
    return f'{STYLE}<div class="specdemo-stream">{"".join(spans)}</div>'


def apart(text: str) -> str:
    """A token shown apart from the answer's text (rejected, or a guess): its line breaks as ↵, so it never breaks the answer's lines."""
    return text.replace("\n", "↵")


INCOMPLETE = "\ufffd"  # what decoding shows for the first bytes of a character split over tokens


def committed_texts(tokens: list[int], decode_tokens: Callable[[list[int]], str], context: int = 4) -> list[str]:
    """Per token, the text it adds to the answer: decoded after up to `context` tokens before it
    and minus what those decode to. A token that ends inside a character (byte-level BPE splits
    emoji and many non-Latin characters) adds "" and the token that completes it adds the whole
    character, as transformers' TextStreamer holds back text until it is printable."""
    texts, shown_to = [], 0  # tokens[:shown_to] are in the texts so far
    for end in range(1, len(tokens) + 1):
        start = max(0, shown_to - context)
        before, now = decode_tokens(tokens[start:shown_to]), decode_tokens(tokens[start:end])
        if now.endswith(INCOMPLETE) and end < len(tokens):
            texts.append("")
            continue
        texts.append(now[len(before) :] if now.startswith(before) else decode_tokens(tokens[shown_to:end]))
        shown_to = end
    return texts


def legend_html() -> str:
    """What the stream's colours mean, in words (not only on hover): one line per origin."""
    items = "".join(
        f'<div><span class="tok" data-origin="{origin}" title="{html.escape(text)}">{origin}</span> {html.escape(text)}</div>' for origin, text in ORIGINS.items()
    )
    return f'{STYLE}<div class="specdemo-legend">{items}</div>'


# Colours shared by the figures, matching the stream's origins.
COLOURS = {"accepted": "#34a853", "target": "#4a7bd0", "rejected": "#d9534f", "ar": "#9aa0a6", "waiting": "#e8eaed", "waiting_dark": "#bdc1c6"}
# Jacobi and lookahead guess many tokens every pass and keep refining them: not failures
REFINED = "guesses not yet right (refined next pass)"


def step_counts(event: StepEvent) -> dict[str, int]:
    """How many tokens of each origin one step produced (rejected: all the pass threw away)."""
    return {"accepted": len(event.accepted), own_origin(event): len(event.committed) - len(event.accepted), "rejected": len(event.rejected)}


def step_timeline_figure(events: list[StepEvent]) -> go.Figure:
    """Per target pass, the tokens it accepted and supplied (up) and the proposals it threw away (down)."""
    figure = go.Figure()
    steps = [e.step + 1 for e in events]
    refines = bool(events) and events[0].method in INLINE_REJECTED_LIMIT  # Jacobi, CLLM, lookahead: many guesses a pass, by design
    for origin in ("accepted", "target", "ar", "rejected"):
        counts = [step_counts(e).get(origin, 0) for e in events]
        if any(counts):
            sign = -1 if origin == "rejected" else 1
            name, colour = (REFINED, COLOURS["waiting_dark"]) if refines and origin == "rejected" else (origin, COLOURS[origin])
            figure.add_bar(x=steps, y=[sign * c for c in counts], name=name, marker_color=colour)
    figure.update_layout(barmode="relative", title="Tokens per target pass", xaxis_title="step (target pass)", yaxis_title="tokens")
    return compact(figure)


def acceptance_by_position_figure(acceptance_by_position: list[float]) -> go.Figure:
    """The share of steps in which draft position i was accepted: where a longer draft stops paying."""
    positions = list(range(1, len(acceptance_by_position) + 1))
    figure = go.Figure(go.Bar(x=positions, y=acceptance_by_position, marker_color=COLOURS["accepted"]))
    figure.update_layout(
        title="Acceptance by draft position", yaxis_title="accepted share", yaxis_range=[0, 1],
        xaxis=dict(title="draft position (a tree's depth)", dtick=1, range=[0.5, len(positions) + 0.5]),  # the positions drafted, no more
    )
    return compact(figure)


TRAJECTORY_STATES = ["not yet correct", "correct", "fast-forwarded", "fixed while its left neighbour was wrong"]


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


def trajectory_figure(block_events: list[StepEvent], decode: Callable[[int], str], before: bool = False) -> go.Figure:
    """The Jacobi trajectory of one block as an iterations x positions grid (the CLLM blog's
    figure): each cell the token guessed there, coloured by whether it is already final. Row 0
    is the initial guess, row k the block after pass k. `before`: only the initial guess, before
    any pass has checked it (Step through's step 0)."""
    if before:
        block_events = block_events[:1]
        cells = [[0] * len(block_events[0].data.state)]
    else:
        cells = trajectory_cells(block_events)
    text = [[decode(t) for t in e.data.state] for e in block_events]
    colours = [COLOURS["waiting"], "#a8dab5", COLOURS["accepted"], "#f4b400"]
    scale = [[i / 4 + edge / 4, colour] for i, colour in enumerate(colours) for edge in (0.0, 1.0)]
    figure = go.Figure(
        go.Heatmap(
            z=cells, text=text, texttemplate="%{text}", textfont=dict(size=10), zmin=-0.5, zmax=3.5, colorscale=scale, showscale=False,
            customdata=[[TRAJECTORY_STATES[c] for c in row] for row in cells],
            hovertemplate="iteration %{y}, position %{x}: %{text} (%{customdata})<extra></extra>",
        )
    )
    start = block_events[0].data.block_start
    key = " ".join(f"<span style='color:{colour}'>&#9632;</span> {state}" for colour, state in zip(colours, TRAJECTORY_STATES))
    title = (f"The initial guess of the block at token {start}: {len(cells[0])} tokens, before any pass" if before
             else f"Jacobi trajectory of the block at token {start}: {len(cells)} passes for {len(cells[0])} tokens")
    rows = ["initial guess", *(f"after pass {k}" for k in range(1, len(cells)))]
    figure.update_layout(
        title=f"{title}<br><sup>{key}</sup>", xaxis_title="position in block", yaxis_autorange="reversed",
        yaxis=dict(tickvals=list(range(len(cells))), ticktext=rows),
    )
    return compact(figure).update_layout(height=max(320, 60 + 26 * len(cells)))


CANDIDATE_SOURCES = {"copy": "copied from the text", "retrieved": "from earlier answers", "pool": "from the pool"}  # a lookahead candidate's origin, in words


def lookahead_html(event: StepEvent, decode: Callable[[int], str]) -> str:
    """One lookahead pass: the window (levels x columns), the candidates tried and what each matched."""
    data = event.data
    rows = "".join(
        f"<tr><th>level {level}</th>{''.join(f'<td>{html.escape(decode(t))}</td>' for t in tokens)}</tr>"
        for level, tokens in enumerate([*data.window, data.new_level])
    )
    tried = []
    for index, (candidate, length) in enumerate(zip(data.candidates, data.candidate_accept_lengths)):
        source = CANDIDATE_SOURCES.get(data.candidate_sources[index], data.candidate_sources[index])
        spans = "".join(
            f'<span class="tok" data-origin="{"accepted" if i < length else "rejected"}">{html.escape(decode(t))}</span>'
            for i, t in enumerate(candidate)
        )
        best = " (committed)" if index == data.best_candidate and length else ""
        tried.append(f"<li>{source}: {spans} &rarr; {length} matched{best}</li>")
    candidates = f"<ol>{''.join(tried)}</ol>" if tried else "<p>no n-gram in the pool starts with the last token</p>"
    return (
        f'{STYLE}<div class="specdemo-lookahead"><p>Step {event.step + 1}: the window '
        f"(the last row is this pass's new level; each column read downwards is an n-gram for the pool)</p>"
        f"<table>{rows}</table><p>Candidates verified in the same pass (pool size {data.pool_size}):</p>{candidates}</div>"
    )


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


def beam_figure(events: list[StepEvent], decode: Callable[[int], str]) -> go.Figure:
    """Beam search so far as a tree: one column per step, each candidate under the beam it extends,
    kept beams filled, finished hypotheses as squares, pruned candidates hollow and grey; once the
    run is done, the chosen answer's path in green. Hover shows each log-probability and score."""
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
    figure.add_scatter(x=[0], y=[0], mode="markers+text", text=["prompt"], textposition="middle left", showlegend=False,
                       marker=dict(size=12, color=COLOURS["ar"]), hoverinfo="skip")
    for status, marker in BEAM_MARKERS.items():
        group = [n for n in nodes if n["status"] == status]
        figure.add_scatter(
            x=[n["x"] for n in group], y=[n["y"] for n in group], mode="markers+text", name=status, marker=marker,
            text=[decode(n["token"]) for n in group], textposition="middle right",
            textfont=dict(color="#9aa0a6", size=10) if status == "pruned" else None,
            customdata=[[n["log_prob"], n["score"]] for n in group],
            hovertemplate="%{text}<br>log p %{customdata[0]:.3f}, score %{customdata[1]:.3f}<extra>" + status + "</extra>",
        )
    path = [n for n in nodes if n["on_path"]]
    figure.add_scatter(x=[n["x"] for n in path], y=[n["y"] for n in path], mode="markers", name="chosen path", hoverinfo="skip",
                       marker=dict(symbol="circle-open", size=20, color=COLOURS["accepted"], line=dict(width=3)))
    k = events[-1].data.num_beams if events else 0
    done = " (done: the chosen answer in green)" if path else ""
    figure.update_layout(title=f"Beam search, {k} beams: {len(events)} steps{done}", xaxis=dict(title="step (target pass)", dtick=1),
                         yaxis=dict(visible=False), legend=dict(orientation="h", y=-0.25))
    rows = max((len(e.data.beams) for e in events), default=1)
    return compact(figure).update_layout(height=max(320, 120 + 24 * rows))


def speed_figure(events: list[StepEvent], baseline: list[StepEvent] | None = None) -> go.Figure:
    """Tokens committed against time for this run, and for the AR baseline on the same prompt."""
    figure = go.Figure()
    for name, run in ((events[0].method if events else "run", events), ("ar baseline", baseline or [])):
        if run:
            times, totals = cumulative_tokens(run)
            figure.add_scatter(x=times, y=totals, mode="lines", name=name, line_shape="hv")
    figure.update_layout(title="Tokens over time", xaxis_title="seconds", yaxis_title="tokens committed")
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


def explain_step(event: StepEvent, decode: Callable[[int], str]) -> str:
    """One or two sentences that say what a step did, for the step-through mode: the sentence of
    its payload's kind (EXPLAIN), after what every step shares."""
    quoted = lambda tokens: " ".join(repr(decode(t)) for t in tokens)  # noqa: E731
    committed = len(event.committed)
    said = Said(quoted, quoted(event.committed[len(event.accepted) :]), f"{committed} token{'s' if committed != 1 else ''} committed in one target pass.")
    return f"Step {event.step + 1}: " + EXPLAIN.get(type(event.data), explain_one_token)(event, said, decode)


@dataclass(frozen=True)
class Said:
    """What every step's sentence may quote."""

    quoted: Callable  # token ids -> their quoted texts
    own: str  # the target's own tokens, quoted
    done: str  # "n tokens committed in one target pass."


def explain_one_token(event: StepEvent, said: Said, decode) -> str:
    return f"the target's next token is {said.own}: one token a pass, the baseline."


def explain_chain(event: StepEvent, said: Said, decode) -> str:
    if not event.proposed and event.data.proposer == "heads":
        return f"the prompt pass gave the target's first token {said.own}; the heads read its last hidden state to guess the tokens after it."
    if not event.proposed:  # a feature draft's first pass, or no room left to draft
        return (
            "nothing was drafted this pass (a feature draft drafts from the target's features, which its first pass computes; "
            f"an answer's last token leaves no room for a draft), so the target gave {said.own}, as AR would. {said.done}"
        )
    proposed, accepted = len(event.proposed), len(event.accepted)
    if accepted == proposed:
        verdict = f"the target accepted all {proposed} and added {said.own} of its own"
    else:
        verdict = f"the target agreed with the first {accepted}; it replaced the {ordinal(accepted + 1)} ({said.quoted(event.rejected[:1])}) with {said.own}"
    return f"the draft proposed {proposed} tokens ({said.quoted(event.proposed)}); {verdict}. {said.done}"


def explain_tree(event: StepEvent, said: Said, decode) -> str:
    data, accepted = event.data, f"{len(event.accepted)} ({said.quoted(event.accepted) or 'none'})"
    grown, taken = copied_clauses(data)
    if data.proposer == "heads":
        chosen = " (the paths they were surest of at this step)" if data.tree_kind == "dynamic" else ""
        return (
            f"the heads proposed a tree of {data.tree_sources.count('head')} candidate tokens{chosen}{grown}, checked in one pass with tree "
            f"attention; the deepest path the target agreed with has {accepted}{taken}, then the target added {said.own}. {said.done}"
        )
    return (
        f"the draft grew a tree of {data.tree_sources.count('draft')} tokens, keeping the branches it found likeliest{grown}, "
        f"{data.gamma} deep in all; the target checked every branch in one pass and followed one for "
        f"{len(event.accepted)} token(s) ({said.quoted(event.accepted) or 'none'}){taken}, then added {said.own}. {said.done}"
    )


def explain_jacobi(event: StepEvent, said: Said, decode) -> str:
    return (
        f"iteration {event.data.iteration} of the block at token {event.data.block_start}: {len(event.proposed)} guesses refined "
        f"at once; the first {len(event.accepted)} were already what the target predicts, so they are final, and the target's "
        f"token after them ({said.own}) too. {said.done}"
    )


def explain_lookahead(event: StepEvent, said: Said, decode) -> str:
    tried = len(event.data.candidates)
    best = f"the best matched {event.data.accept_length} token(s) ({said.quoted(event.accepted)})" if tried else "none to try"
    return (
        f"the same pass advanced the window by one level and verified {tried} candidate n-gram(s) from the pool; "
        f"{best}, then the target added {said.own}. {said.done} The pool now holds {event.data.pool_size} n-grams."
    )


def explain_beam_step(event: StepEvent, said: Said, decode) -> str:
    quoted, beams = said.quoted, event.data.beams
    kept = [beam for beam in beams if beam["status"] == "kept"]
    pruned = sum(beam["status"] == "pruned" for beam in beams)
    best = max(kept or beams, key=lambda beam: beam["log_prob"])
    settled = f"all beams now agree on {quoted(event.committed)}, so it is final" if event.committed else "the beams still disagree, so nothing is final yet"
    return (
        f"all {event.data.num_beams} beams ran in one batched pass; of their {len(beams)} best continuations {len(kept)} were kept, "
        f"{pruned} pruned{', and some finished' if len(kept) + pruned < len(beams) else ''}. The best beam ends in {quoted(best['tokens'][-1:])} "
        f"(log-probability {best['log_prob']:.2f}); {settled}."
    )


def explain_contrastive_step(event: StepEvent, said: Said, decode: Callable[[int], str]) -> str:
    data = event.data
    by_token = {candidate["token"]: candidate for candidate in data.candidates}
    chosen, expert = by_token[data.chosen], by_token.get(data.expert_choice)
    text = f"the expert and the amateur each ran one pass; {decode(data.chosen)!r} won with log p_expert − log p_amateur = {chosen['score']:.2f}"
    if data.expert_choice != data.chosen and expert is not None:
        text += (
            f", although the expert alone preferred {decode(data.expert_choice)!r}: the amateur liked that one too "
            f"(log p_amateur {expert['amateur_logprob']:.2f}), so its score was only {expert['score']:.2f}"
        )
    else:
        text += ", the expert's own favourite too"
    implausible = sum(not candidate["plausible"] for candidate in data.candidates)
    return text + f". {implausible} of the top candidates fell below the plausibility cut-off and could not win."


EXPLAIN = {  # a step's sentence, by the kind of its payload (AR's steps carry none)
    ChainStep: explain_chain,
    SamplingCheck: explain_chain,
    TreeStep: explain_tree,
    JacobiStep: explain_jacobi,
    LookaheadStep: explain_lookahead,
    BeamStep: explain_beam_step,
    ContrastiveStep: explain_contrastive_step,
}


def divergence_sentence(found, dtype: str, decode: Callable[[int], str], suspect_margin: float) -> str:
    """One sentence on why an answer first differs from AR's (`divergence.Divergence`): a
    near-tie that the dtype's rounding flipped, or a margin too wide for rounding (a possible bug)."""
    chosen, other = repr(decode(found.ar_token)), repr(decode(found.other_token))
    where = f"At token {found.position}, AR chose {chosen} and this method {other}."
    if found.margin > suspect_margin or dtype == "float32":
        return (f"{where} AR preferred {chosen} by {found.margin:.2f} in logit, more than {dtype} rounding moves a logit "
                f"(up to {suspect_margin} measured): this may be a bug; please report the prompt.")
    wide = (f" A pass over many tokens at once even preferred {other}." if found.wide_gap < 0 else "")
    gap = "tied in logit (less than 0.005 apart)" if found.top_two < 0.005 else f"only {found.top_two:.2f} apart in logit"
    return (f"{where} AR's two likeliest tokens here were {gap}. {dtype} rounds a pass "
            f"of many tokens differently from a pass of one, which flipped this near-tie.{wide} In float32 the answers are equal.")


def cllm_quality_html(quality: dict | None) -> str:
    """The CLLM's quality check (`training.cllm_quality`) in words, shown beside its answer."""
    if not quality:
        return ""
    bigrams, nll, bounds = quality["distinct_bigrams"], quality["nll_ratio"], quality["bounds"]
    verdict = "within" if quality["passes"] else "<b>outside</b>"
    return (f"<p><b>Is the CLLM still a good model?</b> It is a fine-tuned copy, so its answers may differ from the base model's. "
            f"On {quality['prompts']} held-out prompts, {bigrams['cllm']:.2f} of its answers' word pairs (token bigrams) were distinct "
            f"against {bigrams['base']:.2f} for the base model (fewer means more repetition), and the base model found its answers "
            f"{nll:.2f}x as surprising per token as its own. That is {verdict} our bounds (at most {bounds['max_bigram_drop']} fewer "
            f"distinct pairs, at most {bounds['max_nll_ratio']}x as surprising).</p>")


def answers_html(answers: dict[str, Iterable[int]], decode_tokens: Callable[[list[int]], str]) -> str:
    """Answers side by side under their labels (contrastive beside the expert and the amateur alone)."""
    columns = "".join(
        f"<div><h4>{html.escape(label)}</h4><p>{html.escape(decode_tokens(list(tokens)))}</p></div>" for label, tokens in answers.items()
    )
    return f'<div style="display:grid;grid-template-columns:repeat({len(answers)},1fr);gap:12px">{columns}</div>'


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def pool_figure(events: list[StepEvent]) -> go.Figure:
    """Lookahead's n-gram pool over the run: its size, and how many tokens each pass took from it."""
    steps = [e.step + 1 for e in events]
    figure = go.Figure()
    figure.add_bar(x=steps, y=[e.data.accept_length for e in events], name="tokens accepted from a candidate", marker_color=COLOURS["accepted"])
    figure.add_scatter(x=steps, y=[e.data.pool_size for e in events], name="n-grams in the pool", yaxis="y2", mode="lines")
    figure.update_layout(
        title="The n-gram pool", xaxis_title="step (target pass)", yaxis_title="accepted tokens",
        yaxis2=dict(title="pool size", overlaying="y", side="right"), legend=dict(orientation="h", y=-0.3),
    )
    return compact(figure)


def copied_clauses(data: TreeStep) -> tuple[str, str]:
    """What a tree's guessed nodes (copied from the text, or retrieved from earlier answers) add to
    a step's sentence: how many nodes they were, and how many of the accepted tokens."""
    grown, taken = [], []
    for source, (done, words) in GUESSED.items():
        nodes = data.tree_sources.count(source)
        accepted = sum(data.tree_sources[node - 1] == source for node in data.accepted_path[1:])
        grown += [f"{nodes} more {'was' if nodes == 1 else 'were'} {done} {words}"] if nodes else []
        taken += [f"{accepted} of them {done}"] if accepted else []
    return (f", and {' and '.join(grown)}" if grown else ""), (f", {', '.join(taken)}" if taken else "")


GUESSED = {  # a tree's nodes that no model proposed, by source, in words
    "copy": ("copied", "from what followed the text's last tokens where they occurred before"),
    "retrieved": ("retrieved", "from what the model's earlier answers wrote after the same words"),
}
MARKS = {"copy": ("square", "■", "copied from the text"), "retrieved": ("diamond", "◆", "from earlier answers")}  # symbol, key mark, meaning

TREE_KEY = (  # the tree's nodes, in words under its title
    (COLOURS["accepted"], "●", "accepted path"), (COLOURS["rejected"], "●", "rejected"), ("#9aa0a6", "○", "not on the best branch"),
    *(("#5f6368", mark, meaning) for _, mark, meaning in MARKS.values()),
)


def tree_figure(event: StepEvent, decode: Callable[[int], str], headline: str | None = None) -> go.Figure:
    """One step's candidate tree (Medusa's, or speculative decoding's draft tree): a node per token (depth left to right), edges to parents,
    the accepted path in green and the rest of the best candidate in red."""
    data = event.data
    tokens, parents, depths = data.tree_tokens, data.tree_parents, data.tree_depths
    accepted = set(data.accepted_path)
    rejected = set(data.best_candidate) - accepted
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
                x=[depths[parent], depths[node]], y=[y[parent], y[node]], mode="lines", showlegend=False, hoverinfo="skip",
                line=dict(color=COLOURS["accepted"] if on_path else "#c4c7cc", width=3 if on_path else 1),
            )
    colour = [COLOURS["accepted"] if n in accepted else COLOURS["rejected"] if n in rejected else COLOURS["waiting"] for n in range(len(tokens))]
    marks = [None, *(MARKS.get(source) for source in data.tree_sources)]  # node 0 is the root
    figure.add_scatter(
        x=depths, y=y, mode="markers+text", text=[decode(t) for t in tokens], textposition="middle right", showlegend=False,
        marker=dict(size=14, color=colour, symbol=[m[0] if m else "circle" for m in marks], line=dict(color="#5f6368", width=1)),
        customdata=[m[2] if m else "" for m in marks], hovertemplate="%{text} %{customdata}<extra></extra>",
    )
    counts = Counter(data.tree_sources)  # short: the title must fit a half-width plot
    copies = "".join(f", {counts[source]} {GUESSED[source][0]} {mark}" for source, (_, mark, _) in MARKS.items() if counts[source])
    key = " ".join(f"<span style='color:{colour}'>{mark}</span> {meaning}" for colour, mark, meaning in TREE_KEY)
    figure.update_layout(
        title=f"{headline or f'Step {event.step + 1}: the candidate tree ({len(tokens) - 1} nodes{copies}), {data.accept_length} accepted'}<br><sup>{key}</sup>",
        xaxis=dict(title="depth (tokens ahead of the last committed one)", dtick=1), yaxis=dict(visible=False),
    )
    return compact(figure).update_layout(margin=dict(t=80))


def tree_mask_figure(event: StepEvent, decode: Callable[[int], str]) -> go.Figure:
    """The tree attention mask of a Medusa step: node i (row) sees node j (column) when j is i
    or one of its ancestors (Cai et al. 2024, Fig. 2)."""
    parents = event.data.tree_parents
    lineage = []  # per node, itself and its ancestors
    for node, parent in enumerate(parents):
        lineage.append({node, *(lineage[parent] if parent >= 0 else ())})
    sees = [[j in lineage[i] for j in range(len(parents))] for i in range(len(parents))]
    labels = [f"{i}:{decode(t)}" for i, t in enumerate(event.data.tree_tokens)]
    figure = go.Figure(go.Heatmap(z=[[int(v) for v in row] for row in sees], x=labels, y=labels, showscale=False,
                                  colorscale=[[0, "#ffffff"], [1, COLOURS["target"]]], xgap=1, ygap=1))
    figure.update_layout(title="Tree attention mask (row sees column)", yaxis_autorange="reversed")
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
    for name, key, colour in (("expert log p", "expert_logprob", COLOURS["target"]), ("amateur log p", "amateur_logprob", "#f4b400")):
        figure.add_bar(
            x=positions, y=[c[key] for c in candidates], name=name, marker_color=grey(colour), customdata=scores,
            hovertemplate="%{y:.2f} (%{customdata})<extra>" + name + "</extra>",
        )
    chosen = next(i for i, c in enumerate(candidates) if c["token"] == data.chosen)
    figure.add_scatter(
        x=[chosen], y=[0], mode="markers+text", name="chosen", text=["chosen"], textposition="top center",
        marker=dict(symbol="star", size=16, color=COLOURS["accepted"]), hoverinfo="skip",
    )
    figure.add_hline(y=data.cutoff_logprob, line_dash="dash", line_color=COLOURS["rejected"], annotation_text="plausibility cut-off")
    # the axis follows the expert's bars and the cut-off: an amateur bar far below them is cut (its hover keeps the value)
    floor = min(min(c["expert_logprob"] for c in candidates), data.cutoff_logprob) - 4
    figure.update_layout(
        title=f"Step {event.step + 1}: chose {decode(data.chosen)!r}; the expert alone would take {decode(data.expert_choice)!r}",
        barmode="group", yaxis=dict(title="log-probability", range=[floor, 1]), legend=dict(orientation="h", y=-0.25),
        xaxis=dict(tickvals=positions, ticktext=[decode(c["token"]) for c in candidates]),
    )
    return compact(figure)


RACE_HEADER = ("| method | tokens/s | tokens/pass | speedup vs ar | from memory (datastore + text) | same tokens as ar |\n"
               "|---|---|---|---|---|---|\n")
ORIGIN_LABELS = {"datastore": "recalled from the datastore of earlier answers", "text": "copied from the text",
                 "prediction": "predicted (draft, heads or window)", "target": "the target's own token of each pass"}


def origins_text(origins: dict | None) -> str:
    """Where the committed tokens came from, as shares (`events.committed_by_origin`)."""
    total = sum(origins.values()) if origins else 0
    return ", ".join(f"{ORIGIN_LABELS[origin]} {count / total:.0%}" for origin, count in origins.items() if count) if total else ""


def memory_cell(origins: dict | None) -> str:
    """The race's share of committed tokens recalled (datastore) or copied (text): a gain that is memory, not prediction."""
    total = sum(origins.values()) if origins else 0
    if not total:
        return ""
    return f"{(origins['datastore'] + origins['text']) / total:.0%} ({origins['datastore'] / total:.0%} datastore)"


def race_table(rows: list[str]) -> str:
    """The race's table (Markdown) from its rows, one a method."""
    return RACE_HEADER + "\n".join(rows)


def race_note(method: str, note: str) -> str:
    """A race row with no numbers yet: the method is running, or did not run."""
    return f"| {method} | | | | | {note} |"


def race_grid(columns: list[tuple[str, str]]) -> str:
    """The answers side by side: (method, its answer's HTML), AR first."""
    cells = "".join(f"<div><h4>{html.escape(method)}</h4>{answer}</div>" for method, answer in columns)
    return f'<div style="display:grid;grid-template-columns:repeat({len(columns)},1fr);gap:12px">{cells}</div>'


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
        pictures["detail"], pictures["html"] = pool_figure(events), best_html + f"<h4>The latest pass</h4>{lookahead_html(event, decode)}"
    elif isinstance(data, BeamStep):
        pictures["detail"] = beam_figure(events, decode)
    elif isinstance(data, ContrastiveStep):
        pictures["detail"] = contrastive_figure(event, decode)
    elif isinstance(data, TreeStep) and data.proposer == "heads":
        pictures["tree"], pictures["detail"] = tree_figure(event, decode), tree_mask_figure(event, decode)
    elif isinstance(data, (ChainStep, SamplingCheck, TreeStep)) and data.proposer == "draft":
        pictures["detail"] = acceptance_by_position_figure(acceptance_by_position(events))
        drafted_tree = next((e for e in reversed(events) if isinstance(e.data, TreeStep)), None)  # a last one-token pass drafts none
        if drafted_tree is not None:
            pictures["tree"] = tree_figure(drafted_tree, decode)
    return pictures


# ----- What a run's numbers mean, as a table (Generate's statistics) -----

FINISHED = {"eos": "the model ended its answer", "length": "the answer reached its maximum length",
            "stopped": "Stop was pressed, or the click's time ran out"}


def stats_html(run_stats: dict, speed=None, ar_tokens_per_s: float | None = None, note: str = "", done: bool = False, drawn: bool = False) -> str:
    """The run's numbers as a table, each with what it means, so that none seems to contradict
    another. `speed`: the speedup against AR over timed runs (`live.Spread`); `note`: what is
    being measured now. `done`: the last table of the click (the page's tests wait for it)."""
    # each row (name, value as HTML, meaning); values are escaped here, where they are made
    passes, accepted, proposed = run_stats["forward_passes"], run_stats.get("accepted", 0), run_stats.get("proposed", 0)
    rows = [
        ("Method", html.escape(str(run_stats["method"])), ""),
        ("Finished", f"{run_stats['finish_reason']}: {FINISHED.get(run_stats['finish_reason'], '')}" if run_stats["finish_reason"] else "running...", ""),
        ("Tokens committed", run_stats["tokens"], "tokens added to the answer"),
        ("Target passes", passes, "runs of the target, the model whose answer we want; a pass costs about as much for a few tokens as for one"),
        ("Tokens per target pass", f"{run_stats['tokens_per_forward']:.2f}", "tokens committed ÷ target passes (AR: 1)"),
    ]
    if proposed:
        share = f" ({accepted / proposed:.0%})"
        rows += [
            ("Guesses checked", proposed, "tokens proposed (by a draft, heads, n-grams or a Jacobi block) that the target checked"),
            ("Guesses accepted", f"{accepted}{share}", "accepted ÷ checked; Jacobi and lookahead check many guesses a pass, so theirs is low even when they gain"),
            ("Accepted per pass", f"{accepted / passes:.2f}" if passes else "0", "each pass commits its accepted guesses and one token of the target's own: "
             "tokens per pass ≈ 1 + this"),
        ]
    if origins_text(run_stats.get("origins")):
        rows.append(("Where the tokens came from", html.escape(origins_text(run_stats["origins"])),
                     "a token recalled from earlier answers or copied from the text is memory, not prediction: a gain made of it "
                     "shows what the model wrote before"))
    if run_stats.get("draft_forwards"):
        rows.append(("Draft passes", run_stats["draft_forwards"], "runs of the small draft model, much cheaper than the target's"))
    if speed is not None:
        runs = f"{speed.runs} timed run{'s' if speed.runs != 1 else ''} of each"
        how = ("the streamed run's, drawn as it ran (not timed again)", "AR's streamed run on the same prompt, drawn the same way",
               "speed ÷ AR's speed, one drawn run each: no range, so a small gain may be noise") if drawn else (
               f"the median of {runs}, timed without drawing the page", "AR on the same prompt, timed in the same rounds",
               f"speed ÷ AR's speed, over {runs}; the range pairs the slowest run of one with the fastest of the other: a gain inside it is noise")
        rows += [
            ("Speed", f"{run_stats['tokens_per_s']:.1f} tokens/s", how[0]),
            ("AR's speed", f"{ar_tokens_per_s:.1f} tokens/s" if ar_tokens_per_s else "", how[1]),
            ("Speedup against AR", f"<b>{speed.median:.2f}x</b> (range {speed.low:.2f}x to {speed.high:.2f}x)", how[2]),
        ]
    attributes = f'data-method="{html.escape(str(run_stats["method"]))}"'
    if run_stats["finish_reason"]:
        attributes += f' data-finish="{run_stats["finish_reason"]}"'
    if speed is not None:
        attributes += f' data-speedup="{speed.median:.4f}" data-low="{speed.low:.4f}" data-high="{speed.high:.4f}"'
    if done:
        attributes += " data-done"
    body = "".join(f"<tr><th>{name}</th><td>{value}</td><td>{html.escape(meaning)}</td></tr>" for name, value, meaning in rows)
    status = f"<p><i>{html.escape(note)}</i></p>" if note else ""
    return f'{status}<table class="specdemo-stats" {attributes}>{body}</table>'


# ----- Step through: draft, verify and accept as three beats -----

BEATS_STYLE = """
<style>
.specdemo-beats { display: grid; grid-template-columns: repeat(3, 1fr); gap: 8px; margin: 6px 0; }
.specdemo-beat { border: 1px solid #dadce0; border-radius: 6px; padding: 6px 10px; animation: specdemo-beat 0.35s ease both; }
.specdemo-beat:nth-child(2) { animation-delay: 0.3s; }
.specdemo-beat:nth-child(3) { animation-delay: 0.6s; }
.specdemo-beat h4 { margin: 0 0 4px 0; }
.tok[data-origin="guess"] { background: #fff4cc; border: 1px dashed #c49000; }
@keyframes specdemo-beat { from { opacity: 0; transform: translateY(6px); } to { opacity: 1; transform: none; } }
</style>
"""


def proposer_of(event: StepEvent) -> str | None:
    """Who proposed a step's guesses, in words; None for a method that proposes none (AR, beam, contrastive)."""
    data = event.data
    if isinstance(data, (ChainStep, SamplingCheck, TreeStep)):
        return {"draft": "The draft model", "heads": "Medusa's heads"}.get(data.proposer, "The proposer")
    if isinstance(data, LookaheadStep):
        return "The n-gram pool"
    if isinstance(data, JacobiStep):
        return "The Jacobi guess"
    return None


def chips(tokens: Iterable[int], origin: str, decode: Callable[[int], str]) -> str:
    spans = "".join(f'<span class="tok" data-origin="{origin}">{html.escape(apart(decode(t)))}</span>' for t in tokens)
    return spans or "<i>none</i>"


def beats_html(event: StepEvent, decode: Callable[[int], str]) -> str:
    """One step as three beats, shown one after the other: who guessed what (draft), the target's
    one pass over the guesses (verify), and what it kept, threw away and added (accept). A
    method without guesses gets one beat: the target's pass and its token."""
    who, own = proposer_of(event), event.committed[len(event.accepted):]
    if who is None:
        beats = [("Pass", f"The target ran one pass and gave its next token: {chips(event.committed, own_origin(event), decode)}")]
    else:
        guessed = len(event.proposed)
        beats = [
            ("1. Draft", f"{who} guessed {guessed} token{'s' if guessed != 1 else ''}: {chips(event.proposed, 'guess', decode)}"),
            ("2. Verify", f"The target ran <b>one pass</b> over the answer so far and {'these guesses' if guessed else 'no guess'}, "
                          "predicting the next token at every position at once."),
            ("3. Accept", f"Kept {len(event.accepted)}: {chips(event.accepted, 'accepted', decode)}<br>Threw away: {chips(event.rejected, 'rejected', decode)}"
                          f"<br>Added its own: {chips(own, 'target', decode)}<br><b>{len(event.committed)} token{'s' if len(event.committed) != 1 else ''} "
                          "committed in this pass.</b>"),
        ]
    cells = "".join(f'<div class="specdemo-beat"><h4>{title}</h4>{text}</div>' for title, text in beats)
    return f'{STYLE}{BEATS_STYLE}<div class="specdemo-beats" data-step="{event.step + 1}">{cells}</div>'


# ----- The race's ending: speedup and tokens per pass, with their spreads -----

def race_figure(results: list[dict]) -> go.Figure:
    """Bars of each raced method's speedup against AR (the median over its timed runs, whiskers
    from the slowest pairing to the fastest: `live.Spread`) and of its tokens per target pass
    (whiskers: the fewest and most over its runs). `results`: per method, in the race's order,
    {"method", "speedup" (a Spread), "tokens_per_pass": [one per run]}. AR against itself shows the noise."""
    from plotly.subplots import make_subplots

    methods = [r["method"] for r in results]
    figure = make_subplots(rows=1, cols=2, subplot_titles=("Speedup against AR (median; whiskers: the range)", "Tokens per target pass"))
    medians = [r["speedup"].median for r in results]
    figure.add_bar(
        x=methods, y=medians, marker_color=[COLOURS["ar"] if m == "ar" else COLOURS["accepted"] for m in methods], showlegend=False,
        error_y=dict(type="data", symmetric=False, array=[r["speedup"].high - r["speedup"].median for r in results],
                     arrayminus=[r["speedup"].median - r["speedup"].low for r in results]),
        text=[f"{m:.2f}x" for m in medians], textposition="inside", insidetextanchor="start", row=1, col=1,
    )
    per_pass = [sorted(r["tokens_per_pass"]) for r in results]
    middle = [values[(len(values) - 1) // 2] for values in per_pass]
    figure.add_bar(
        x=methods, y=middle, marker_color=COLOURS["target"], showlegend=False, text=[f"{v:.2f}" for v in middle], textposition="inside", insidetextanchor="start",
        error_y=dict(type="data", symmetric=False, array=[v[-1] - m for v, m in zip(per_pass, middle)], arrayminus=[m - v[0] for v, m in zip(per_pass, middle)]),
        row=1, col=2,
    )
    figure.add_hline(y=1, line_dash="dash", line_color="#5f6368", row=1, col=1)
    runs = min((r["speedup"].runs for r in results), default=0)
    figure.update_layout(title=f"The race: {runs} timed run{'s' if runs != 1 else ''} of each method and of AR, on this prompt")
    return compact(figure).update_layout(margin=dict(t=80))


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
    data = best.data
    if isinstance(data, TreeStep):
        return tree_figure(best, decode, f"{BEST}: step {best.step + 1}, {len(best.committed)} tokens (tree of {len(data.tree_tokens) - 1})"), ""
    if isinstance(data, JacobiStep):
        block = next(b for b in jacobi_blocks(events) if best in b)
        figure = trajectory_figure(block, decode)
        return figure.update_layout(title=f"{BEST}: step {best.step + 1}, {len(best.committed)} tokens, in this block<br>{figure.layout.title.text}"), ""
    if isinstance(data, LookaheadStep):
        return None, f"<h4>{BEST} (step {best.step + 1}, {len(best.committed)} tokens)</h4>{lookahead_html(best, decode)}"
    return None, ""


def how_html(plain: str, description: str) -> str:
    """A method in one plain sentence, its details and math folded away (Markdown with HTML)."""
    return f"{plain}\n\n<details><summary>The details, with the math</summary>\n\n{description}\n\n</details>"


def before_pictures(events: list[StepEvent], decode: Callable[[int], str]) -> dict:
    """Step through's step 0, before the first target pass: nothing is committed; a Jacobi run
    shows its initial guess, the block its first pass will refine."""
    pictures = method_pictures([], decode)
    if events and isinstance(events[0].data, JacobiStep):
        pictures["trajectory"] = trajectory_figure(jacobi_blocks(events)[0], decode, before=True)
    return pictures


def replay_frames(runs: list[tuple[str, list[StepEvent]]], every_s: float) -> Iterator[list[tuple[str, list[StepEvent]]]]:
    """A race replayed at its measured times: frames `every_s` of run time apart, each giving
    every run's events committed by then (each event's `elapsed_s`), labelled with the method,
    its tokens so far and, once its answer is whole, "done"; the last frame shows every run whole."""
    end = max((events[-1].elapsed_s for _, events in runs if events), default=0.0)
    now = 0.0
    while True:
        now = min(now + every_s, end)
        frame = []
        for method, events in runs:
            shown = [event for event in events if event.elapsed_s <= now]
            tokens = sum(len(event.committed) for event in shown)
            frame.append((f"{method}: {tokens} tokens{', done' if len(shown) == len(events) else ''} ({now:.1f} s)", shown))
        yield frame
        if now >= end:
            return


# The page's own style: the stream scrolls inside its box (the prompt, the stream and a chart fit
# a projector's 1280x720), and the large-text switch grows every text for the back of a room.
PAGE_STYLE = """
<style>
#stream { max-height: 36vh; overflow-y: auto; }
#stream .specdemo-stream, #step-stream .specdemo-stream { font-size: 15px; }
.specdemo-stats th { text-align: left; white-space: nowrap; padding-right: 0.8em; }
.specdemo-stats td { padding-right: 0.8em; vertical-align: top; }
.specdemo-stats td:last-child { color: #5f6368; font-size: 0.9em; }
.specdemo-lesson { background: #fef7e0; border-left: 4px solid #f4b400; padding: 6px 10px; }
body.specdemo-large { --text-xs: 14px; --text-sm: 16px; --text-md: 19px; --text-lg: 21px; --text-xl: 26px; --text-xxl: 30px;
  --block-label-text-size: 16px; --block-info-text-size: 16px; --block-title-text-size: 18px; --input-text-size: 19px;
  --body-text-size: 19px; --section-header-text-size: 19px; --checkbox-label-text-size: 17px; --button-large-text-size: 19px; }
body.specdemo-large .specdemo-stream { font-size: 24px !important; line-height: 1.6; }
body.specdemo-large .specdemo-stats, body.specdemo-large .specdemo-beats, body.specdemo-large .specdemo-legend { font-size: 18px; }
</style>
"""
