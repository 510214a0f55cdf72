"""The dashboard experience in a real headless Chromium against a real `streamlit run` (one server for
the module, a second one only for the dark theme): no request leaves the server, nothing fades while
records arrive, every axis is titled, resume labels do not overlap, a bare page offers runs, dark is
dark, a click on a run opens it in this tab, and a big root's table is drawn before every run is read."""

from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.testing.live_server import (
    GRAPH_JS,
    ROW_STATUSES_JS,
    RUN_ROWS_JS,
    click,
    list_only,
    live_charts_drawn,
    row_point,
    streamlit_server,
    wait_until,
)
from tests.support import DESKTOP, append_records, base_record, cold_root, eight_sessions, in_background, small_run

PAGES = ("/", "/run?run=eight", "/sessions?run=eight", "/compare?run=eight&run=live", "/run", "/sessions")


def served_runs(root: Path) -> None:
    """This module's runs in the shared dashboard's ``served_root`` (browser/conftest.py): ``eight``,
    eight resumed sessions; ``live``, a short run."""
    eight_sessions(root / "eight" / "metrics.jsonl")
    small_run(root / "live" / "metrics.jsonl")


@pytest.mark.first_visit
def test_no_request_goes_to_another_host(page: object, server: str) -> None:
    """Every page, opened cold (side by side, a tab each): each request Chromium makes (icons, fonts,
    scripts) goes to the dashboard server."""
    requests: list[str] = []
    page.context.on("request", lambda request: requests.append(request.url))
    tabs = [page, *(page.context.new_page() for _ in PAGES[1:])]
    for tab, path in zip(tabs, PAGES, strict=True):
        tab.goto(server + path, wait_until="commit")
    for tab, path in zip(tabs, PAGES, strict=True):
        # Not "networkidle": a run page's live watch keeps a long poll open from its first moments.
        tab.wait_for_selector("[data-testid=stMainBlockContainer] [data-testid=stElementContainer]", state="attached")
        if "run=" in path:
            wait_until(tab, lambda tab=tab: live_charts_drawn(tab), timeout=90)  # six cold pages at once on two cores
    page.wait_for_timeout(1500)  # what the pages would fetch late
    hosts = {urlsplit(url).hostname for url in requests if urlsplit(url).scheme in ("http", "https", "ws", "wss")}
    assert hosts == {"127.0.0.1"}, sorted(url for url in requests if urlsplit(url).hostname != "127.0.0.1")
    for tab in tabs:
        assert tab.evaluate("document.querySelector(\"link[rel='shortcut icon']\").href").startswith("data:")


# Per sample: the lowest opacity of any chart's element container (and its ancestors), and whether the
# status widget's running indicator is visible.
FADE_JS = """() => {
  const low = (el) => { let o = 1; for (; el; el = el.parentElement) o *= +getComputedStyle(el).opacity; return o; };
  const charts = [...document.querySelectorAll('[data-testid=stElementContainer][class*=st-key-chart_]')];
  const status = document.querySelector('[data-testid=stStatusWidget]');
  return {chart: Math.min(...charts.map(low)), charts: charts.length,
          status: !!status && getComputedStyle(status).visibility !== 'hidden' && low(status) > 0.01};
}"""


def test_nothing_fades_or_flickers_while_appends_arrive(page: object, server: str, served_root: Path) -> None:
    """200 samples while a record lands every 0.3 s: no chart container below full opacity, no running indicator."""
    path = served_root / "live" / "metrics.jsonl"
    page.goto(f"{server}/run?run=live")
    wait_until(page, lambda: live_charts_drawn(page, 6), timeout=30)
    stop = threading.Event()

    def write() -> None:
        step = 510
        while not stop.is_set():
            append_records(path, base_record(step, train_loss=5.0 / step))
            step += 10
            time.sleep(0.3)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        samples = []
        for _ in range(200):
            samples.append(page.evaluate(FADE_JS))
            page.wait_for_timeout(25)
    finally:
        stop.set()
        writer.join()
    last = max(
        x for t in page.evaluate(GRAPH_JS, "Loss")["traces"] for x in t["x"] if x is not None
    )  # legend entries: null
    assert last > 520  # records did arrive and were drawn while sampling
    assert all(sample["charts"] == 6 for sample in samples), sorted({s["charts"] for s in samples})
    faded = [sample["chart"] for sample in samples if sample["chart"] < 0.999]
    assert not faded, f"{len(faded)} of 200 samples faded, lowest opacity {min(faded)}"
    assert not any(sample["status"] for sample in samples)


