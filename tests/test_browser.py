"""The app in headless Chromium (Debian's, driven by Playwright): each method streams coloured
tokens and the speed plot renders. Screenshots go to build/screenshots/.

Skipped where Chromium or Playwright is missing, except under CI or with
SPECDEMO_REQUIRE_BROWSER=1, where a missing browser fails the run."""

import os
import re
import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
REQUIRED = os.environ.get("CI") == "true" or os.environ.get("SPECDEMO_REQUIRE_BROWSER") == "1"

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if not (sync_playwright and shutil.which(CHROMIUM)):
    if REQUIRED:
        raise RuntimeError(f"the browser tests need Playwright and {CHROMIUM} (make test installs both where apt-get works)")
    pytest.skip(f"Playwright or {CHROMIUM} missing", allow_module_level=True)

# every method that proposes tokens must show both verdicts on this prompt
PROMPT = "Write a short story about a robot who learns to paint."
METHODS_SHOWN = ["speculative", "medusa", "jacobi", "cllm", "lookahead"]


@pytest.fixture(scope="module")
def page(served_app):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.goto(served_app.local_url)
        yield page
        browser.close()


def choose_method(page, method):
    page.locator("#method input").click()
    page.locator("#method input").fill(method)  # the list shows only options matching the text
    page.get_by_role("option", name=method, exact=True).click()


@pytest.mark.parametrize("method", METHODS_SHOWN)
def test_method_streams_accepted_and_rejected_tokens(page, method):
    page.locator("#prompt textarea").fill(PROMPT)
    choose_method(page, method)
    page.locator("#max-new-tokens input[type=number]").fill("48")
    page.locator("#generate").click()
    stats = page.locator("#stats")
    expect(stats).to_contain_text(re.compile(f'"method": "{method}".*"finish_reason": "(eos|length)"', re.S), timeout=180_000)
    expect(page.locator('#stream .tok[data-origin="accepted"]').first).to_be_visible()
    expect(page.locator('#stream .tok[data-origin="rejected"]').first).to_be_attached()
    expect(page.locator("#speedup-plot .js-plotly-plot").first).to_be_visible()
    own_plot = {"speculative": "#tree-plot", "medusa": "#tree-plot", "jacobi": "#trajectory-plot", "cllm": "#trajectory-plot"}.get(method)
    if own_plot:
        expect(page.locator(f"{own_plot} .js-plotly-plot").first).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / f"{method}.png"), full_page=True)


def test_step_through_explains_each_step(page):
    """After the runs above, the Step through tab walks the last answer (lookahead's) pass by pass."""
    page.get_by_role("tab", name="Step through").click()
    page.locator("#step input[type=number]").fill("0")
    page.locator("#step input[type=number]").press("Enter")
    expect(page.locator("#explanation")).to_contain_text("Step 1:", timeout=30_000)
    page.get_by_role("button", name="Next ▶").click()
    expect(page.locator("#explanation")).to_contain_text("Step 2:", timeout=30_000)
    expect(page.locator("#explanation")).to_contain_text("committed in one target pass")
    page.screenshot(path=str(SCREENSHOTS / "step-through.png"), full_page=True)


def test_race_compares_every_method_with_ar(page):
    page.get_by_role("tab", name="Race").click()
    page.locator("#race").click()
    table = page.locator("#race-table")
    for method in METHODS_SHOWN:
        expect(table).to_contain_text(method, timeout=180_000)
    expect(table).to_contain_text("speedup vs ar")
    expect(page.locator('#race-streams .tok[data-origin="ar"]').first).to_be_attached()
    page.screenshot(path=str(SCREENSHOTS / "race.png"), full_page=True)


@pytest.mark.parametrize(("method", "says"), [("beam", "beams ran in one batched pass"), ("contrastive", "amateur alone")])
def test_classic_strategies_show_their_views(page, method, says):
    """Beam search draws its tree of beams, contrastive decoding its candidates' bars and the
    expert's and the amateur's answers beside its own (in the side panel)."""
    page.get_by_role("tab", name="Generate").click()
    page.locator("#prompt textarea").fill("Name three colors.")
    choose_method(page, method)
    page.locator("#max-new-tokens input[type=number]").fill("24")
    page.locator("#generate").click()
    expect(page.locator("#stats")).to_contain_text(re.compile(f'"method": "{method}".*"finish_reason": "(eos|length)"', re.S), timeout=180_000)
    expect(page.locator('#stream .tok[data-origin="ar"]').first).to_be_visible()
    expect(page.locator("#detail-plot .js-plotly-plot").first).to_be_visible()
    if method == "contrastive":
        expect(page.locator("#why")).to_contain_text(says)
    else:
        page.get_by_role("tab", name="Step through").click()
        page.locator("#step input[type=number]").fill("3")
        page.locator("#step input[type=number]").press("Enter")
        expect(page.locator("#explanation")).to_contain_text(says, timeout=30_000)
        page.get_by_role("tab", name="Generate").click()
    page.screenshot(path=str(SCREENSHOTS / f"{method}.png"), full_page=True)
