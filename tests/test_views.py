"""Visual builders on hand-made events: what the page shows, checked without a browser."""

import re
from dataclasses import replace

from specdemo.app.views.explain import explain_step
from specdemo.app.views.figures import (
    COLOURS,
    acceptance_by_position_figure,
    cell_text,
    jacobi_blocks,
    pool_figure,
    speed_figure,
    step_timeline_figure,
    trajectory_cells,
    trajectory_figure,
)
from specdemo.app.views.html import legend_html, lookahead_html, stream_html
from specdemo.app.views.trees import tree_figure, tree_mask_figure
from specdemo.core.events import StepEvent
from specdemo.core.steps import BeamStep, ChainStep, JacobiStep, LookaheadStep, SamplingCheck, TreeStep
from specdemo.core.verify import Proposal

WORDS = {1: "The", 2: " cat", 3: " sat", 4: " dog", 5: " on", 6: " mat", 7: " ran", 8: " the"}
decode = WORDS.__getitem__


def speculative_step():
    """The draft proposed ' cat sat on dog'; the target kept ' cat sat' and put ' the' for ' on'."""
    return StepEvent("speculative", step=2, committed=(2, 3, 8), proposed=(2, 3, 5, 4), accepted=(2, 3),
                     rejected=(5, 4), target_forwards=3,
                     data=ChainStep(gamma=4, accept_length=2, target_token=8))


def spans(page):
    return re.findall(r'<span class="tok" data-origin="(\w+)" title="([^"]*)">([^<]*)</span>', page)


def test_a_speculative_step_renders_accepted_rejected_and_target_spans():
    shown = spans(stream_html([speculative_step()], decode))
    assert [(origin, text) for origin, _, text in shown] == [
        ("accepted", " cat"), ("accepted", " sat"), ("rejected", " on"), ("rejected", " dog"), ("target", " the")
    ]
    assert all(title.startswith("step 3") for _, title, _ in shown)


def test_ar_tokens_and_html_escaping():
    shown = spans(stream_html([StepEvent("ar", step=0, committed=(9,))], {9: "<b>&"}.__getitem__))
    assert shown == [("ar", "step 1", "&lt;b&gt;&amp;")]


def test_sampling_numbers_go_into_the_tooltip():
    event = StepEvent(
        "speculative", step=0, committed=(2, 7), proposed=(2, 4), accepted=(2,), rejected=(4,),
        data=SamplingCheck(gamma=2, accept_length=1, target_token=7, p=[0.5, 0.1], q=[0.4, 0.6],
                           acceptance=[1.0, 0.1667], draws=[0.3, 0.9]),
    )
    titles = [title for _, title, _ in spans(stream_html([event], decode))]
    assert "min(1, p/q)=1.000" in titles[0] and "p=0.100, q=0.600" in titles[1] and "draw=0.900" in titles[1]


def test_jacobi_shows_only_the_replaced_guess_inline():
    event = StepEvent("jacobi", step=0, committed=(1, 2), proposed=(1, 5, 6, 7), accepted=(1,), rejected=(5, 6, 7))
    assert [origin for origin, _, _ in spans(stream_html([event], decode))] == ["accepted", "rejected", "target"]


def test_legend_names_every_origin():
    assert [origin for origin, _, _ in spans(legend_html())] == ["ar", "accepted", "target", "rejected"]
    # in words, not only in a tooltip
    assert "proposed, and accepted by the target" in legend_html().split("</span>", 2)[2]


def test_step_timeline_counts_per_origin():
    figure = step_timeline_figure([speculative_step(),
                                   StepEvent("speculative", step=3, committed=(6,), proposed=(4,), rejected=(4,))])
    bars = {bar.name: list(bar.y) for bar in figure.data}
    assert bars == {"accepted": [2, 0], "target": [1, 1], "rejected": [-2, -1]}


def test_acceptance_by_position_figure():
    figure = acceptance_by_position_figure([0.8, 0.5, 0.25])
    assert list(figure.data[0].x) == [1, 2, 3] and list(figure.data[0].y) == [0.8, 0.5, 0.25]
    assert list(figure.layout.xaxis.range) == [0.5, 3.5]  # γ = 3: the axis ends at position 3


