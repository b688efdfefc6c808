"""The app in a real browser: Debian's headless chromium driven by Playwright for Python, one app
and one page for the tests below, which run in file order as a user would: nothing to download
before a run; a request, and a question sent while it runs (queued, said so, answered after);
the time plot, the markdown of the stop answer, why-answers scrolled into view, and the
screenshot the README shows (docs/screenshot.png: the first run, its step opened); an upload of
a two-group module (the plot's line per group, the report tables); a one-step run."""
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

# Words of table headers that the browser broke across two lines.
BROKEN_HEADER_WORDS = """root => {
  const bad = [];
  for (const th of root.querySelectorAll('th')) {
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\\S+/g)) {
        const r = document.createRange();
        r.setStart(node, m.index);
        r.setEnd(node, m.index + m[0].length);
        if (new Set([...r.getClientRects()].map(x => Math.round(x.top))).size > 1) bad.push(m[0]);
      }
    }
  }
  return bad;
}"""
# Whether the chat's newest message starts inside the chat's visible area.
NEWEST_IN_VIEW = """() => {
  const wrap = document.querySelector('#chat .bubble-wrap');
  const rows = wrap.querySelectorAll('.message-row');
  const w = wrap.getBoundingClientRect(), top = rows[rows.length - 1].getBoundingClientRect().top;
  return top >= w.top - 2 && top < w.bottom - 20;
}"""


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    from mtmc.ui.process import running_app
    home = tmp_path_factory.mktemp("browser-home")
    # one planner move to click through: the baseline takes it offline (the learned policy stops at step 0 here)
    with running_app({"MTMC_HOME": str(home), "MTMC_MAX_STEPS": "1", "MTMC_PLANNER": "baseline"},
                     log=home / "app.log") as url:
        yield url


@pytest.fixture(scope="module")
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


def _plot(page) -> dict:
    """The time plot as drawn: tick labels, and per series the steps of its dots."""
    return page.locator("#times svg").evaluate("""svg => ({
        x: [...svg.querySelectorAll('.x-tick')].map(t => t.textContent),
        y: [...svg.querySelectorAll('.y-tick')].map(t => t.textContent),
        series: Object.fromEntries([...svg.querySelectorAll('g.series')].map(g =>
            [g.dataset.series, [...g.querySelectorAll('circle')].map(c => [+c.dataset.step, +c.dataset.ms, +c.getAttribute('cy')])]))})""")


def test_before_any_run_there_is_nothing_to_download(page):
    from playwright.sync_api import expect
    expect(page.locator("#download")).to_be_disabled()
    expect(page.locator("#times")).to_contain_text("appears as the steps are verified")


def test_a_message_sent_during_a_run_is_queued_then_answered(page):
    from playwright.sync_api import expect
    chat = page.locator("#chat")
    _ask(page, "matmul of 256x256 by 256x128 in fp16")
    expect(chat.get_by_text(re.compile(r"Step 0 · first draft"))).to_be_visible()
    _ask(page, "why did you stop?")                      # Enter while the run goes on
    expect(chat.get_by_text("A run is in progress in this conversation", exact=False)).to_be_visible()
    expect(page.locator("#ask textarea")).to_have_value("")
    expect(chat.get_by_text("best draft is step", exact=False)).to_be_visible()
    expect(chat.get_by_text("Why the planner stopped", exact=False)).to_be_visible()
    expect(chat.get_by_text("A run is in progress in this conversation", exact=False)).to_have_count(0)
    expect(page.locator("#download")).to_be_enabled()
    expect(page.locator("#kernel-code")).to_contain_text("@triton.jit")


def test_the_stop_answer_keeps_its_lines_out_of_the_list(page):
    answer = page.locator("#chat [data-testid=bot]").filter(has_text="Why the planner stopped").last
    inside = answer.evaluate("""el => [...el.querySelectorAll('li')].map(li => li.textContent)""")
    outside = answer.evaluate("""el => [...el.querySelectorAll('p')].map(p => p.textContent).join('\\n')""")
    assert len(inside) >= 3                              # the alternatives and the kernels are list items
    for label in ("Policy:", "Hardware limits", "Checked:", "Estimated, not measured"):
        assert label in outside and not any(label in item for item in inside), label