def test_every_axis_is_titled(page: object, server: str) -> None:
    """Every chart on the run page draws an x and a y axis title."""
    page.goto(f"{server}/run?run=eight")
    wait_until(page, lambda: live_charts_drawn(page, 6), timeout=30)
    titles = page.evaluate("""() => [...document.querySelectorAll(
        '.js-plotly-plot')].map(g => ({
        title: g.layout.title.text, x: g.querySelector('.g-xtitle')?.textContent,
        y: g.querySelector('.g-ytitle')?.textContent}))""")
    assert len(titles) == 6
    assert all(t["x"] == "step" and t["y"] for t in titles), titles
    assert {t["title"]: t["y"] for t in titles}["Learning rate"] == "learning rate"


# Bounding boxes of every annotation drawn on the Loss chart.
LABEL_BOXES_JS = """() => {
  const graph = [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => g.layout.title.text === 'Loss');
  return [...graph.querySelectorAll('.annotation')].map(a => {
    const r = a.querySelector('.annotation-text-g').getBoundingClientRect();
    return {text: a.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom};
  });
}"""


@pytest.mark.parametrize("width", [1400, 390])
def test_resume_labels_of_eight_sessions_do_not_overlap(browser: object, server: str, width: int) -> None:
    """Eight sessions resumed 20 steps apart on a 2k run: no two drawn labels' boxes intersect, desktop or phone."""
    context = browser.new_context(viewport={"width": width, "height": 1000})
    try:
        page = context.new_page()
        page.goto(f"{server}/run?run=eight")
        wait_until(page, lambda: live_charts_drawn(page, 6), timeout=30)
        page.wait_for_timeout(500)
        boxes = page.evaluate(LABEL_BOXES_JS)
        labels = [box for box in boxes if box["text"].startswith("S")]
        assert labels and labels[0]["text"] == "S2 · resume @ 20"
        for number, one in enumerate(boxes):
            for other in boxes[number + 1 :]:
                apart = (one["right"] <= other["left"] or other["right"] <= one["left"]
                         or one["bottom"] <= other["top"] or other["bottom"] <= one["top"])  # fmt: skip
                assert apart, (one, other)
    finally:
        context.close()


def test_bare_run_page_offers_the_runs(page: object, server: str) -> None:
    """/run from the top bar: a picker of the runs, no error; picking one opens its charts in this tab."""
    page.goto(f"{server}/run")
    picker = page.locator(".st-key-run_picker")
    picker.wait_for(timeout=30_000)
    assert page.locator("[data-testid=stAlertContentError]").count() == 0
    picker.locator("input").fill("live")
    page.keyboard.press("Enter")
    wait_until(page, lambda: live_charts_drawn(page, 6), timeout=30)
    assert "run=live" in page.url