def jacobi_event(step, iteration, state, committed, accepted, correct_since, fast=(), early=(), block_start=0):
    data = JacobiStep(block_start=block_start, iteration=iteration, state=state, next_state=state, settled=0,
                      accept_length=len(accepted),
                      correct_since=correct_since, fast_forwarded=list(fast), fixed_early=list(early))
    return StepEvent("jacobi", step=step, committed=committed, accepted=accepted, data=data)


def test_jacobi_trajectory_colours():
    """A 4-token block after the prompt's ' the' (the first guess repeats it). Pass 0: only
    position 0 becomes right ('The', the target's token), but position 2 already holds its final
    ' sat' (fixed while its left neighbour is wrong). Pass 1: ' cat' and ' sat' are confirmed,
    ' cat' becoming right in the same iteration as 'The' (fast-forwarded); ' on' is the target's
    token, right only from iteration 2, which the block never needs."""
    events = [
        jacobi_event(0, 0, [8, 8, 3, 3], (1,), (), [1, None, None, None]),
        jacobi_event(1, 1, [1, 2, 3, 4], (2, 3, 5), (2, 3), [1, 1, 0, 2], fast=[1], early=[2]),
    ]
    assert trajectory_cells(events) == [[0, 0, 3, 0], [1, 2, 3, 0]]
    figure = trajectory_figure(events, decode)
    assert [list(row) for row in figure.data[0].text] == [[" the", " the", " sat", " sat"],
                                                          ["The", " cat", " sat", " dog"]]
    assert "2 passes for 4 tokens" in figure.layout.title.text
    assert [list(row) for row in figure.data[0].hovertext] == [list(row) for row in figure.data[0].text]
    assert [len(b) for b in jacobi_blocks(events + [jacobi_event(2, 0, [6], (6,), (), [1], block_start=4)])] == [2, 1]


def test_a_trajectory_cell_cuts_a_token_that_would_spill_into_its_neighbours():
    """16 cells across: a cell shows 4 characters; the hover shows the token whole."""
    assert [cell_text(token, 16) for token in (" the", " Monday", " complete", "Wednesday")] == \
        [" the", "Mon…", "com…", "Wed…"]
    assert cell_text(" complete", 4) == " complete"  # wide cells show it whole
    figure = trajectory_figure([jacobi_event(0, 0, [1] * 16, (), (), [None] * 16)], {1: " complete"}.__getitem__)
    assert figure.data[0].text[0][0] == "com…" and figure.data[0].hovertext[0][0] == " complete"


def test_lookahead_view_lists_window_and_candidates():
    event = StepEvent(
        "lookahead", step=4, committed=(2, 3, 8), proposed=(2, 3, 5, 4, 7, 6), accepted=(2, 3), rejected=(5,),
        data=LookaheadStep(window=[[1, 2], [3, 5]], new_level=[5, 6], candidates=[[2, 3, 5], [4, 7], [6]],
                           candidate_sources=["copy", "pool", "retrieved"], candidate_accept_lengths=[2, 0, 0],
                           best_candidate=0,
                           accept_length=2, pool_size=17),
    )
    page = lookahead_html(event, decode)
    assert page.count("<tr>") == 3 and "pool size 17" in page
    assert "copied from the text:" in page and "2 matched (committed)" in page and "from the pool:" in page \
        and "0 matched" in page
    assert "from earlier answers:" in page
    assert ("verified 3 candidate n-grams (1 copied from the text, 1 from the pool, 1 from earlier answers); the best "
            "matched 2 tokens (' cat' ' sat')") in explain_step(event, decode)
    assert [origin for origin, _ in re.findall(r'data-origin="(\w+)">([^<]*)<', page)] == \
        ["accepted", "accepted", "rejected", "rejected", "rejected", "rejected"]


def test_pool_figure():
    step = LookaheadStep(window=[], new_level=[], candidates=[], candidate_sources=[], candidate_accept_lengths=[],
                         best_candidate=None, accept_length=0, pool_size=0)
    events = [StepEvent("lookahead", step=i, committed=(1,), data=replace(step, accept_length=i, pool_size=10 * i))
              for i in range(3)]
    bars, line = pool_figure(events).data
    assert list(bars.y) == [0, 1, 2] and list(line.y) == [0, 10, 20]


