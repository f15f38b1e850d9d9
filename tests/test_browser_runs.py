"""The first screen, the pass-cost picture measured on a click, and one run on screen while lesson
steps and Generate interleave, in headless Chromium. The browser and the skip rules are `test_browser`'s."""

import pytest
from playwright.sync_api import expect

from test_browser import SCREENSHOTS, browser, one_timing_round, open_page, wait_for_run  # noqa: F401


def test_the_pass_cost_picture_is_measured_on_a_click(browser, served_app, monkeypatch):
    """On the Lesson tab, Measure times a pass in memory and with the layers on disk, on this
    machine, and draws the two lines (fewer widths and repeats here: the picture is checked, not its numbers)."""
    from specdemo.app import clicks, ui_offload

    for name, value in (("PASS_WIDTHS", (1, 4, 16)), ("PASS_CONTEXT", 16), ("PASS_REPEATS", 1)):
        monkeypatch.setattr(clicks, name, value)
    page = open_page(browser, served_app.local_url)
    page.get_by_role("tab", name="Lesson").click()
    expect(page.locator("#pass-cost-plot .js-plotly-plot")).to_have_count(0)  # nothing measured at load
    page.get_by_text(ui_offload.TITLE, exact=True).click()
    page.locator("#measure").click()
    expect(page.locator("#pass-cost-note")).to_contain_text("Measured on this machine", timeout=240_000)
    plot = page.locator("#pass-cost-plot .js-plotly-plot").first
    expect(plot).to_be_visible()
    expect(plot).to_contain_text("nearly free when the line is flat")
    expect(plot.locator(".legend")).to_contain_text("in memory")
    expect(plot.locator(".legend")).to_contain_text("offloaded")
    page.screenshot(path=str(SCREENSHOTS / "pass-cost.png"), full_page=True)
    page.close()


def test_the_first_screen_is_a_ready_example(browser, served_app):
    """The page opens on Generate, set for the lesson's speculative step, with one sentence of what
    to do; the lesson is one tab away."""
    from specdemo.app import lesson

    page = open_page(browser, served_app.local_url)
    expect(page.get_by_role("tab", name="Generate")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#start-here")).to_contain_text("press Generate")
    expect(page.locator("#start-here")).to_contain_text("Lesson")
    expect(page.locator("#prompt textarea")).to_have_value(lesson.CODE)
    expect(page.locator("#method input")).to_have_value("speculative")
    expect(page.locator("#how")).to_contain_text("A small, cheap draft model guesses")
    expect(page.locator("#generate")).to_be_enabled()
    expect(page.get_by_role("tab", name="Lesson")).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "first-screen.png"))
    page.close()


# Watches the page every 20 ms and notes every moment it shows one run's setup beside another's
# outputs: the prompt and method when Generate locked them are the run's; while any output of a run
# is on screen (an answer's token, statistics, a verdict), the prompt, the method, the statistics'
# method and the lesson note's step must be that run's, and no "why" may stand beside a run not done.
MIXED_RUNS_WATCH = ("""(steps) => {
  window.mixed = []; window.runs = [];
  let locked = false;
  const q = (selector) => document.querySelector(selector);
  setInterval(() => {
    const now = {prompt: q('#prompt textarea').value, method: q('#method input').value};
    if (q('#generate').disabled && !locked) window.runs.push(now);
    locked = q('#generate').disabled;
    const run = window.runs[window.runs.length - 1];
    const table = q('#stats table[data-method]');
    const why = Array.from(document.querySelectorAll('#why p'), (e) => e.innerText).join(' ');  """
"""// not the progress Gradio shows
    if (!(q('#stream .tok') || table || why)) return;
    const say = (what) => { if (window.mixed.length < 20) window.mixed.push(what); };
    if (!run) return say(`a run's outputs before any run: ${why}`);
    if (now.prompt !== run.prompt || now.method !== run.method) """
"""say(`${now.method} set up beside ${run.method}'s outputs: ${why}, ${!!table}, ${!!q('#stream .tok')}`);
    if (table && table.dataset.method !== run.method) """
"""say(`${table.dataset.method}'s statistics in ${run.method}'s run`);
    const note = q('#lesson-note').innerText;
    for (const step of steps) {
      if (note.includes(step.title) && (step.method !== run.method || step.prompt !== run.prompt)) """
"""say(`the note of ${step.title} beside ${run.method}'s outputs`);
    }
    if (why.includes('Why is it') && !(table && table.hasAttribute('data-done'))) """
"""say('a verdict beside a run not done');
  }, 20);
}""")


