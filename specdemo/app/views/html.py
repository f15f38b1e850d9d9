"""The page's HTML: the streamed answer coloured by origin, the statistics, a step's beats, the race's tables.

The streamed answer is one `<span class="tok" data-origin="...">` per token:
    ar        the target's next token in plain autoregressive decoding
    accepted  a proposed token (draft, tree, n-gram, Jacobi guess) the target confirmed
    target    the target's own token in a verification pass (its correction or bonus)
    rejected  a proposed token the pass threw away, struck through where it was rejected
Each token's tooltip names its step (target pass), and for speculative sampling the numbers of
the acceptance rule: p, q, min(1, p/q) and the uniform draw.
"""

import html
from collections.abc import Callable, Iterable, Iterator

from specdemo.app.views.explain import counted
from specdemo.core.events import StepEvent
from specdemo.core.steps import ChainStep, JacobiStep, LookaheadStep, SamplingCheck, TreeStep

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
.specdemo-stream { font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.7;
  overflow-wrap: anywhere; }
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
    events: Iterable[StepEvent], decode: Callable[[int], str], decode_tokens: Callable[[list[int]], str] | None = None,
    current: bool = False
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
    """A token shown apart from the answer's text (rejected, or a guess): its line breaks as ↵, so it never breaks
    the answer's lines."""
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
        f'<div><span class="tok" data-origin="{origin}" title="{html.escape(text)}">{origin}</span> '
        f'{html.escape(text)}</div>' for origin, text in ORIGINS.items()
    )
    return f'{STYLE}<div class="specdemo-legend">{items}</div>'


# a lookahead candidate's origin, in words
CANDIDATE_SOURCES = {"copy": "copied from the text", "retrieved": "from earlier answers", "pool": "from the pool"}


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
            f'<span class="tok" data-origin="{"accepted" if i < length else "rejected"}">'
            f'{html.escape(decode(t))}</span>'
            for i, t in enumerate(candidate)
        )
        best = " (committed)" if index == data.best_candidate and length else ""
        tried.append(f"<li>{source}: {spans} &rarr; {length} matched{best}</li>")
    candidates = f"<ol>{''.join(tried)}</ol>" if tried else "<p>no n-gram in the pool starts with the last token</p>"
    return (
        f'{STYLE}<div class="specdemo-lookahead"><p>Step {event.step + 1}: the window '
        f"(the last row is this pass's new level; each column read downwards is an n-gram for the pool)</p>"
        f"<table>{rows}</table><p>Candidates verified in the same pass (pool size "
        f"{data.pool_size}):</p>{candidates}</div>"
    )


def answers_html(answers: dict[str, Iterable[int]], decode_tokens: Callable[[list[int]], str]) -> str:
    """Answers side by side under their labels (contrastive beside the expert and the amateur alone)."""
    columns = "".join(
        f"<div><h4>{html.escape(label)}</h4><p>{html.escape(decode_tokens(list(tokens)))}</p></div>"
        for label, tokens in answers.items()
    )
    return f'<div style="display:grid;grid-template-columns:repeat({len(answers)},1fr);gap:12px">{columns}</div>'


RACE_HEADER = ("| method | tokens/s | tokens/pass | speedup vs ar | from memory (datastore + text) | "
               "same tokens as ar |\n"
               "|---|---|---|---|---|---|\n")
ORIGIN_LABELS = {"datastore": "recalled from the datastore of earlier answers", "text": "copied from the text",
                 "prediction": "predicted (draft, heads or window)", "target": "the target's own token of each pass"}


def origins_text(origins: dict | None) -> str:
    """Where the committed tokens came from, as shares (`events.committed_by_origin`)."""
    total = sum(origins.values()) if origins else 0
    return (", ".join(f"{ORIGIN_LABELS[origin]} {count / total:.0%}" for origin, count in origins.items() if count)
            if total else "")


def memory_cell(origins: dict | None) -> str:
    """The race's share of committed tokens recalled (datastore) or copied (text): a gain that is memory, not
    prediction."""
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


# ----- What a run's numbers mean, as a table (Generate's statistics) -----

FINISHED = {"eos": "the model ended its answer", "length": "the answer reached its maximum length",
            "stopped": "Stop was pressed, or the click's time ran out"}