def test_speed_figure_has_both_runs():
    run = [StepEvent("lookahead", step=0, committed=(1, 2, 3), elapsed_s=0.1),
           StepEvent("lookahead", step=1, committed=(4,), elapsed_s=0.2)]
    baseline = [StepEvent("ar", step=i, committed=(i,), elapsed_s=0.1 * (i + 1)) for i in range(4)]
    figure = speed_figure(run, baseline)
    assert [trace.name for trace in figure.data] == ["lookahead", "ar baseline"]
    assert list(figure.data[0].y) == [0, 3, 4] and list(figure.data[1].x)[-1] == 0.4
    assert "as streamed" in figure.layout.title.text
    assert "timed run" in speed_figure(run, baseline, timed=True).layout.title.text


def test_explanations_say_what_happened():
    text = explain_step(speculative_step(), decode)
    assert "proposed 4 tokens" in text and "first 2" in text and "3rd (' on')" in text and "' the'" in text \
        and "3 tokens committed" in text
    all_accepted = StepEvent("speculative", step=0, committed=(2, 3), proposed=(2,), accepted=(2,),
                             data=ChainStep(gamma=1, accept_length=1, target_token=3))
    assert "accepted all 1 and added ' sat'" in explain_step(all_accepted, decode)
    assert "one token a pass" in explain_step(StepEvent("ar", step=0, committed=(1,)), decode)


def medusa_step():
    """Root ' cat' (drawn as node 0); nodes 0 ' sat' and 1 ' ran' below it, node 2 ' on' under 0
    (drawn 1, 2 and 3): the target accepted ' sat' and rejected ' on'."""
    return StepEvent(
        "medusa", step=1, committed=(3, 8), proposed=(3, 7, 5), accepted=(3,), rejected=(5,),
        data=TreeStep(tree=Proposal((3, 7, 5), (-1, -1, 0), ("head",) * 3), root_token=2,
                      accepted_path=[0], best_candidate=[0, 2], proposer="heads", tree_kind="static"),
    )


def test_tree_plot_highlights_the_accepted_path():
    figure = tree_figure(medusa_step(), decode)
    nodes = figure.data[-1]
    assert list(nodes.text) == [" cat", " sat", " ran", " on"] and list(nodes.x) == [0, 1, 1, 2]
    colours = list(nodes.marker.color)
    assert colours[0] == colours[1] == COLOURS["accepted"] and colours[3] == COLOURS["rejected"] \
        and colours[2] == COLOURS["waiting"]
    edges = figure.data[:-1]
    assert [e.line.color for e in edges] == [COLOURS["accepted"], "#c4c7cc", "#c4c7cc"]  # edges into nodes 1, 2, 3


def test_a_wide_tree_gets_a_row_for_each_node_of_its_fullest_depth():
    """A GPU's tree stacks 16 nodes or more at one depth: the figure grows so each keeps a 22-pixel
    row, its word legible beside it, and its mask a row for each node; a CPU's small tree keeps the
    usual 320 pixels."""
    assert tree_figure(medusa_step(), decode).layout.height == 320
    wide = StepEvent(
        "medusa", step=1, committed=(3,), proposed=tuple(range(3, 23)), accepted=(), rejected=(3,),
        data=TreeStep(tree=Proposal(tuple(range(3, 23)), (-1,) * 20, ("head",) * 20), root_token=2,
                      accepted_path=[], best_candidate=[0], proposer="heads", tree_kind="dynamic"),
    )
    figure = tree_figure(wide, str)
    plotted = figure.layout.height - figure.layout.margin.t - figure.layout.margin.b
    assert plotted >= 22 * 20, (figure.layout.height, plotted)
    mask = tree_mask_figure(wide, str)  # its attention mask: a 12-pixel row for each of the 21 nodes, the root's too
    assert mask.layout.height - mask.layout.margin.t - mask.layout.margin.b >= 12 * 21, mask.layout.height


def test_a_deep_trees_long_word_is_cut_before_the_next_depth_and_hovers_whole():
    """Seven depths leave a node's word about 8 characters before the next depth's marker: a longer
    one is cut with an ellipsis, and its hover shows it whole; a shallow tree shows it whole."""
    word = {2: " photosynthesis", 3: " is"}
    chain = StepEvent(
        "speculative", step=0, committed=(3,), proposed=tuple(range(3, 9)), accepted=(), rejected=(3,),
        data=TreeStep(tree=Proposal(tuple(range(3, 9)), (-1, 0, 1, 2, 3, 4), ("draft",) * 6), root_token=2,
                      accepted_path=[], best_candidate=[0], proposer="draft", tree_kind="dynamic"),
    )
    nodes = tree_figure(chain, lambda token: word.get(token, "x")).data[-1]
    assert nodes.text[0] == "photosy…" and nodes.text[1] == " is", nodes.text
    assert nodes.customdata[0][0] == " photosynthesis"
    shallow = tree_figure(medusa_step(), lambda token: word.get(token, "x")).data[-1]
    assert shallow.text[0] == " photosynthesis"