@pytest.mark.slow
def test_one_run_on_screen_when_a_lesson_step_and_generate_come_while_an_answer_is_timed(browser, served_app,
                                                                                         monkeypatch):
    """While step 2's answer is timed, Generate says a run is on and takes no click, and an example
    leaves the run's prompt alone and says so; choosing step 3 stops that run, says so and clears
    its answer, statistics and verdict; Generate then runs step 3's Medusa; step 4's Jacobi then
    streams with no verdict on screen. Throughout, the page never shows one run's lesson note,
    prompt or method beside another's answer, statistics or verdict."""
    from specdemo.app import lesson, live

    monkeypatch.setattr(live, "MIN_ROUNDS", 7)  # the timing lasts long enough to be interrupted
    page = open_page(browser, served_app.local_url)
    steps = [{"title": s.title, "method": s.method, "prompt": s.prompt} for s in lesson.LESSON if s.method]
    page.evaluate(MIXED_RUNS_WATCH, steps)
    page.get_by_role("tab", name="Lesson").click()
    page.locator("#lesson-step").get_by_label(lesson.TITLES[1]).check()
    expect(page.locator("#method input")).to_have_value("speculative")
    page.locator("#max-new-tokens input[type=number]").fill("24")
    page.locator("#generate").click()
    expect(page.locator("#generate")).to_be_disabled()
    expect(page.locator("#generate")).to_contain_text("Running")
    expect(page.locator("#stats")).to_contain_text("Timing the speed", timeout=240_000)
    page.locator("#generate").click(force=True)  # refused while the run is on: nothing changes
    expect(page.locator('#stats table[data-method="speculative"]')).to_be_attached()
    # the run's prompt stays, and the page says why
    page.locator("#examples button", has_text="List the days of the week").click()
    expect(page.locator("#run-status")).to_contain_text("Press Stop first")
    expect(page.locator("#prompt textarea")).to_have_value(lesson.CODE)
    page.screenshot(path=str(SCREENSHOTS / "one-run-timing.png"))

    monkeypatch.setattr(live, "MIN_ROUNDS", 1)
    page.get_by_role("tab", name="Lesson").click()
    page.locator("#lesson-step").get_by_label(lesson.TITLES[2]).check()
    expect(page.locator("#run-status")).to_contain_text("Stopped the answer that was running", timeout=30_000)
    expect(page.locator("#method input")).to_have_value("medusa")
    for cleared in ("#stream .tok", "#stats table", "#why p"):
        expect(page.locator(cleared)).to_have_count(0)
    expect(page.locator("#generate")).to_be_enabled(timeout=30_000)
    expect(page.locator("#generate")).to_have_text("Generate")
    page.screenshot(path=str(SCREENSHOTS / "one-run-stopped-for-a-step.png"))
    page.locator("#max-new-tokens input[type=number]").fill("24")
    page.locator("#generate").click()
    expect(page.locator("#run-status")).to_be_hidden()  # a new run clears the sentence
    wait_for_run(page, "medusa")
    expect(page.locator("#why")).to_contain_text("Why is it")
    expect(page.locator("#lesson-note")).to_contain_text(lesson.TITLES[2])

    page.get_by_role("tab", name="Lesson").click()
    page.locator("#lesson-step").get_by_label(lesson.TITLES[3]).check()  # Jacobi, after Medusa's verdict
    expect(page.locator("#method input")).to_have_value("jacobi")
    expect(page.locator("#run-status")).to_be_hidden()  # no run was on: nothing to say
    expect(page.locator("#why p")).to_have_count(0)
    page.locator("#max-new-tokens input[type=number]").fill("24")
    page.locator("#generate").click()
    expect(page.locator("#stream .tok").first).to_be_visible(timeout=60_000)
    expect(page.locator("#why")).not_to_contain_text("Why is it")
    wait_for_run(page, "jacobi")
    expect(page.locator("#generate")).to_be_enabled(timeout=30_000)
    assert page.evaluate("window.mixed") == []
    assert [run["method"] for run in page.evaluate("window.runs")] == ["speculative", "medusa", "jacobi"]
    page.close()
