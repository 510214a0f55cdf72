"""The dashboard experience in a real headless Chromium against a real `streamlit run` (one server for
the module, a second one only for the dark theme): no request leaves the server, nothing fades while
records arrive, every axis is titled, resume labels do not overlap, a bare page offers runs, dark is
dark, and the first chart is not much slower than a bare Streamlit app drawing the same run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest

from metrics_core import MetricsWriter, RunContext, TrainingState
from tests.conftest import append_records, base_record
from tests.live_server import GRAPH_JS, live_charts_drawn, streamlit_app, streamlit_server, wait_until

PAGES = ("/", "/run?run=eight", "/sessions?run=eight", "/compare?run=eight&run=live", "/run", "/sessions")


def eight_sessions(path: Path) -> None:
    """Eight sessions, each resumed 20 steps after the previous one started; the last runs to step 2000."""
    for index in range(8):
        start = index * 20
        append_records(path, base_record(start, event="session_start", session=f"s{index}"))
        end = start + 20 if index < 7 else 2000
        append_records(path, *(base_record(s, session=f"s{index}", train_loss=2.0 + 8.0 / s, tokens=100,
                                           lr=2.5e-4, clipped_fraction=0.1, grad_norm_avg=1.0)
                               for s in range(start + 1, end + 1)))  # fmt: skip


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ux_runs")
    eight_sessions(root / "eight" / "metrics.jsonl")
    append_records(root / "live" / "metrics.jsonl", *(base_record(s, train_loss=5.0 / s) for s in range(10, 501, 10)))
    return root


def test_no_request_goes_to_another_host(page: object, server: str) -> None:
    """Every page, opened cold: each request Chromium makes (icons, fonts, scripts) goes to the dashboard server."""
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    for path in PAGES:
        page.goto(server + path)
        page.wait_for_load_state("networkidle")
        if "run=" in path:
            wait_until(page, lambda: live_charts_drawn(page), timeout=30)
        page.wait_for_timeout(1000)
    hosts = {urlsplit(url).hostname for url in requests if urlsplit(url).scheme in ("http", "https", "ws", "wss")}
    assert hosts == {"127.0.0.1"}, sorted(url for url in requests if urlsplit(url).hostname != "127.0.0.1")
    assert page.evaluate("document.querySelector(\"link[rel='shortcut icon']\").href").startswith("data:")


# Per sample: the lowest opacity of any chart's element container (and its ancestors), and whether the
# status widget's running indicator is visible.
FADE_JS = """() => {
  const low = (el) => { let o = 1; for (; el; el = el.parentElement) o *= +getComputedStyle(el).opacity; return o; };
  const charts = [...document.querySelectorAll('[data-testid=stElementContainer][class*=st-key-chart_]')];
  const status = document.querySelector('[data-testid=stStatusWidget]');
  return {chart: Math.min(...charts.map(low)), charts: charts.length,
          status: !!status && getComputedStyle(status).visibility !== 'hidden' && low(status) > 0.01};
}"""


def test_nothing_fades_or_flickers_while_appends_arrive(page: object, server: str, runs_root: Path) -> None:
    """200 samples while a record lands every 0.3 s: no chart container below full opacity, no running indicator."""
    path = runs_root / "live" / "metrics.jsonl"
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
    last = max(x for t in page.evaluate(GRAPH_JS, "Loss")["traces"] for x in t["x"])
    assert last > 520  # records did arrive and were drawn while sampling
    assert all(sample["charts"] == 6 for sample in samples)
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


def test_dark_theme_gives_dark_charts(browser: object, runs_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server started with theme.base dark: the charts' plot background is dark, their text light."""
    monkeypatch.setenv("STREAMLIT_THEME_BASE", "dark")
    with streamlit_server(runs_root) as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
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


@contextmanager
def in_background(work: Callable[[threading.Event], None]) -> Iterator[None]:
    """``work(stop)`` on a thread while the block runs; then ``stop`` is set and the thread joined."""
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def live_run(root: Path, name: str, every: float = 0.2) -> AbstractContextManager[None]:
    """A real writer appending a record to run ``name`` every ``every`` s: its overview row changes at every refresh."""

    def write(stop: threading.Event) -> None:
        state = TrainingState()
        with MetricsWriter(RunContext(root / name, name, "s1")) as writer:
            while not stop.is_set():
                state.step += 10
                writer.write("train", state, train_loss=5.0 / state.step)
                stop.wait(every)

    return in_background(write)


# In the page: the runs table's row names (its run links) in drawn order, and the canvas it is drawn on.
RUN_ROWS_JS = """() => {
  const frame = document.querySelector('[data-testid=stDataFrame]');
  if (!frame || !frame.querySelector('canvas')) return {names: []};
  const box = frame.querySelector('canvas').getBoundingClientRect();
  return {names: [...frame.querySelectorAll('tbody tr')].map(r => r.querySelector('td').textContent),
          x: box.x, y: box.y, height: box.height};
}"""


GRID_ROW_PX = 35  # glide-data-grid's header and row height in Streamlit's default theme


def row_point(page: object, name: str, x_offset: float) -> tuple[float, float]:
    """Where run ``name``'s row is drawn on the runs table's canvas, ``x_offset`` px from its left edge
    (a header row, then the rows, all ``GRID_ROW_PX`` high, the table scrolled to its top; the row
    marker column is ~34 px)."""
    table = wait_until(page, lambda: (t := page.evaluate(RUN_ROWS_JS)) and f"run?run={name}" in t["names"] and t)
    return table["x"] + x_offset, table["y"] + GRID_ROW_PX * (table["names"].index(f"run?run={name}") + 1.5)