def test_a_figures_line_breaks_show_as_the_streams_guesses_do():
    """A newline token in a tree or the Jacobi grid reads ↵, as a guess in the stream does: plotly
    would draw it as a blank."""
    lines = {2: "\n", 3: ":\n\n"}
    nodes = tree_figure(medusa_step(), lambda token: lines.get(token, "x")).data[-1]
    assert nodes.text[0] == "↵" and nodes.customdata[0][0] == "↵" and nodes.text[1] == ":↵↵"
    grid = trajectory_figure([jacobi_event(0, 0, [2, 3], (), (), [None, None])], lines.get).data[0]
    assert list(grid.text[0]) == ["↵", ":↵↵"]


def test_a_swipe_over_the_grid_or_a_tree_scrolls_rather_than_zooms():
    """A phone shows the Jacobi grid and the trees at a computer's width, scrolled sideways by a
    swipe: neither figure takes a drag to zoom (tests/test_browser_views.py swipes one)."""
    grid = trajectory_figure([jacobi_event(0, 0, [1, 2], (), (), [None, None])], decode)
    for figure in (grid, tree_figure(medusa_step(), decode)):
        assert figure.layout.dragmode is False
        assert figure.layout.xaxis.fixedrange and figure.layout.yaxis.fixedrange


def test_a_tree_titles_headline_fits_a_half_width_plot():
    """A large tree with copied and retrieved branches: its headline fits the 60 characters of a
    half-width plot's title, the mark of each kind of guess in it."""
    sources = ("draft",) * 10 + ("copy",) * 4 + ("retrieved",) * 5
    event = StepEvent("speculative", step=25, committed=(3,) * 8, proposed=(3,) * 19, accepted=(3,) * 7,
                      data=TreeStep(tree=Proposal((3,) * 19, (-1, *range(18)), sources), root_token=2,
                                    accepted_path=list(range(7)), best_candidate=list(range(7))))
    headline = tree_figure(event, decode).layout.title.text.split("<br>")[0]
    assert "19 nodes" in headline and "7 accepted" in headline and "■" in headline and "◆" in headline
    assert len(headline) <= 60, headline


def test_tree_mask_is_ancestors_only():
    z = [list(row) for row in tree_mask_figure(medusa_step(), decode).data[0].z]
    assert z == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def beam_step():
    """Two beams: ' cat' kept twice (after ' cat' and after ' dog' the beams diverge), ' ran' pruned."""
    beams = [
        {"token": 2, "tokens": [1, 2], "log_prob": -0.5, "score": -0.25, "parent": 0, "beam": 0, "status": "kept"},
        {"token": 4, "tokens": [1, 4], "log_prob": -0.9, "score": -0.45, "parent": 0, "beam": 1, "status": "kept"},
        {"token": 7, "tokens": [1, 7], "log_prob": -2.0, "score": -1.0, "parent": 0, "beam": None, "status": "pruned"},
        {"token": 5, "tokens": [1, 5], "log_prob": -3.0, "score": -1.5, "parent": 0, "beam": None, "status": "pruned"},
    ]
    return StepEvent("beam", step=1, committed=(1,), target_forwards=2,
                     data=BeamStep(beams=beams, num_beams=2, finished=[]))


def test_a_beam_step_is_explained_from_its_beams():
    text = explain_step(beam_step(), decode)
    assert "all 2 beams ran in one batched pass" in text
    assert "2 were kept, 2 pruned" in text
    assert "' cat'" in text and "-0.50" in text  # the best beam's last token and log-probability
    assert "agree on 'The'" in text


def test_answers_are_shown_side_by_side_under_their_labels():
    from specdemo.app.views import answers_html

    page = answers_html({"contrastive": [1, 6], "expert <alone>": [1, 8]},
                        lambda tokens: "".join(decode(t) for t in tokens))
    assert "<h4>expert &lt;alone&gt;</h4>" in page
    assert page.index("The mat") < page.index("The the")


