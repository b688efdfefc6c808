"""The app in a real browser: Debian's headless chromium driven by Playwright for Python types a
request, sees the step bubbles and the kernel appear, asks why, uploads a module, asks why again,
and saves the screenshot the README shows (docs/screenshot.png: the first run, its step opened)."""
import os
import re
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"          # Debian's package (.ci/run installs it); never downloaded
ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "docs" / "screenshot.png"
# Headless as root in a container: no sandbox, no GPU, nothing phoning home.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    from mtmc.ui.process import running_app
    home = tmp_path_factory.mktemp("browser-home")
    with running_app({"MTMC_HOME": str(home), "MTMC_MAX_STEPS": "1"}, log=home / "app.log") as url:
        yield url


@pytest.fixture
def page(app_url):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.set_default_timeout(300_000)      # a run on the interpreter takes tens of seconds
        sync_api.expect.set_options(timeout=300_000)
        page.goto(app_url)
        yield page
        browser.close()


def _ask(page, text):
    box = page.locator("#ask textarea")
    box.fill(text)
    box.press("Enter")


def test_request_upload_and_why_in_the_browser(page):
    from playwright.sync_api import expect
    chat, code = page.locator("#chat"), page.locator("#kernel-code")

    _ask(page, "matmul of 256x256 by 256x128 in fp16")
    expect(chat.get_by_text(re.compile(r"Step 0 · first draft"))).to_be_visible()
    expect(chat.get_by_text(re.compile(r"Step 1 · planner"))).to_be_visible()
    expect(chat.get_by_text("best draft is step", exact=False)).to_be_visible()
    expect(code).to_contain_text("@triton.jit")
    expect(page.locator("#roofline svg")).to_be_visible()
    expect(page.locator("#download")).to_be_enabled()

    _ask(page, "why step 1?")
    expect(chat.get_by_text("Top alternatives the policy weighed", exact=False)).to_be_visible()
    # The README's picture: the planner's step opened (decision, diff, verdict), the kernel, the plots.
    step1 = chat.get_by_text(re.compile(r"Step 1 · planner")).first
    step1.click()
    expect(chat.locator("table").first).to_be_visible()
    step1.scroll_into_view_if_needed()
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    page.locator("#ask input[type=file]").set_input_files(str(ROOT / "tests" / "modules" / "linear_bias_relu.py"))
    page.locator("#ask textarea").press("Enter")
    expect(chat.get_by_text(re.compile(r"Uploaded module\s*linear_bias_relu.py"))).to_be_visible()
    expect(chat.get_by_text(re.compile(r"Group 0: matmul"))).to_be_visible()
    expect(chat.get_by_text("Whole-module check:", exact=False)).to_be_visible()
    expect(code).to_contain_text("generated code below")   # the ModelNew file (the editor shows its top)
    expect(page.locator("#report")).to_contain_text("Triton matmul")

    _ask(page, "why did you fuse the relu?")
    expect(chat.get_by_text("fuses linear (line 16) -> add (line 17) -> relu (line 18)", exact=False)).to_be_visible()
    assert SCREENSHOT.stat().st_size > 20_000