def stats_html(run_stats: dict, speed=None, ar_tokens_per_s: float | None = None, note: str = "", done: bool = False,
               drawn: bool = False) -> str:
    """The run's numbers as a table, each with what it means, so that none seems to contradict
    another. `speed`: the speedup against AR over timed runs (`live.Spread`); `note`: what is
    being measured now. `done`: the last table of the click (the page's tests wait for it)."""
    # each row (name, value as HTML, meaning); values are escaped here, where they are made
    passes, accepted, proposed = run_stats["forward_passes"], run_stats.get("accepted", 0), run_stats.get("proposed", 0)
    rows = [
        ("Method", html.escape(str(run_stats["method"])), ""),
        ("Finished", f"{run_stats['finish_reason']}: {FINISHED.get(run_stats['finish_reason'], '')}"
         if run_stats["finish_reason"] else "running...", ""),
        ("Tokens committed", run_stats["tokens"], "tokens added to the answer"),
        ("Target passes", passes, "runs of the target, the model whose answer we want; a pass costs about as much for "
         "a few tokens as for one"),
        ("Tokens per target pass", f"{run_stats['tokens_per_forward']:.2f}",
         "tokens committed ÷ target passes (AR: 1)"),
    ]
    if proposed:
        share = f" ({accepted / proposed:.0%})"
        rows += [
            ("Guesses checked", proposed, "tokens proposed (by a draft, heads, n-grams or a Jacobi block) that the "
             "target checked"),
            ("Guesses accepted", f"{accepted}{share}", "accepted ÷ checked; Jacobi and lookahead check many guesses a "
             "pass, so theirs is low even when they gain"),
            ("Accepted per pass", f"{accepted / passes:.2f}" if passes else "0", "each pass commits its accepted "
             "guesses and one token of the target's own: tokens per pass ≈ 1 + this"),
        ]
    if origins_text(run_stats.get("origins")):
        rows.append(("Where the tokens came from", html.escape(origins_text(run_stats["origins"])),
                     "a token recalled from earlier answers or copied from the text is memory, not prediction: a gain "
                     "made of it shows what the model wrote before"))
    if run_stats.get("draft_forwards"):
        rows.append(("Draft passes", run_stats["draft_forwards"], "runs of the small draft model, much cheaper than "
                     "the target's"))
    if speed is not None:
        runs = f"{speed.runs} timed run{'s' if speed.runs != 1 else ''} of each"
        how = ("the streamed run's, drawn as it ran (not timed again)",
               "AR's streamed run on the same prompt, drawn the same way",
               "speed ÷ AR's speed, one drawn run each: no range, so a small gain may be noise") if drawn else (
               f"the median of {runs}, timed without drawing the page",
               "AR on the same prompt, timed in the same rounds",
               f"speed ÷ AR's speed, over {runs}; the range pairs the slowest run of one with the fastest of the "
               "other: a gain inside it is noise")
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
    body = "".join(f"<tr><th>{name}</th><td>{value}</td><td>{html.escape(meaning)}</td></tr>"
                   for name, value, meaning in rows)
    status = f"<p><i>{html.escape(note)}</i></p>" if note else ""
    return f'{status}<table class="specdemo-stats" {attributes}>{body}</table>'


# ----- Step through: draft, verify and accept as three beats -----

BEATS_STYLE = """
<style>
.specdemo-beats { display: grid; grid-template-columns: repeat(3, 1fr); gap: 8px; margin: 6px 0; }
.specdemo-beat { border: 1px solid #dadce0; border-radius: 6px; padding: 6px 10px;
  animation: specdemo-beat 0.35s ease both; }
.specdemo-beat:nth-child(2) { animation-delay: 0.3s; }
.specdemo-beat:nth-child(3) { animation-delay: 0.6s; }
.specdemo-beat h4 { margin: 0 0 4px 0; }
.tok[data-origin="guess"] { background: #fff4cc; border: 1px dashed #c49000; }
@keyframes specdemo-beat { from { opacity: 0; transform: translateY(6px); } to { opacity: 1; transform: none; } }
@media (max-width: 640px) { .specdemo-beats { grid-template-columns: 1fr; } }  /* a phone: one beat under another */
</style>
"""