def test_a_medusa_step_says_whether_its_tree_was_chosen_for_it():
    step = medusa_step()
    step = replace(step, data=replace(step.data, tree_kind="dynamic"))
    text = explain_step(step, decode)
    assert "a tree of 3 candidate tokens (the paths they were surest of at this step)" in text \
        and "has 1 token (' sat')" in text
    step = replace(step, data=replace(step.data, tree_kind="static"))
    assert "surest" not in explain_step(step, decode)


def test_a_character_split_over_tokens_shows_whole():
    """Byte-level BPE splits 'é' and emoji over tokens; decoded alone each piece is '\ufffd'. The
    stream shows the whole character on the token that completes it, and the text reads right."""
    pieces = {1: b"Caf", 2: b"\xc3", 3: b"\xa9 ", 4: b"\xf0\x9f", 5: b"\x98\x80", 6: b"!"}
    decode_tokens = lambda tokens: b"".join(pieces[t] for t in tokens).decode("utf-8", errors="replace")  # noqa: E731
    decode = lambda token: decode_tokens([token])  # noqa: E731
    events = [StepEvent("ar", step=i, committed=(t,)) for i, t in enumerate(pieces)]
    shown = [text for _, _, text in spans(stream_html(events, decode, decode_tokens))]
    assert shown == ["Caf", "", "é ", "", "😀", "!"]
    assert "\ufffd" in "".join(text for _, _, text in spans(stream_html(events, decode)))  # token by token: broken


def test_a_speculative_pass_that_drafted_nothing_says_so():
    text = explain_step(StepEvent("speculative", step=0, committed=(7,),
                                  data=ChainStep(gamma=0, accept_length=0, target_token=7)), decode)
    assert "nothing was drafted" in text and "proposed 0" not in text and "accepted all" not in text
    assert "which this first pass computes" in text and "no room" not in text  # the reason that holds, alone
    last = explain_step(StepEvent("speculative", step=30, committed=(7,),
                                  data=ChainStep(gamma=0, accept_length=0, target_token=7)), decode)
    assert "the answer's last token leaves no room for a draft" in last and "features" not in last


def test_a_rejected_newline_does_not_break_the_answers_lines():
    """Only the answer's own line breaks break lines; a rejected newline shows as ↵."""
    words = {1: "def", 2: "\n", 3: " f", 4: "\n"}
    event = StepEvent("speculative", step=0, committed=(1, 2), proposed=(1, 4), accepted=(1,), rejected=(4,),
                      data=ChainStep(gamma=2, accept_length=1, target_token=2))
    shown = [(origin, text) for origin, _, text in spans(stream_html([event], words.__getitem__))]
    assert shown == [("accepted", "def"), ("rejected", "↵"), ("target", "\n")]


def test_a_jacobi_step_is_explained_in_words_that_agree_with_its_numbers():
    """A class reads these sentences: "1 guess", "the first was", never "1 guesses" or "the first 0 were"."""
    def sentence(guesses: int, right: int) -> str:
        event = StepEvent("jacobi", 60, committed=tuple(range(right + 1)), proposed=tuple(range(guesses)),
                          accepted=tuple(range(right)), data=JacobiStep(48, 13, [], [], 0, right, [], [], []))
        return explain_step(event, lambda token: f"t{token}")

    assert "1 guess refined" in sentence(1, 0) and "none was yet what the target predicts" in sentence(1, 0)
    assert "the first was already" in sentence(4, 1) and "after it ('t1')" in sentence(4, 1)
    assert "4 guesses refined" in sentence(4, 3) and "the first 3 were already" in sentence(4, 3)
    assert not any(re.search(r"\b1 guesses|first 0|\b1 tokens\b", sentence(g, r)) for g in (1, 4) for r in range(g))


