"""The app in headless Chromium (Debian's, driven by Playwright): each method streams coloured
tokens and the speed plot renders. The browser tests' fixtures live here (`test_browser_views`,
`test_browser_lesson` and `test_browser_runs` import them). Screenshots go to build/screenshots/.

Skipped where Chromium or Playwright is missing, except under CI or with
SPECDEMO_REQUIRE_BROWSER=1, where a missing browser fails the run."""

import os
import shutil
from pathlib import Path

import pytest

from conftest import serve, time_one_round

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
REQUIRED = os.environ.get("CI") == "true" or os.environ.get("SPECDEMO_REQUIRE_BROWSER") == "1"

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

if not (sync_playwright and shutil.which(CHROMIUM)):
    if REQUIRED:
        raise RuntimeError(f"the browser tests need Playwright and {CHROMIUM} "
                           "(make test installs both where apt-get works)")
    pytest.skip(f"Playwright or {CHROMIUM} missing", allow_module_level=True)

# every method that proposes tokens must show both verdicts on this prompt
PROMPT = "Write a short story about a robot who learns to paint."
METHODS_SHOWN = ["speculative", "medusa", "jacobi", "cllm", "lookahead"]


@pytest.fixture(scope="module")
def browser():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield browser
        browser.close()


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.goto(url)
    return page


@pytest.fixture(scope="module", autouse=True)
def one_timing_round():
    """One timing round a run here (`conftest.time_one_round`), so the suite stays short; the
    spread's own test asks for the page's most rounds."""
    with pytest.MonkeyPatch.context() as patch:
        time_one_round(patch)
        yield


@pytest.fixture(scope="module")
def page(browser, served_app):
    return open_page(browser, served_app.local_url)


@pytest.fixture(scope="module")
def fast_app(embedded, served_app):
    """An app that offers the fast (bfloat16) precision whatever this CPU: the app offers it only
    where the CPU multiplies bfloat16 natively, but bfloat16 runs on any CPU (emulated, slower).
    The session's page (`served_app`) is built first, outside the patch, so it stays as this CPU has it."""
    from specdemo.app import targets, ui

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(targets, "fast_dtype", lambda device: "bfloat16")
        app = serve(ui.build_app(embedded, presets=()))
        yield app
        app.close()


@pytest.fixture(scope="module")
def fast_page(browser, fast_app):
    return open_page(browser, fast_app.local_url)


def wait_for_run(page, method, timeout=240_000):
    """Until Generate's statistics table says `method`'s run ended (eos or length) and its timing is done."""
    done = page.locator(f'#stats table[data-method="{method}"][data-done]')
    expect(done).to_be_attached(timeout=timeout)
    assert done.get_attribute("data-finish") in ("eos", "length"), done.inner_text()
    return done


def choose_method(page, method):
    page.locator("#method input").click()
    page.locator("#method input").fill(method)  # the list shows only options matching the text
    page.get_by_role("option", name=method, exact=True).click()


@pytest.mark.parametrize("method", METHODS_SHOWN)
def test_method_streams_accepted_and_rejected_tokens(page, method):
    page.locator("#prompt textarea").fill(PROMPT)
    choose_method(page, method)
    # decoded by Jacobi, the paper's way, it draws its trajectory (by default lookahead: lookahead's pictures)
    if method == "cllm":
        page.get_by_text("Method settings", exact=True).click()
        page.locator("#decoder").get_by_label("jacobi").check()
    page.locator("#max-new-tokens input[type=number]").fill("24")  # each method rejects a draft in its first 8 tokens
    page.locator("#generate").click()
    wait_for_run(page, method)
    expect(page.locator('#stream .tok[data-origin="accepted"]').first).to_be_visible()
    expect(page.locator('#stream .tok[data-origin="rejected"]').first).to_be_attached()
    # the plots draw once the run is done; on a loaded machine Plotly has taken over 5 s
    expect(page.locator("#speedup-plot .js-plotly-plot").first).to_be_visible(timeout=30_000)
    own_plot = {"speculative": "#tree-plot", "medusa": "#tree-plot", "jacobi": "#trajectory-plot",
                "cllm": "#trajectory-plot"}.get(method)
    if own_plot:
        expect(page.locator(f"{own_plot} .js-plotly-plot").first).to_be_visible(timeout=30_000)
    page.screenshot(path=str(SCREENSHOTS / f"{method}.png"), full_page=True)