def proposer_of(event: StepEvent) -> str | None:
    """Who proposed a step's guesses, in words; None for a method that proposes none (AR, beam, contrastive)."""
    data = event.data
    if isinstance(data, (ChainStep, SamplingCheck, TreeStep)):
        return {"draft": "The draft model", "heads": "Medusa's heads"}.get(data.proposer, "The proposer")
    if isinstance(data, LookaheadStep):
        return "Lookahead's n-grams"  # from its pool, the text (copied) and earlier answers (retrieved)
    if isinstance(data, JacobiStep):
        return "The Jacobi block"
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
        committed = chips(event.committed, own_origin(event), decode)
        beats = [("Pass", "The target ran one pass; nothing is final yet." if not event.committed
                  else f"The target ran one pass and gave its next token: {committed}" if len(event.committed) == 1
                  else f"The target ran one pass, and these tokens are now final: {committed}")]
    else:
        guessed = len(event.proposed)
        beats = [
            ("1. Draft", f"{who} guessed {counted(guessed, 'token', 'tokens')}: "
             f"{chips(event.proposed, 'guess', decode)}" if guessed else f"{who} guessed nothing this pass."),
            ("2. Verify", "The target ran <b>one pass</b> over the answer so far and these guesses, predicting the "
                          "next token at every position at once." if guessed else
                          "The target ran <b>one pass</b> over the answer so far, predicting its next token."),
            ("3. Accept", f"Kept {len(event.accepted)}: {chips(event.accepted, 'accepted', decode)}<br>Threw away: "
                          f"{chips(event.rejected, 'rejected', decode)}<br>Added its own: "
                          f"{chips(own, 'target', decode)}<br><b>{counted(len(event.committed), 'token', 'tokens')} "
                          "committed in this pass.</b>"),
        ]
    cells = "".join(f'<div class="specdemo-beat"><h4>{title}</h4>{text}</div>' for title, text in beats)
    return f'{STYLE}{BEATS_STYLE}<div class="specdemo-beats" data-step="{event.step + 1}">{cells}</div>'


def replay_frames(runs: list[tuple[str, list[StepEvent]]],
                  every_s: float) -> Iterator[list[tuple[str, list[StepEvent]]]]:
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
            said = counted(tokens, "token", "tokens")
            frame.append((f"{method}: {said}{', done' if len(shown) == len(events) else ''} ({now:.1f} s)",
                          shown))
        yield frame
        if now >= end:
            return


# The page's own style: the stream scrolls inside its box (the prompt, the stream and a chart fit
# a projector's 1280x720), and the large-text switch grows every text for the back of a room.
PAGE_STYLE = """
<style>
/* the answer scrolls in its box (Gradio sets a block's overflow visible), held at its newest tokens as it streams */
#stream { max-height: 36vh; overflow-y: auto !important; display: flex !important; flex-direction: column-reverse; }
#stream .specdemo-stream, #step-stream .specdemo-stream { font-size: 15px; }
.specdemo-stats th { text-align: left; white-space: nowrap; padding-right: 0.8em; }
.specdemo-stats td { padding-right: 0.8em; vertical-align: top; }
.specdemo-stats td:last-child { color: #5f6368; font-size: 0.9em; }
/* on a phone a row's meaning goes under its name and value: three columns would run past the screen */
@media (max-width: 640px) {
  .specdemo-stats, .specdemo-stats tbody { display: block; border: none !important; }
  .specdemo-stats tr { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); border: none !important;
    border-bottom: 1px solid #dadce0 !important; }
  .specdemo-stats th, .specdemo-stats td { border: none !important; padding: 4px 0.8em 4px 0 !important; }
  .specdemo-stats th { white-space: normal; }
  .specdemo-stats td:last-child { grid-column: 1 / -1; }
  .specdemo-stats td:empty { display: none; }
  /* the race's numbers in view, its sentences a swipe away rather than squeezed into rows a screen tall */
  #race-table table { display: block; overflow-x: auto; }
  #race-table th, #race-table td { padding: 4px 6px !important; }
  #race-table td:nth-child(n+5) { min-width: 16em; }
  /* the Jacobi grid and the trees keep a computer's width, a swipe away: squeezed, their words would overlap */
  .specdemo-wide { overflow-x: auto !important; }
  .specdemo-wide .js-plotly-plot { min-width: 600px; }
}
#race-table th, #race-table td { word-break: normal; overflow-wrap: normal; }
.specdemo-lesson { background: #fef7e0; border-left: 4px solid #f4b400; padding: 6px 10px; }
/* a control's info line as legible as its label: Gradio's is too faint for a projector (under 2:1 on white) */
.info-text { color: var(--block-label-text-color) !important; }
body.specdemo-large { --text-xs: 14px; --text-sm: 16px; --text-md: 19px; --text-lg: 21px; --text-xl: 26px;
  --text-xxl: 30px; --block-label-text-size: 16px; --block-info-text-size: 16px; --block-title-text-size: 18px;
  --input-text-size: 19px; --body-text-size: 19px; --section-header-text-size: 19px;
  --checkbox-label-text-size: 17px; --button-large-text-size: 19px; }
body.specdemo-large .specdemo-stream { font-size: 24px !important; line-height: 1.6; }
body.specdemo-large .specdemo-stats, body.specdemo-large .specdemo-beats,
body.specdemo-large .specdemo-legend { font-size: 18px; }
/* grown text keeps the model's whole name and the precision switch on one line; the display switches give way */
body.specdemo-large #model { min-width: 420px !important; }
body.specdemo-large #precision { min-width: 360px !important; }
</style>
"""
