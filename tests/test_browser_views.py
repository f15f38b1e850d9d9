"""The page's views in headless Chromium, before a run (Step through says what to do) and after
one: the answer-only view, the legends, the step through and its autoplay, AR's spread against
itself, the race (and a bfloat16 race's explained difference), the classic strategies, and a class
of sixteen at once. The browser, the page and the skip rules are `test_browser`'s; the tests share
one page, in this order."""

import re

import pytest
from playwright.sync_api import expect

from specdemo.methods import METHODS

from test_browser import (  # noqa: F401
    METHODS_SHOWN,
    SCREENSHOTS,
    browser,
    choose_method,
    fast_app,
    fast_page,
    one_timing_round,
    page,
    wait_for_run,
)

# In bfloat16 a race on this prompt parts from AR's answer at a near-tie: after "In the heart of the
# autumn, a leaf's", AR's two likeliest tokens (' beauty' and ' life') are 0 to 0.125 apart in logit.
# bfloat16 rounding is deterministic for one CPU kernel, but kernels differ (oneDNN's matmul with
# AVX512-BF16 here, its emulation on plain AVX-512, PyTorch's own where oneDNN is off, as on AVX2
# CPUs), and so does the method whose wide passes flip the tie. Measured under five such
# combinations (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY, oneDNN off), at least one of these three
# methods parted from AR in each, at token 10 (token 6 with no vector unit at all); here all three
# do, by 0.125. Hence three methods and 12 tokens, and the test asks that one of them is explained.
DIVERGING_PROMPT = "Write a haiku about autumn leaves."
DIVERGING_METHODS = ["speculative", "medusa", "lookahead"]
DIVERGING_TOKENS = 12
FAST = "fast (bfloat16)"
NEAR_TIE = re.compile(
    r"no: first differs at token (\d+) .*\. At token \1, AR chose .+ and this method .+\. "
    r"AR's two likeliest tokens here were "
    r"(?:only \d+\.\d\d apart in logit|tied in logit \(less than 0\.005 apart\))\. "
    r"bfloat16 rounds a pass of many tokens differently from a pass of one, which flipped this near-tie\..* "
    r"In float32 the answers are equal\."
)


def test_step_through_before_any_answer_says_what_to_do(page):
    """A visitor who opens Step through before generating reads what to do, and Next leaves step 0."""
    page.get_by_role("tab", name="Step through").click()
    expect(page.locator("#explanation")).to_contain_text("Generate an answer first")
    page.get_by_role("button", name="Next ▶").click()
    expect(page.locator("#explanation")).to_contain_text("Generate an answer first")
    assert page.locator("#step input[type=number]").input_value() == "0"
    page.get_by_role("tab", name="Generate").click()


def test_the_answer_only_view_hides_the_drafts_and_keeps_the_line_breaks(page):
    """A code answer: ticked, the stream shows the answer's text alone, its line breaks kept."""
    page.locator("#prompt textarea").fill("Write a Python function that reverses a string.")
    choose_method(page, "speculative")
    page.locator("#max-new-tokens input[type=number]").fill("24")  # the code block and its line breaks
    page.locator("#generate").click()
    wait_for_run(page, "speculative")
    rejected = page.locator('#stream .tok[data-origin="rejected"]').first
    expect(rejected).to_be_visible()
    page.locator("#answer-only input").check()
    expect(rejected).to_be_hidden()
    answer = "".join(page.locator('#stream .tok:not([data-origin="rejected"])').all_text_contents())
    shown = page.locator("#stream .specdemo-stream").inner_text()
    assert "\n" in answer and shown.strip() == answer.strip()  # the text as written, line breaks and all
    page.screenshot(path=str(SCREENSHOTS / "answer-only.png"), full_page=True)
    page.locator("#answer-only input").uncheck()
    expect(rejected).to_be_visible()


def test_every_tab_has_a_legend_in_words(page):
    for tab in ("Lesson", "Generate", "Step through", "Race"):
        page.get_by_role("tab", name=tab).click()
        legend = page.locator(".specdemo-legend").filter(has_text="proposed, and accepted by the target")
        expect(legend.locator("visible=true").first).to_be_visible()
    page.get_by_role("tab", name="Generate").click()


def test_step_through_explains_each_step(page):
    """After the runs above, the Step through tab walks the last answer (speculative's) pass by
    pass: step 0 is before the first pass; each step shows its beats and outlines its tokens."""
    page.get_by_role("tab", name="Step through").click()
    page.locator("#step input[type=number]").fill("0")
    page.locator("#step input[type=number]").press("Enter")
    expect(page.locator("#explanation")).to_contain_text("Step 0: before the first target pass", timeout=30_000)
    page.get_by_role("button", name="Next ▶").click()
    expect(page.locator("#explanation")).to_contain_text("Step 1:", timeout=30_000)
    page.get_by_role("button", name="Next ▶").click()
    expect(page.locator("#explanation")).to_contain_text("Step 2:", timeout=30_000)
    expect(page.locator("#explanation")).to_contain_text("committed in one target pass")
    beats = page.locator('#explanation .specdemo-beats[data-step="2"] h4')
    expect(beats).to_have_text(["1. Draft", "2. Verify", "3. Accept"])
    expect(page.locator("#step-stream .tok[data-current]").first).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "step-through.png"), full_page=True)


