"""The Lesson tab in headless Chromium on a projector's viewport: each step sets its method and
prompt, the header's row leaves room for the lesson, and the lesson ends with the race's chart.
The browser and the skip rules are `test_browser`'s."""

import pytest
from playwright.sync_api import expect

from test_browser import SCREENSHOTS, browser, fast_app, one_timing_round, open_page, wait_for_run  # noqa: F401


def lesson_step_generated_on_a_projector(browser, url, lesson_shot: str = ""):
    """A 1280x720 page at `url`, the Lesson tab's first screen shot (to `lesson_shot`), its speculative step chosen
    (Generate opens, set for it) and generated; the prompt, the stream and a chart inside the viewport."""
    from specdemo.app import lesson

    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(url)
    page.get_by_role("tab", name="Lesson").click()
    expect(page.locator("#lesson-step")).to_contain_text(lesson.TITLES[0])
    if lesson_shot:
        page.screenshot(path=str(SCREENSHOTS / lesson_shot))
    page.locator("#lesson-step").get_by_label(lesson.TITLES[1]).check()
    # Generate opened, set for the step
    expect(page.locator("#prompt textarea")).to_have_value(lesson.CODE, timeout=30_000)
    expect(page.locator("#method input")).to_have_value("speculative")
    expect(page.locator("#lesson-note")).to_contain_text("Green tokens were guessed by the small draft")
    expect(page.locator("#how")).to_contain_text("A small, cheap draft model guesses")
    page.locator("#generate").click()
    wait_for_run(page, "speculative")
    expect(page.locator("#method-plot .js-plotly-plot").first).to_be_visible()
    for selector in ("#prompt", "#stream", "#method-plot"):
        box = page.locator(selector).bounding_box()
        assert box and box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= 1280 \
            and box["y"] + box["height"] <= 720, (selector, box)
    return page


@pytest.mark.slow
def test_the_lesson_guides_a_class_and_fits_a_projector(browser, served_app, monkeypatch):
    """The Lesson tab sets each step's method and prompt and opens Generate; at 1280x720 the
    prompt, the stream and a chart lie inside the viewport; large text grows the answer; the
    method settings keep their labels whole; the lesson ends with the race's chart. Its
    screenshots illustrate docs/lesson.md."""
    from specdemo.app import lesson

    page = lesson_step_generated_on_a_projector(browser, served_app.local_url, "lesson-tab.png")
    page.screenshot(path=str(SCREENSHOTS / "lesson-generate.png"))

    font_size = lambda: page.locator("#stream .specdemo-stream").evaluate(  # noqa: E731
        "e => parseFloat(getComputedStyle(e).fontSize)")
    normal = font_size()
    page.locator("#large-text input").check()
    page.wait_for_timeout(300)
    assert font_size() >= 1.4 * normal
    # the grown answer scrolls inside its box, which shows its newest token, and spills over nothing below it
    box, newest = page.locator("#stream").bounding_box(), page.locator("#stream .tok").last.bounding_box()
    assert box["y"] <= newest["y"] and newest["y"] + newest["height"] <= box["y"] + box["height"] + 1, (box, newest)
    page.screenshot(path=str(SCREENSHOTS / "lesson-large-text.png"))
    page.locator("#large-text input").uncheck()

    page.get_by_text("Method settings", exact=True).click()
    expect(page.locator("#method-settings .block").first).to_be_visible()
    widths = page.locator("#method-settings .block").evaluate_all(
        "blocks => blocks.filter(b => b.offsetParent).map(b => b.getBoundingClientRect().width)")
    assert len(widths) >= 16 and min(widths) >= 200, widths  # settings wrap onto rows, each wide enough for its label

    from specdemo.app import handlers

    # two rounds, the fewest a race times, so docs/lesson.md's screenshot shows each method's range; a quarter of
    # the step's 64 tokens (the race runs every method, twice: the suite's longest wait)
    monkeypatch.setattr(handlers, "RACE_MIN_ROUNDS", 2)
    page.get_by_role("tab", name="Lesson").click()
    page.locator("#lesson-step").get_by_label(lesson.TITLES[-1]).check()
    expect(page.locator("#race")).to_be_visible()  # the step opened the race
    page.get_by_role("tab", name="Generate").click()
    page.locator("#max-new-tokens input[type=number]").fill("16")
    page.get_by_role("tab", name="Race").click()
    # the methods' info line reads as well as its label (Gradio's own grey is under 2:1 on white)
    colours = page.locator("#race-methods").evaluate(
        "r => [r.querySelector('.info-text'), r.querySelector('[data-testid=block-info]')]"
        ".map(e => getComputedStyle(e).color)")
    assert colours[0] == colours[1], colours
    page.locator("#race").click()
    chart = page.locator("#race-plot .js-plotly-plot")
    expect(chart.first).to_be_visible(timeout=300_000)
    page.locator("#race-plot").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "lesson-race.png"))
    page.close()


@pytest.mark.slow
def test_the_projectors_first_screen_fits_beside_the_model_menu_and_the_precision_switch(browser, fast_app):
    """The header's row with all it can hold (the model menu, offering the model on disk, and the
    precision switch) leaves the lesson's first screen inside a 1280x720 projector's viewport; with
    large text the menu still shows the model's whole name and the switch stays on one line."""
    page = lesson_step_generated_on_a_projector(browser, fast_app.local_url)
    expect(page.locator("#model")).to_be_visible()
    expect(page.locator("#precision")).to_be_visible()
    # a screen reader names each field by its label: none keeps Gradio's default, its component's kind
    unnamed = page.evaluate("() => [...document.querySelectorAll('input, textarea')].filter(e => e.offsetParent)"
                            ".map(e => e.labels?.[0]?.innerText.trim() || e.getAttribute('aria-label') || '')"
                            ".filter(l => !l || /^(Dropdown|Textbox|Number|Slider|Checkbox|Radio)$/.test(l))")
    assert not unnamed, unnamed
    expect(page.get_by_label("Model", exact=True)).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "lesson-generate-precision.png"))
    page.locator("#large-text input").check()
    page.wait_for_timeout(300)
    # the name's drawn width against the room left of the menu's arrow (the input runs on under the arrow)
    name, room = page.locator("#model").evaluate(
        "m => { const i = m.querySelector('input'), c = document.createElement('canvas').getContext('2d');"
        " c.font = getComputedStyle(i).font; return [c.measureText(i.value).width,"
        " m.querySelector('.icon-wrap').getBoundingClientRect().left - i.getBoundingClientRect().left]; }")
    assert name <= room, (name, room)
    tops = page.locator("#precision label").evaluate_all("labels => labels.map(l => l.getBoundingClientRect().top)")
    assert len(tops) == 2 and abs(tops[0] - tops[1]) < 2, tops
    page.close()