def test_a_steps_words_say_none_and_nothing_where_there_was_none():
    """Where a step accepted nothing, matched nothing, added nothing or guessed nothing, its sentence
    and its beats say so in words ("agreed with none", "nothing more"), not as "0 token(s) ()"."""
    from specdemo.app.views.html import beats_html

    none_kept = replace(medusa_step(), committed=(8,), accepted=(), rejected=(3, 5),
                        data=replace(medusa_step().data, accepted_path=[]))
    assert "the target agreed with none of its paths, then the target added ' the'" in explain_step(none_kept, decode)
    drafted = replace(none_kept, method="speculative", data=replace(none_kept.data, proposer="draft", gamma=2,
                                                                    tree=Proposal((3, 7, 5), (-1, -1, 0),
                                                                                  ("draft",) * 3)))
    assert "the target checked every branch in one pass and agreed with none of them" in explain_step(drafted, decode)
    ended = replace(medusa_step(), committed=(3,))  # the accepted ' sat' reached the answer's length
    assert "then the target added nothing more (the answer ended there). 1 token committed" in explain_step(ended,
                                                                                                          decode)
    step = LookaheadStep(window=[], new_level=[], candidates=[[2, 3]], candidate_sources=["pool"],
                         candidate_accept_lengths=[0], best_candidate=None, accept_length=0, pool_size=1)
    tried = StepEvent("lookahead", step=0, committed=(1,), proposed=(2, 3), rejected=(2, 3), data=step)
    said = explain_step(tried, decode)
    assert "verified 1 candidate n-gram (1 from the pool); none matched, then the target added 'The'" in said \
        and "holds 1 n-gram." in said and "()" not in said and "(s)" not in said
    untried = replace(tried, proposed=(), rejected=(), data=replace(step, candidates=[]))
    assert "by one level, with no candidate n-gram to verify, then the target added" in explain_step(untried, decode)
    assert "guessed nothing this pass" in beats_html(untried, decode) and "0 tokens" not in beats_html(untried, decode)
    assert "nothing is final yet" in beats_html(replace(beam_step(), committed=()), decode)
    assert "these tokens are now final" in beats_html(replace(beam_step(), committed=(1, 2)), decode)


def test_titles_and_labels_count_one_token_and_one_pass_in_the_singular():
    from specdemo.app.views.html import beats_html, replay_frames

    one = jacobi_event(0, 0, [1], (1,), (), [None])
    assert "1 pass for 1 token" in trajectory_figure([one], decode).layout.title.text
    assert "1 token committed in this pass" in beats_html(one, decode) and "1 tokens" not in beats_html(one, decode)
    frames = list(replay_frames([("ar", [replace(one, method="ar", elapsed_s=0.1)])], every_s=1.0))
    assert frames[-1][0][0].startswith("ar: 1 token, done")


def test_a_plot_keeps_a_computers_width_on_a_phone_where_its_figure_would_overlap():
    """The trees, the Jacobi grid and the beams keep a computer's width on a phone (a swipe to the
    side); the charts beside them fit the screen. Their plots take the class with each figure."""
    from specdemo.app.drawing import WIDE, view_updates
    from specdemo.app.views import method_pictures

    def classes(events):
        return {name: update.elem_classes for name, update in view_updates(method_pictures(events, decode)).items()
                if name != "method_html" and update.visible}

    assert classes([medusa_step()]) == {"timeline": [], "tree": [WIDE], "best": [WIDE], "detail": []}
    assert classes([beam_step()]) == {"timeline": [], "detail": [WIDE]}
    jacobi = classes([jacobi_event(0, 0, [1, 2], (1,), (), [None, None])])
    assert jacobi["trajectory"] == [WIDE] and jacobi["timeline"] == []


def test_titles_fit_a_half_page_plot_on_a_projectors_page():
    """Every line of a title stays inside a half-page plot on a 1024-pixel page: a headline of at
    most 60 characters, a key of at most KEY_CHARACTERS; the top margin holds all its lines."""
    import html as html_text

    from specdemo.app.views import method_pictures
    from specdemo.app.views.figures import KEY_CHARACTERS, title_margin

    jacobi = [replace(jacobi_event(0, 0, [1, 2], (1,), (1,), [None, None]), proposed=(1, 2))]
    figures = [*method_pictures([medusa_step()], decode).values(), *method_pictures([beam_step()], decode).values(),
               *method_pictures(jacobi, decode).values(), trajectory_figure(jacobi, decode, before=True)]
    titles = [figure.layout.title.text for figure in figures if figure is not None and not isinstance(figure, str)]
    assert len(titles) >= 6 and sum("<sup>" in title for title in titles) >= 4
    for title in titles:
        for line in title.split("<br>"):
            shown = html_text.unescape(re.sub(r"<[^>]+>", "", line))
            assert len(shown) <= (KEY_CHARACTERS if "<sup>" in line else 60), (shown, len(shown))
    best = method_pictures(jacobi, decode)["best"]  # two headlines and a key
    assert best.layout.title.text.count("<br>") == 2 and best.layout.margin.t == title_margin(best.layout.title.text)
    assert title_margin(best.layout.title.text) > title_margin(tree_figure(medusa_step(), decode).layout.title.text)