def test_autoplay_advances_the_steps(page):
    """Play walks the steps on its own, at the pace chosen, and Pause holds it."""
    page.get_by_role("tab", name="Step through").click()
    page.locator("#pace input[type=number]").fill("0.5")
    page.locator("#pace input[type=number]").press("Enter")
    page.locator("#step input[type=number]").fill("1")
    page.locator("#step input[type=number]").press("Enter")
    expect(page.locator("#explanation")).to_contain_text("Step 1:", timeout=30_000)
    page.locator("#play").click()
    shown_step = "() => +(document.querySelector('#explanation .specdemo-beats')?.dataset.step || 0)"
    page.wait_for_function(f"({shown_step})() >= 3", timeout=30_000)  # steps 2 and 3 came on their own
    page.locator("#pause").click()
    held = settled(page.locator("#step input[type=number]"))  # ticks already sent may land, late when busy
    page.wait_for_timeout(2000)  # four ticks at the pace chosen
    assert page.locator("#step input[type=number]").input_value() == held and 3 <= int(held) < total_steps(page), held
    page.screenshot(path=str(SCREENSHOTS / "lesson-step-through.png"))


def settled(field, still_ms: int = 1500, within_ms: int = 20_000) -> str:
    """The value of the input `field` once it has held for `still_ms`; an AssertionError if it never
    holds that long within `within_ms` (a step-through that keeps playing)."""
    value, still = field.input_value(), 0
    for _ in range(within_ms // 100):
        field.page.wait_for_timeout(100)
        now = field.input_value()
        value, still = now, (still + 100 if now == value else 0)
        if still >= still_ms:
            return value
    raise AssertionError(f"the step kept changing: {value}")


def total_steps(page) -> int:
    return int(page.locator("#step input[type=number]").get_attribute("max"))


def test_ar_against_itself_falls_within_its_reported_spread(page, monkeypatch):
    """AR timed against its own AR baseline, in the same rounds and without drawing, reads 1.0x
    within the range the page reports: the noise a gain must clear. The range runs from the
    slowest run of one side against the fastest of the other, so with n runs a side that are
    alike it misses 1.0x only when every run of one side beats every run of the other:
    2 / C(2n, n): 10% at the page's least, 3 runs; under 0.1% at the 7 this test asks for (the most)."""
    from specdemo.app import live

    monkeypatch.setattr(live, "MIN_ROUNDS", live.MAX_ROUNDS)
    page.get_by_role("tab", name="Generate").click()
    page.locator("#prompt textarea").fill("Name three colors.")
    choose_method(page, "ar")
    page.locator("#max-new-tokens input[type=number]").fill("8")
    page.locator("#generate").click()
    table = wait_for_run(page, "ar")
    low, median, high = (float(table.get_attribute(name)) for name in ("data-low", "data-speedup", "data-high"))
    assert low <= 1.0 <= high and low <= median <= high, (low, median, high)
    expect(table).to_contain_text(re.compile(r"Speedup against AR\s*\d\.\d\dx \(range \d\.\d\dx to \d\.\d\dx\)"))
    expect(table).to_contain_text(re.compile(rf"the median of {live.MAX_ROUNDS} timed runs of each"))


def test_race_compares_every_method_with_ar(page):
    """The race times every method alike, replays them side by side and ends with its chart."""
    page.get_by_role("tab", name="Race").click()
    page.locator("#race").click()
    expect(page.locator("#race-table")).to_contain_text("Timing every method the same way", timeout=60_000)
    chart = page.locator("#race-plot .js-plotly-plot")
    expect(chart.first).to_be_visible(timeout=300_000)
    expect(chart.first).to_contain_text("Speedup against AR")
    table = page.locator("#race-table")
    for method in ["ar", *METHODS_SHOWN]:
        expect(table.locator("td", has_text=re.compile(f"^{method}$")).first).to_be_visible()
    expect(table).to_contain_text("speedup vs ar")
    expect(table).to_contain_text(re.compile(r"\d\.\d\dx \(\d\.\d\d to \d\.\d\d\)"))
    expect(page.locator('#race-streams .tok[data-origin="ar"]').first).to_be_attached()
    page.screenshot(path=str(SCREENSHOTS / "race.png"), full_page=True)


def swipe_left(page, box, y) -> None:
    """A finger's swipe at height `y` from right to left across `box` (a bounding box), as a phone sends it."""
    cdp = page.context.new_cdp_session(page)
    start, end = box["x"] + box["width"] * 0.9, box["x"] + box["width"] * 0.2
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": start, "y": y}]})
    for i in range(1, 11):
        point = {"x": start + (end - start) * i / 10, "y": y}
        cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [point]})
        page.wait_for_timeout(16)  # a finger's pace, a move a frame
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})