def test_the_time_plot_shows_each_step_on_rounded_axes(page):
    plot = _plot(page)
    assert plot["x"] == ["0", "1"]                       # whole steps, no half-step ticks
    assert all(len(re.sub(r"^0\.0*|\.", "", t)) <= 3 for t in plot["y"]), plot["y"]
    values = [float(t) for t in plot["y"]]
    assert values == sorted(values)                      # drawn bottom to top
    (name, dots), = plot["series"].items()
    assert name == "kernel (estimate, no GPU)" and [d[0] for d in dots] == [0, 1]
    (_, ms0, y0), (_, ms1, y1) = dots
    assert (ms0 > ms1) == (y0 < y1)                      # the slower step is drawn higher


def test_why_answers_come_into_view_even_when_the_chat_was_scrolled_up(page):
    from playwright.sync_api import expect
    chat = page.locator("#chat")
    # The README's picture: the planner's step opened (decision, diff, verdict), the kernel, the plots.
    step1 = chat.get_by_text(re.compile(r"Step 1 · planner")).first
    alternatives = chat.locator("table").filter(has_text="alternative").first
    step1.click()
    page.wait_for_timeout(300)
    if not alternatives.is_visible():                  # it was open, and the click closed it
        step1.click()
    expect(alternatives).to_be_visible()
    step1.scroll_into_view_if_needed()
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 20_000
    page.locator("#chat .bubble-wrap").evaluate("el => { el.scrollTop = 0; }")   # reading from the top
    _ask(page, "why step 1?")
    expect(chat.get_by_text(re.compile(r"Step 1: \S+ \(by the planner\)"))).to_be_visible()
    _ask(page, "why step 0?")
    expect(chat.get_by_text("Step 0: the first draft", exact=False)).to_be_visible()
    page.wait_for_function(NEWEST_IN_VIEW, timeout=10_000)


def test_a_two_group_module_gets_a_line_per_group_and_tables_that_fit(page):
    from playwright.sync_api import expect
    chat = page.locator("#chat")
    page.locator("#ask input[type=file]").set_input_files(str(ROOT / "tests" / "modules" / "layernorm_residual.py"))
    page.locator("#ask textarea").press("Enter")
    expect(chat.get_by_text(re.compile(r"Uploaded module\s*layernorm_residual.py"))).to_be_visible()
    expect(chat.get_by_text(re.compile(r"Group 0: matmul"))).to_be_visible()
    expect(chat.get_by_text(re.compile(r"Group 1: layernorm"))).to_be_visible()
    expect(chat.get_by_text("Whole-module check:", exact=False)).to_be_visible()
    expect(page.locator("#kernel-code")).to_contain_text("generated code below")   # the ModelNew file
    expect(page.locator("#report")).to_contain_text("Triton matmul")
    series = _plot(page)["series"]
    assert sorted(series) == ["group 0 (estimate, no GPU)", "group 1 (estimate, no GPU)"]
    assert all(dots for dots in series.values()) and sum(len(d) for d in series.values()) >= 3
    report = page.locator("#report .mtmc-report")
    assert report.evaluate("el => el.scrollWidth <= el.clientWidth"), "the report table is cut off"
    assert report.evaluate(BROKEN_HEADER_WORDS) == []
    chat_report = chat.locator("table").filter(has_text="correctness").last
    expect(chat_report).to_be_visible()
    assert chat_report.evaluate(BROKEN_HEADER_WORDS) == []
    _ask(page, "why did you fuse the add?")
    # (the Dropout(0.0) between them is read past as an identity)
    expect(chat.get_by_text("fuses Linear proj (line 16) -> add (line 17)", exact=False)).to_be_visible()


def test_a_one_step_run_is_a_dot_on_the_plot(page):
    from playwright.sync_api import expect
    page.get_by_role("tab", name="Settings").click()
    steps = page.locator("#max-steps input[type=number]")
    steps.fill("0")
    steps.press("Enter")
    page.get_by_role("button", name="Save settings").click()
    expect(page.locator("#status")).to_contain_text("at most 0 planner steps")
    page.get_by_role("tab", name="Chat").click()
    page.locator("#new-conversation").click()
    expect(page.locator("#download")).to_be_disabled()                  # a new conversation: nothing yet
    _ask(page, "relu on a 64x64 fp32 tensor")
    expect(page.locator("#chat").get_by_text("best draft is step 0", exact=False)).to_be_visible()
    expect(page.locator("#download")).to_be_enabled()
    plot = _plot(page)
    assert plot["x"] == ["0"] and [len(d) for d in plot["series"].values()] == [1]