def test_dark_theme_gives_dark_charts(browser: object, served_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server started with theme.base dark: the charts' plot background is dark, their text light."""
    monkeypatch.setenv("STREAMLIT_THEME_BASE", "dark")
    with streamlit_server(served_root) as url:
        context = browser.new_context(viewport=DESKTOP)
        try:
            page = context.new_page()
            page.goto(f"{url}/run?run=eight")
            wait_until(page, lambda: live_charts_drawn(page, 6), timeout=30)
            colours = wait_until(page, lambda: (c := page.evaluate("""() => [...document.querySelectorAll(
                '.js-plotly-plot')]
                .map(g => [g.layout.plot_bgcolor, g.layout.font.color])""")) and
                all(bg == "#0e1117" for bg, _ in c) and c, timeout=20)  # fmt: skip
            assert all(font == "#fafafa" for _, font in colours)
        finally:
            context.close()


def live_run(root: Path, name: str, every: float = 0.2) -> AbstractContextManager[None]:
    """A real writer appending a record to run ``name`` every ``every`` s: its runs page row changes
    at every refresh."""

    def write(stop: threading.Event) -> None:
        state = TrainingState()
        with MetricsWriter(RunContext(root / name, name, "s1")) as writer:
            while not stop.is_set():
                state.step += 10
                writer.write("train", state, train_loss=5.0 / state.step)
                stop.wait(every)

    return in_background(write)


def test_a_click_on_a_run_opens_it_in_this_tab_while_the_overview_is_live(
    page: object, server: str, served_root: Path
) -> None:
    """The runs page refreshing every second under a live run: a click on that run's link opens its page
    in this tab (Streamlit's link cells open a new tab: ~10 s, a new session), and so does a tick on its
    row followed by "Open the run" (ticks select rows, several open together); no other tab is ever
    opened, and Back returns to the runs."""
    with live_run(served_root, "clicked"):
        page.goto(server + "/")
        wait_until(page, lambda: "run?run=clicked" in page.evaluate(RUN_ROWS_JS)["names"], timeout=30)
        row = page.locator("[data-testid=stDataFrame] tbody tr").filter(has_text="run?run=clicked")
        shown = row.text_content()
        wait_until(page, lambda: row.text_content() != shown)  # the table is live: redrawn with the new records
        click(page, *row_point(page, "clicked", 50))
        wait_until(page, lambda: live_charts_drawn(page), timeout=30)
        assert page.url == f"{server}/run?run=clicked" and len(page.context.pages) == 1
        page.go_back()
        wait_until(page, lambda: "run?run=clicked" in page.evaluate(RUN_ROWS_JS)["names"], timeout=30)
        page.wait_for_timeout(1200)  # a refresh or more
        click(page, *row_point(page, "clicked", 17))
        page.get_by_role("link", name="Open the run").click()
        wait_until(page, lambda: live_charts_drawn(page), timeout=30)
        assert page.url == f"{server}/run?run=clicked" and len(page.context.pages) == 1


def test_a_link_clicked_with_ctrl_still_opens_a_new_tab(page: object, server: str) -> None:
    """As with any link in a browser: Ctrl+click opens the run in a new tab, this tab stays on the runs."""
    page.goto(server + "/")
    list_only(page, "^eight$", ["eight"])  # other modules' newer runs push its row out of the grid's view
    x, y = row_point(page, "eight", 50)
    page.mouse.move(x, y, steps=4)
    page.wait_for_timeout(150)
    with page.context.expect_page(timeout=10_000) as opened:
        page.keyboard.down("Control")
        page.mouse.click(x, y)
        page.keyboard.up("Control")
    tab = opened.value
    tab.wait_for_load_state()
    # this tab keeps the runs page, with the filter in its URL
    assert tab.url == f"{server}/run?run=eight" and page.url == f"{server}/?filter=%5Eeight%24"
    tab.close()


def test_the_runs_table_of_a_big_root_is_drawn_before_every_run_is_read(browser: object, tmp_path: Path) -> None:
    """150 small runs and 6 big ones: the table is drawn (first page of 100, a caption counting all 156) while
    the big runs, newest by their tails, still show ``loading`` (the store's loader reads them after the
    small ones, for seconds: long enough to be seen on a loaded machine), and page 2 holds the rest."""
    cold_root(tmp_path, small=150, big=6, big_records=120_000)  # ~30 MB per big run
    context = browser.new_context(viewport={"width": 1400, "height": 3000})
    try:
        page = context.new_page()
        with streamlit_server(tmp_path) as url:
            page.goto(url + "/")
            wait_until(page, lambda: "loading" in page.evaluate(ROW_STATUSES_JS), timeout=60, interval=0.02)
            assert page.get_by_text("Showing 1–100 of 156 runs").count() == 1
            page.get_by_test_id("stNumberInputField").fill("2")
            page.get_by_test_id("stNumberInputField").press("Enter")
            wait_until(page, lambda: page.get_by_text("Showing 101–156 of 156 runs").count() == 1, timeout=30)
    finally:
        context.close()