def test_a_phone_shows_the_statistics_and_the_race_within_its_screen(browser, served_app):
    """On a phone's 390 pixels the statistics put each row's meaning under its name and value
    instead of a third column past the screen's edge, the charts' legends sit below them, the tree
    keeps a computer's width and a swipe over it scrolls it, Step through's beats stack, and the
    race's rows stay a line or two high: its sentences scroll sideways rather than squeeze the table
    into rows a screen tall."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    phone = context.new_page()
    try:
        phone.goto(served_app.local_url)
        # float32: no row grows by a near-tie's explanation, which bfloat16 could bring on some CPU
        phone.locator("#precision").get_by_label("exact (float32)").check()
        choose_method(phone, "speculative")
        phone.locator("#max-new-tokens input[type=number]").fill("16")
        phone.locator("#generate").click()
        stats = wait_for_run(phone, "speculative")
        meaning = stats.locator("tr", has_text="Target passes").locator("td").last
        assert meaning.bounding_box()["x"] + meaning.bounding_box()["width"] <= 390, meaning.bounding_box()
        assert stats.bounding_box()["x"] + stats.bounding_box()["width"] <= 390, stats.bounding_box()
        for chart in ("#method-plot", "#speedup-plot"):  # their legends in a row below, not a column at the right
            plotted, legend = (phone.locator(f"{chart} {part}").first.bounding_box()
                               for part in (".nsewdrag", ".legend"))
            assert legend["y"] > plotted["y"] + plotted["height"], (chart, plotted, legend)
        tree = phone.locator("#tree-plot")  # drawn 600 pixels wide: squeezed, its words would overlap
        tree.scroll_into_view_if_needed()
        assert tree.locator(".main-svg").first.bounding_box()["width"] >= 600
        plotted = tree.locator(".nsewdrag").first.bounding_box()
        swipe_left(phone, tree.bounding_box(), plotted["y"] + plotted["height"] / 2)  # over the plot, not its title
        phone.wait_for_function("document.querySelector('#tree-plot').scrollLeft > 100")
        phone.get_by_role("tab", name="Step through").click()
        phone.locator("#step input[type=number]").fill("1")
        phone.locator("#step input[type=number]").press("Enter")
        expect(phone.locator("#explanation")).to_contain_text("Step 1:", timeout=30_000)
        draft, verify = (phone.locator(".specdemo-beat").nth(i).bounding_box() for i in range(2))
        assert verify["y"] >= draft["y"] + draft["height"], (draft, verify)  # one beat under another
        phone.get_by_role("tab", name="Race").click()
        phone.locator("#race").click()
        expect(phone.locator("#race-plot .js-plotly-plot").first).to_be_visible(timeout=300_000)
        rows = phone.locator("#race-table tbody tr")
        heights = [rows.nth(i).bounding_box()["height"] for i in range(rows.count())]
        assert heights and max(heights) < 120, heights
        phone.screenshot(path=str(SCREENSHOTS / "phone-race.png"), full_page=True)
    finally:
        context.close()


@pytest.mark.parametrize(("method", "says"),
                         [("beam", "beams ran in one batched pass"), ("contrastive", "amateur alone")])
def test_classic_strategies_show_their_views(page, method, says):
    """Beam search draws its tree of beams, contrastive decoding its candidates' bars and the
    expert's and the amateur's answers beside its own (in the side panel)."""
    page.get_by_role("tab", name="Generate").click()
    page.locator("#prompt textarea").fill("Name three colors.")
    choose_method(page, method)
    page.locator("#max-new-tokens input[type=number]").fill("24")
    page.locator("#generate").click()
    wait_for_run(page, method)
    expect(page.locator('#stream .tok[data-origin="ar"]').first).to_be_visible()
    expect(page.locator("#detail-plot .js-plotly-plot").first).to_be_visible()
    if method == "contrastive":
        expect(page.locator("#why")).to_contain_text(says)
    else:
        page.get_by_role("tab", name="Step through").click()
        page.locator("#step input[type=number]").fill("4")  # the 4th pass
        page.locator("#step input[type=number]").press("Enter")
        expect(page.locator("#explanation")).to_contain_text(says, timeout=30_000)
        page.get_by_role("tab", name="Generate").click()
    page.screenshot(path=str(SCREENSHOTS / f"{method}.png"), full_page=True)


def broken_words(table) -> list[str]:
    """The race table's headers and method names that the browser broke inside a word: more lines
    than the cell has words."""
    return table.evaluate("""table => [...table.querySelectorAll('th, td:first-child')].filter(cell => {
        const range = document.createRange(); range.selectNodeContents(cell);
        const lines = new Set([...range.getClientRects()].map(rect => Math.round(rect.top)));
        return lines.size > cell.textContent.trim().split(/\\s+/).length; }).map(cell => cell.textContent.trim())""")


def race_verdict(page, method):
    """The race table's "same tokens as ar" cell of `method`'s row."""
    return page.locator("#race-table tr").filter(
        has=page.get_by_role("cell", name=method, exact=True)).locator("td").last


@pytest.mark.slow
def test_race_explains_a_bfloat16_difference_and_float32_gives_ars_answer(fast_page):
    """In bfloat16 a method's answer may part from AR's where AR's two likeliest tokens
    nearly tie; the race says where, by how much, and why. Switched to exact (float32), the same
    race gives every method AR's answer (against float32's own AR baseline)."""
    page = fast_page
    page.locator("#prompt textarea").fill(DIVERGING_PROMPT)
    page.locator("#max-new-tokens input[type=number]").fill(str(DIVERGING_TOKENS))
    page.get_by_role("tab", name="Race").click()
    for method in METHODS:  # the race's boxes: every method but ar
        if method != "ar":
            page.get_by_role("checkbox", name=method, exact=True).set_checked(method in DIVERGING_METHODS)
    page.locator("#precision").get_by_label(FAST).check()
    page.locator("#race").click()
    table = page.locator("#race-table")
    for method in DIVERGING_METHODS:  # each answer is AR's, or parted from it at an explained near-tie
        expect(race_verdict(page, method)).to_have_text(re.compile(f"^yes$|{NEAR_TIE.pattern}"), timeout=180_000)
    verdicts = [race_verdict(page, method).inner_text() for method in DIVERGING_METHODS]
    assert any(NEAR_TIE.search(verdict) for verdict in verdicts), verdicts
    expect(table).not_to_contain_text("bug")
    assert broken_words(table) == []  # a long verdict leaves the other columns their words whole
    page.screenshot(path=str(SCREENSHOTS / "race-bfloat16.png"), full_page=True)

    page.locator("#precision").get_by_label("exact (float32)").check()
    page.locator("#race").click()
    expect(table).not_to_contain_text("near-tie", timeout=60_000)  # the float32 race has begun
    for method in DIVERGING_METHODS:
        expect(race_verdict(page, method)).to_have_text("yes", timeout=180_000)
    page.screenshot(path=str(SCREENSHOTS / "race-float32.png"), full_page=True)


@pytest.mark.slow
def test_a_class_of_sixteen_is_served_and_cheap_events_skip_the_queue(page, served_app):
    """16 visitors ask /generate at once. While their decodes still wait, changing the
    method on the page is answered (cheap events are off the queue), a Generate click on the page
    shows its place in the queue, and each of the 16 gets its answer or a clear refusal."""
    import threading

    from gradio_client import Client

    outcomes, lock = [], threading.Lock()

    def ask(i):
        try:
            _, numbers = Client(served_app.local_url, verbose=False).predict(
                prompt=f"Count from {i} to {i + 40}.", method="ar", max_new_tokens=12, api_name="/generate")
            outcome = ("answer", numbers["tokens"])
        except Exception as error:  # a refusal must say why
            outcome = ("refused", str(error))
        with lock:
            outcomes.append(outcome)

    page.get_by_role("tab", name="Generate").click()
    choose_method(page, "ar")
    visitors = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for visitor in visitors:
        visitor.start()
    for _ in range(600):  # until decodes flow: the first answers are back
        if outcomes:
            break
        threading.Event().wait(0.1)
    choose_method(page, "jacobi")
    expect(page.locator("#how")).to_contain_text("Jacobi decoding", timeout=30_000)
    answered_when_cheap = len(outcomes)
    page.locator("#prompt textarea").fill("Name a colour.")
    page.locator("#max-new-tokens input[type=number]").fill("4")
    page.locator("#generate").click()
    expect(page.locator("body")).to_contain_text(re.compile(r"queue: \d+/\d+"), timeout=30_000)
    for visitor in visitors:
        visitor.join(300)
    assert 1 <= answered_when_cheap < 16, answered_when_cheap  # the cheap event was answered while decodes still waited
    assert len(outcomes) == 16 and all(kind == "answer" and tokens >= 1 or "queue" in str(tokens).lower()
                                       for kind, tokens in outcomes), outcomes
    # the page's own run (jacobi, queued behind the 16) ends before the test does: a decode left running would outlive
    # the app
    wait_for_run(page, "jacobi")