def click(page: object, x: float, y: float) -> None:
    """A person's click: the pointer arrives (the grid underlines a link under a hovering pointer), then presses."""
    page.mouse.move(x - 8, y)
    page.mouse.move(x, y, steps=4)
    page.wait_for_timeout(150)
    page.mouse.click(x, y)


def test_a_click_on_a_run_opens_it_in_this_tab_while_the_overview_is_live(
    page: object, server: str, runs_root: Path
) -> None:
    """The overview refreshing every second under a live run: a click on that run's link opens its page
    in this tab (Streamlit's link cells open a new tab: ~10 s, a new session), and so does a tick on its
    row; no other tab is ever opened, and Back returns to the runs."""
    with live_run(runs_root, "clicked"):
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
        wait_until(page, lambda: live_charts_drawn(page), timeout=30)
        assert page.url == f"{server}/run?run=clicked" and len(page.context.pages) == 1


def test_a_link_clicked_with_ctrl_still_opens_a_new_tab(page: object, server: str) -> None:
    """As with any link in a browser: Ctrl+click opens the run in a new tab, this tab stays on the runs."""
    page.goto(server + "/")
    x, y = row_point(page, "eight", 50)
    page.mouse.move(x, y, steps=4)
    page.wait_for_timeout(150)
    with page.context.expect_page(timeout=10_000) as opened:
        page.keyboard.down("Control")
        page.mouse.click(x, y)
        page.keyboard.up("Control")
    tab = opened.value
    tab.wait_for_load_state()
    assert tab.url == f"{server}/run?run=eight" and page.url == f"{server}/"
    tab.close()


BARE_APP = """
import sys
import streamlit as st
from metrics_core.dashboard.metric_figures import Series, metric_figure
from metrics_core.dashboard.store import RunStore

store = RunStore(sys.argv[1])
view = store.view("eight")
st.plotly_chart(metric_figure([Series(view.effective("train"), "train_loss", "train")], title="Loss",
                              sessions=view.sessions))
"""


def first_chart_seconds(browser: object, url: str) -> float:
    """Seconds from navigation to the first drawn plotly chart, in a fresh (cold-cache) context."""
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page = context.new_page()
        start = time.monotonic()
        page.goto(url)
        wait_until(page, lambda: live_charts_drawn(page), timeout=60,
                   interval=0.01)  # fmt: skip
        return time.monotonic() - start
    finally:
        context.close()


def test_first_chart_is_not_much_slower_than_a_bare_streamlit_app(
    browser: object, server: str, runs_root: Path, tmp_path: Path
) -> None:
    """The run page's first chart against one st.plotly_chart of the same run (best of three, cold cache each,
    the two alternating so that the other jobs on the machine weigh on both alike)."""
    app = tmp_path / "bare.py"
    app.write_text(BARE_APP)
    with streamlit_app(app, str(runs_root)) as bare_url:
        urls = (f"{bare_url}/", f"{server}/run?run=eight")
        rounds = [[first_chart_seconds(browser, url) for url in urls] for _ in range(3)]
    bare, ours = min(b for b, _ in rounds), min(o for _, o in rounds)
    print(f"first chart: dashboard {ours:.2f} s, bare st.plotly_chart {bare:.2f} s, ratio {ours / bare:.2f}")
    assert ours <= 3 * bare + 0.5


def cold_root(root: Path, *, small: int, big: int, big_records: int) -> None:
    """``small`` runs of 50 records (``small000``…) and ``big`` runs of ``big_records`` (``big0``…, ~250 B
    each: read by the store's loader, last) whose last records are an hour newer, so they lead the table
    once the loader peeked at their tails."""
    for number in range(small):
        append_records(root / f"small{number:03d}" / "metrics.jsonl",
                       *(base_record(s, train_loss=1.0 / s) for s in range(10, 510, 10)))  # fmt: skip
    newest = "2026-11-29T11:00:00.000000+00:00"
    lines = b"".join(orjson.dumps(base_record(s, session="big", train_loss=1.0, time=newest)) + b"\n"
                     for s in range(1, big_records + 1))  # fmt: skip
    for number in range(big):
        (root / f"big{number}").mkdir()
        (root / f"big{number}" / "metrics.jsonl").write_bytes(lines)


def test_the_runs_table_of_a_big_root_is_drawn_before_every_run_is_read(browser: object, tmp_path: Path) -> None:
    """150 small runs and 3 big ones: the table is drawn (first page of 100, a caption counting all 153) while
    the big runs, newest by their tails, still show ``loading`` (the store's loader reads them after the
    small ones; the old page drew nothing until every run was read), and page 2 holds the rest."""
    cold_root(tmp_path, small=150, big=3, big_records=40_000)  # ~10 MB per big run
    context = browser.new_context(viewport={"width": 1400, "height": 3000})
    try:
        page = context.new_page()
        with streamlit_server(tmp_path) as url:
            page.goto(url + "/")
            wait_until(page, lambda: "loading" in page.evaluate(ROW_STATUSES_JS), timeout=60, interval=0.02)
            assert page.get_by_text("Showing 1–100 of 153 runs").count() == 1
            wait_until(page, lambda: "loading" not in page.evaluate(ROW_STATUSES_JS), timeout=120)
            page.get_by_test_id("stNumberInputField").fill("2")
            page.get_by_test_id("stNumberInputField").press("Enter")
            wait_until(page, lambda: page.get_by_text("Showing 101–153 of 153 runs").count() == 1, timeout=30)
    finally:
        context.close()


# In the page: the status cell's text of each row of the runs table (an empty list until it is drawn).
ROW_STATUSES_JS = """() => [...document.querySelectorAll('[data-testid=stDataFrame] tbody tr')]
  .map(r => r.querySelectorAll('td')[1].textContent)"""
