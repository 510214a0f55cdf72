"""The dashboard in a real headless Chromium against a real `streamlit run`: what only a browser shows."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import orjson
import pytest

from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.dashboard.views.chart_specs import STRAGGLER_TITLE
from metrics_core.testing.live_server import GRAPH_JS, GRID_JS, popover_text, sign_in, wait_until
from tests.support import append_bytes, append_records, base_record, distributed_run, three_session_run


def loss(page: object) -> dict | None:
    return page.evaluate(GRAPH_JS, "Loss")


def train_points(graph: dict) -> list[tuple[float, float]]:
    raw = [t for t in graph["traces"] if t["name"].startswith("train") and "smoothed" not in t["name"]]
    # the legend's "train" entry holds one null point, drawn nowhere
    return sorted((x, y) for t in raw for x, y in zip(t["x"], t["y"], strict=True) if x is not None)


def last_point(page: object) -> tuple[float, float] | None:
    """The loss chart's last train point; None while the page has no loss chart drawn (a rerun that
    inserts a panel above the charts may mount them again)."""
    graph = loss(page)
    points = train_points(graph) if graph else []
    return points[-1] if points else None


def last_step(page: object) -> float | None:
    """The step of ``last_point``."""
    point = last_point(page)
    return None if point is None else point[0]


def open_run(page: object, server: str, name: str, expect_last_step: int) -> dict:
    page.goto(f"{server}/run?run={name}")
    return wait_until(
        page,
        lambda: (g := loss(page)) and train_points(g) and train_points(g)[-1][0] == expect_last_step and g,
    )


def test_charts_are_drawn_with_the_right_data_and_session_markers(page: object, server: str, served_root: Path) -> None:
    """Six real plotly graphs; the loss chart holds exactly the effective history and marks each resume."""
    path = served_root / "drawn" / "metrics.jsonl"
    append_records(path, *(base_record(s, session="a", train_loss=10.0 / s) for s in range(10, 101, 10)))
    append_records(path, base_record(60, event="session_start", session="b"))
    append_records(path, *(base_record(s, session="b", train_loss=20.0 / s) for s in range(70, 151, 10)))
    graph = open_run(page, server, "drawn", 150)
    # The first request to this server is this deep link: it must still get app.py's navigation.
    assert "Training metrics" in page.title()
    assert page.locator("[data-testid='stSidebarNav']").count() == 0
    assert wait_until(page, lambda: page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == 6)
    assert page.evaluate("document.querySelectorAll('iframe .js-plotly-plot').length") == 0
    expected = [(s, 10.0 / s) for s in range(10, 61, 10)] + [(s, 20.0 / s) for s in range(70, 151, 10)]
    assert [x for x, _ in train_points(graph)] == [x for x, _ in expected]
    assert [y for _, y in train_points(graph)] == pytest.approx([y for _, y in expected], rel=1e-6)
    assert [s["x0"] for s in graph["shapes"] if s["type"] == "line"] == [60]
    assert graph["annotations"] == ["S2 · resume @ 60"]


AXIS_JS = """([title, axis]) => {
  const graph = [...document.querySelectorAll('.js-plotly-plot')].find(g => g.layout.title.text === title);
  return graph ? {range: Array.from(graph._fullLayout[axis].range), ticks: graph._fullLayout[axis]._vals.map(v => v.x)}
               : null;
}"""


def test_every_logged_key_is_charted_and_the_filter_keeps_what_matches(
    page: object, server: str, served_root: Path
) -> None:
    """Keys the user logged get charts of their own under their prefix, drawn with their values; a
    constant LR is drawn around 3e-4, not on an axis through 0; a count with nothing counted has whole
    ticks from 0; the chart filter leaves only the charts it matches on the page."""
    path = served_root / "logged" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=4.0 / s, lr=3e-4, skipped_updates_in_window=0,
                                       mfu=0.3 + s / 1e3, **{"sys/gpu_mem_gb": 40.0 + s})
                           for s in range(10, 101, 10)))  # fmt: skip
    open_run(page, server, "logged", 100)
    mfu = wait_until(page, lambda: page.evaluate(GRAPH_JS, "mfu"))
    (raw,) = [trace for trace in mfu["traces"] if trace["name"] == "train · S1"]
    points = sorted(zip(raw["x"], raw["y"], strict=True))
    assert [x for x, _ in points] == list(range(10, 101, 10))
    assert [y for _, y in points] == pytest.approx([0.3 + s / 1e3 for s in range(10, 101, 10)], rel=1e-6)
    # Each chart is drawn in its own time: wait for the one checked, not only for the first.
    assert wait_until(page, lambda: page.evaluate(GRAPH_JS, "sys/gpu_mem_gb")) is not None
    wait_until(page, lambda: page.get_by_role("heading", name="sys").count() == 1)
    low, high = wait_until(page, lambda: page.evaluate(AXIS_JS, ["Learning rate", "yaxis"]))["range"]
    assert 0 < low < 3e-4 < high
    ticks = wait_until(page, lambda: page.evaluate(AXIS_JS, ["Skipped updates", "yaxis2"]))["ticks"]
    assert ticks and ticks[0] == 0 and all(tick == int(tick) for tick in ticks)
    page.get_by_label("Charts (filter)", exact=True).fill("^mfu$")
    page.keyboard.press("Enter")
    wait_until(page, lambda: page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == 1)
    assert page.evaluate(GRAPH_JS, "mfu") is not None


def test_each_chart_links_its_rows_as_csv_from_the_servers_route(page: object, server: str, served_root: Path) -> None:
    """Each live chart carries a link to its rows as CSV, not a download widget redrawn on every
    refresh; the download holds the run's latest records; a name outside the runs root is refused."""
    path = served_root / "csv" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(10, 51, 10)))
    open_run(page, server, "csv", 50)
    wait_until(page, lambda: page.locator(".metrics-chart-csv").count() == 6)
    assert page.locator("[data-testid='stDownloadButton']").count() == 0
    append_records(path, base_record(60, train_loss=0.5))  # not yet drawn: the link reads the run when followed
    sign_in(page, server)  # a download carries the browser's cookie, not the test's Bearer header
    with page.expect_download() as started:
        page.locator(".st-key-chart_loss .metrics-chart-csv").click()
    download = started.value
    rows = list(csv.DictReader(io.StringIO(Path(download.path()).read_text())))
    assert download.suggested_filename == "csv-loss.csv"
    assert [(int(row["step"]), float(row["value"])) for row in rows if row["metric"] == "train_loss"] == [
        *((s, pytest.approx(1.0 / s)) for s in range(10, 51, 10)),
        (60, 0.5),
    ]
    refused = page.request.get(f"{server}/api/csv?run=../csv&chart=loss&history=effective")
    assert refused.status == 404 and "run" in refused.text()


def test_appended_record_appears_and_torn_tail_waits_for_its_newline(
    page: object, server: str, served_root: Path
) -> None:
    """A record from a real writer shows up live; half a line is not drawn until it is completed."""
    run = RunContext(served_root / "appended", "appended", "s1")
    state = TrainingState()
    with MetricsWriter(run) as writer:
        for step in range(10, 51, 10):
            state.step = step
            writer.write("train", state, train_loss=1.0)
    open_run(page, server, "appended", 50)
    with MetricsWriter(RunContext(run.directory, "appended", "s1")) as writer:
        state.step = 60
        writer.write("train", state, train_loss=0.5)
        assert wait_until(page, lambda: last_point(page) == (60, 0.5))
    line = orjson.dumps(base_record(70, session="s1", train_loss=0.25)) + b"\n"
    append_bytes(run.directory / "metrics.jsonl", line[:40])
    page.wait_for_timeout(3000)  # three refresh periods
    assert wait_until(page, lambda: last_step(page)) == 60
    append_bytes(run.directory / "metrics.jsonl", line[40:])
    assert wait_until(page, lambda: last_point(page) == (70, 0.25))


def test_zoom_survives_live_updates(page: object, server: str, served_root: Path) -> None:
    """A user's box-zoom stays put while new records stream in and are drawn; the run's other
    charts follow it to the same x-range and stay there, and a double click resets them all."""
    path = served_root / "zoom" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=5.0 / s) for s in range(10, 1001, 10)))
    open_run(page, server, "zoom", 1000)
    plot = page.locator(".js-plotly-plot").filter(has_text="Loss").locator(".nsewdrag").first
    box = plot.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.5)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5, steps=8)
    page.mouse.up()
    zoomed = wait_until(page, lambda: loss(page)["xrange"] if loss(page)["autorange"] is False else None)
    assert 200 < zoomed[0] < zoomed[1] < 700
    append_records(path, *(base_record(s, train_loss=5.0 / s) for s in range(1010, 1101, 10)))
    wait_until(page, lambda: last_step(page) == 1100)
    after = loss(page)
    assert after["xrange"] == pytest.approx(zoomed)
    assert after["autorange"] is False
    lr = lambda: page.evaluate(GRAPH_JS, "Learning rate")  # noqa: E731
    assert wait_until(page, lambda: lr()["autorange"] is False and lr()["xrange"]) == pytest.approx(zoomed)
    page.mouse.dblclick(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    wait_until(page, lambda: loss(page)["autorange"] is True and lr()["autorange"] is True)


def test_sessions_page_shades_replay_windows_and_shows_the_table(page: object, server: str, served_root: Path) -> None:
    """A three-session run: both replay windows are shaded on the overlay, and the table lists all three."""
    three_session_run(served_root / "resumed" / "metrics.jsonl")
    page.goto(f"{server}/sessions?run=resumed")
    graph = wait_until(page, lambda: page.evaluate(GRAPH_JS, "Loss by session"))
    rects = [shape for shape in graph["shapes"] if shape["type"] == "rect"]
    assert [rect["x0"] for rect in rects] == [60, 120]
    assert any(text.startswith("replay S1→S2") for text in graph["annotations"])
    # The chart can be drawn before the table: plotly.js is requested first on the page, while the
    # grid's own script is loaded lazily by Streamlit when the element arrives.
    (table,) = wait_until(page, lambda: (grids := page.evaluate(GRID_JS, "[data-testid=stMain]"))
                          and len(grids[0]) == 4 and grids)  # fmt: skip
    assert [row[0] for row in table[1:]] == ["S1", "S2", "S3"]


def test_a_link_opened_before_the_run_exists_shows_it_once_it_does(
    page: object, server: str, served_root: Path
) -> None:
    """A colleague's link to a run that has not written yet turns into its charts without a reload."""
    page.goto(f"{server}/run?run=later")
    wait_until(page, lambda: page.get_by_text("no run there").count() > 0)
    append_records(served_root / "later" / "metrics.jsonl", *(base_record(s, train_loss=1.0) for s in (10, 20)))
    assert wait_until(page, lambda: (g := loss(page)) and train_points(g)[-1][0] == 20)


def test_straggler_chart_config_and_differing_keys_are_drawn(page: object, server: str, served_root: Path) -> None:
    """A 4-rank run: the rank step-time band with its slowest rank and lockstep mark; the config with the
    LR changed at resume; and on /compare the keys that differ from another run."""
    path = served_root / "ranks" / "metrics.jsonl"
    distributed_run(path)
    append_records(path, base_record(0, event="config", session="s1", config={"optim": {"lr": 3e-4}, "model": "gpt2"}))
    append_records(path, base_record(60, event="config", session="s2", config={"optim": {"lr": 1e-4}, "model": "gpt2"}))
    append_records(served_root / "ranks-other" / "metrics.jsonl", base_record(10, train_loss=1.0),
                   base_record(10, event="config", config={"optim": {"lr": 1e-4}, "model": "llama"}))  # fmt: skip
    page.goto(f"{server}/run?run=ranks")
    graph = wait_until(page, lambda: page.evaluate(GRAPH_JS, STRAGGLER_TITLE))
    band = {t["name"]: t for t in graph["traces"]}
    assert band["rank step time, fastest–slowest · S2"]["x"] == list(range(70, 151, 10))
    assert band["fastest rank · S2"]["y"] == pytest.approx([0.1] * 9)
    assert band["ranks out of lockstep"]["x"] == [50]
    assert wait_until(page, lambda: page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == 7)
    hover = page.evaluate(f"""() => [...document.querySelectorAll('.js-plotly-plot')]
        .find(g => g.layout.title.text === {STRAGGLER_TITLE!r}).data[4].customdata[0][0]""")
    assert hover == "1"  # the slowest rank of S2's windows, shown as "slowest: rank 1"
    popover_text(page, "Config")
    config, changes = wait_until(page, lambda: (grids := page.evaluate(GRID_JS, "[data-testid=stPopoverBody]"))
                                 and len(grids) == 2 and all(len(g) > 1 for g in grids) and grids)  # fmt: skip
    assert config == [["key", "value"], ["optim.lr", "0.0001"], ["model", "gpt2"]]
    assert changes[1] == ["S2", "60", "optim.lr", "0.0003", "0.0001"]
    page.goto(f"{server}/compare?run=ranks&run=ranks-other")
    (diff,) = wait_until(page, lambda: (grids := page.evaluate(GRID_JS, "[data-testid=stMain]")) and grids
                         and len(grids[0]) > 1 and grids)  # fmt: skip
    assert diff[1:] == [["model", "gpt2", "llama"]]
    assert diff[0][1:] == ["ranks", "ranks-other"]


# In the page: the body sizes of the live route's answers so far (live/push.py), oldest first.
ANSWERS_JS = """() => performance.getEntriesByType('resource')
  .filter(e => e.name.includes('/api/changes')).map(e => e.decodedBodySize)"""


def test_a_live_update_sends_only_the_new_points(page: object, server: str, served_root: Path) -> None:
    """Ten records appended to a 1,000-record run reach the page in a few KB (extended traces), not
    the ~150 KB of six whole figures, and the drawn data is exactly the run's (steps beyond what
    the drawn arrays' integer type holds included)."""
    path = served_root / "bytes" / "metrics.jsonl"
    record = lambda s: base_record(s, train_loss=5.0 / s, grad_norm_avg=1.0, lr=1e-4)  # noqa: E731
    append_records(path, *map(record, range(10, 10_001, 10)))
    received: list[int] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda frame: received.append(len(frame))))
    open_run(page, server, "bytes", 10_000)
    page.wait_for_timeout(2000)
    received.clear()
    answered = len(page.evaluate(ANSWERS_JS))
    appended = range(40_010, 40_101, 10)  # steps 10..10,000 travel as int16
    append_records(path, *map(record, appended))
    wait_until(page, lambda: last_step(page) == 40_100)
    page.wait_for_timeout(1500)  # the update's remaining messages
    # The update travels as the route's answer (six extends and the status line, a few KB), or as
    # a rerun's messages where the page changed otherwise (the health panel). A whole figure of
    # 1,000 points is ~25 KB: no message may carry one, and all together stay far below six of them.
    messages = received + page.evaluate(ANSWERS_JS)[answered:]
    assert messages and max(messages) < 8_000, messages
    assert sum(messages) < 60_000, messages
    points = train_points(wait_until(page, lambda: loss(page)))
    steps = [*range(10, 10_001, 10), *appended]
    assert [x for x, _ in points] == steps
    assert [y for _, y in points] == pytest.approx([5.0 / s for s in steps], rel=1e-6)


CHART_JS = "(title) => [...document.querySelectorAll('.metrics-chart')].find(g => g.layout?.title.text === title)"

BELOW_FOLD_JS = """() => {
  const graphs = [...document.querySelectorAll('.metrics-chart')];
  const below = graphs.filter(g => g.getBoundingClientRect().top > innerHeight);
  return below.length && below.at(-1).layout ? below.at(-1).layout.title.text : null;
}"""

LAST_X_JS = f"""(title) => {{
  const graph = ({CHART_JS})(title);
  const last = (values) => Math.max(...Array.from(values || []).filter(Number.isFinite), -1);
  return {{
    data: Math.max(...graph.data.map(trace => last(trace.x))),
    drawn: Math.max(...graph.calcdata.map(points => last(points.map(point => point.x)))),
    top: graph.getBoundingClientRect().top,
  }};
}}"""


def test_a_chart_out_of_view_takes_an_update_and_draws_it_when_scrolled_to(
    page: object, server: str, served_root: Path
) -> None:
    """An append redraws the charts in view; a chart below the fold takes the new points into its
    data at once (what it holds stays what the server extends) but is drawn only when it comes
    into view, then with the new point."""
    path = served_root / "fold" / "metrics.jsonl"
    extra = lambda s: {"extra/a": s, "extra/b": -s}  # noqa: E731
    record = lambda s: base_record(s, train_loss=1.0 / s, grad_norm_avg=1.0, lr=1e-4, **extra(s))  # noqa: E731
    append_records(path, *map(record, range(10, 51, 10)))
    open_run(page, server, "fold", 50)
    title = wait_until(page, lambda: page.evaluate(BELOW_FOLD_JS))
    assert wait_until(page, lambda: page.evaluate(LAST_X_JS, title)["drawn"] == 50)
    append_records(path, record(60))
    assert wait_until(page, lambda: last_step(page) == 60)
    assert wait_until(page, lambda: page.evaluate(LAST_X_JS, title)["data"] == 60)
    page.wait_for_timeout(500)
    below = page.evaluate(LAST_X_JS, title)
    assert below["top"] > 1100 and below["drawn"] == 50, below
    page.evaluate(f"(title) => ({CHART_JS})(title).scrollIntoView()", title)
    assert wait_until(page, lambda: page.evaluate(LAST_X_JS, title)["drawn"] == 60)


def test_an_idle_tab_gets_nothing_and_an_append_arrives_without_a_rerun(
    page: object, server: str, served_root: Path
) -> None:
    """With nothing appended the run page is not rerun every refresh period (it receives nothing:
    the server says when the run changed).  An appended record then reaches the charts and the
    status line from the server's answer alone: still no websocket message, so no script run for
    this tab.  A new session changes more than the charts: that one is a rerun, and draws its key."""
    path = served_root / "idle" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(10, 51, 10)))
    received: list[int] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda frame: received.append(len(frame))))
    open_run(page, server, "idle", 50)
    status = page.locator(".metrics-status")
    assert "1 session(s) · 5 records" in status.inner_text()
    page.wait_for_timeout(1500)  # the first run's last messages
    received.clear()
    page.wait_for_timeout(3000)  # three refresh periods
    assert received == []
    append_records(path, base_record(60, train_loss=0.5))
    assert wait_until(page, lambda: last_point(page) == (60, 0.5))
    assert wait_until(page, lambda: "6 records" in status.inner_text())
    page.wait_for_timeout(1000)
    assert received == []
    append_records(path, base_record(55, event="session_start", session="again"), base_record(60, session="again"))
    assert wait_until(page, lambda: "S2" in page.locator(".st-key-session_key").inner_text())
    assert received


def test_a_chart_drawn_again_after_navigating_away_gets_the_whole_figure(
    page: object, server: str, served_root: Path
) -> None:
    """The session remembers what it sent, the new page does not hold it: it asks, and is sent, the whole figure."""
    path = served_root / "back" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(10, 101, 10)))
    open_run(page, server, "back", 100)
    # Away and back by the pages' own links: the same session, no browser history (a history
    # step could land on about:blank when the top-bar click replaced the entry instead).
    page.get_by_text("Its sessions").first.click()
    back = page.get_by_text("Back to the run's charts")
    wait_until(page, lambda: "/sessions" in page.url and back.count() and loss(page) is None)
    append_records(path, base_record(110, train_loss=0.5))
    back.first.click()
    graph = wait_until(page, lambda: (g := loss(page)) and train_points(g) and train_points(g)[-1][0] == 110 and g)
    assert [x for x, _ in train_points(graph)] == list(range(10, 111, 10))


def test_zooming_in_draws_every_raw_record_in_range_and_zooming_out_the_whole_run(
    page: object, server: str, served_root: Path
) -> None:
    """A 30k-record run: zoomed to 1,000 records, all 1,000 are drawn raw (the whole-run chart holds a
    fraction there), the zoom stays through a live update, and autoscale returns to the whole run."""
    path = served_root / "deep" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=2.0 + 1.0 / s) for s in range(10, 300_001, 10)))
    open_run(page, server, "deep", 300_000)
    in_range = lambda graph: [x for x, _ in train_points(graph) if 100_005 <= x <= 110_000]  # noqa: E731
    assert len(in_range(loss(page))) < 500
    relayout = """(update) => Plotly.relayout(
        [...document.querySelectorAll('.js-plotly-plot')]
        .find(g => g.layout.title.text === 'Loss'), update)"""
    page.evaluate(relayout, {"xaxis.range": [100_005, 110_000]})
    zoomed = wait_until(page, lambda: len(in_range(loss(page))) == 1000 and loss(page), timeout=30)
    assert in_range(zoomed) == list(range(100_010, 110_001, 10))
    assert zoomed["xrange"] == pytest.approx([100_005, 110_000])
    append_records(path, base_record(300_010, train_loss=2.0))
    wait_until(page, lambda: last_step(page) == 300_010, timeout=30)
    assert loss(page)["xrange"] == pytest.approx([100_005, 110_000]) and len(in_range(loss(page))) == 1000
    page.evaluate(relayout, {"xaxis.autorange": True})
    wait_until(page, lambda: len(in_range(loss(page))) < 500, timeout=30)


# Before the page's scripts: plotly.js's extendTraces and react wrapped to fail on the Loss chart when
# the test asks (window.__failExtend: once; window.__failLoss: every whole draw), and the chart's
# failure note recorded as it appears.
FAILING_PLOTLY = r"""
let plotly;
const isLoss = (graph) => graph.layout && graph.layout.title && graph.layout.title.text === "Loss";
Object.defineProperty(window, "Plotly", {
  configurable: true, get: () => plotly,
  set: (value) => {
    plotly = value;
    const { extendTraces, react } = value;
    value.extendTraces = function (graph, ...rest) {
      if (window.__failExtend && isLoss(graph)) {
        window.__failExtend = false;
        throw new Error("injected extend failure");
      }
      return extendTraces.call(this, graph, ...rest);
    };
    value.react = function (graph, data, layout, ...rest) {
      if (window.__failLoss && layout && layout.title && layout.title.text === "Loss") {
        throw new Error("injected draw failure");
      }
      return react.call(this, graph, data, layout, ...rest);
    };
  },
});
new MutationObserver(() => {
  const note = document.querySelector(".st-key-chart_loss .metrics-chart-note");
  if (note) window.__notes = [...new Set([...(window.__notes || []), note.textContent])];
}).observe(document, { subtree: true, childList: true, characterData: true });
"""


def test_a_live_update_that_fails_to_draw_is_said_and_drawn_again_in_full(
    page: object, server: str, served_root: Path
) -> None:
    """plotly.js throws while appending the new points to the loss chart: the chart says so in its
    place instead of freezing on old data, asks for the whole figure, draws it with the new record,
    and the note goes."""
    path = served_root / "failing" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(10, 51, 10)))
    page.add_init_script(FAILING_PLOTLY)
    open_run(page, server, "failing", 50)
    page.evaluate("window.__failExtend = true")
    append_records(path, base_record(60, train_loss=0.5))
    assert wait_until(page, lambda: last_point(page) == (60, 0.5), timeout=30)
    assert page.evaluate("window.__failExtend") is False  # the failure did happen
    notes = page.evaluate("window.__notes")
    assert notes and "could not be updated (injected extend failure)" in notes[0], notes
    wait_until(page, lambda: page.evaluate("!document.querySelector('.metrics-chart-note')"), timeout=10)
    append_records(path, base_record(70, train_loss=0.25))  # and it goes on updating
    assert wait_until(page, lambda: last_point(page) == (70, 0.25), timeout=30)


def test_a_chart_that_cannot_be_drawn_says_why_in_its_place(page: object, server: str, served_root: Path) -> None:
    """plotly.js refuses the loss chart's figure: its place says so (as text), and the other charts
    draw."""
    path = served_root / "undrawable" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(10, 51, 10)))
    page.add_init_script(FAILING_PLOTLY)
    page.add_init_script("window.__failLoss = true")
    page.goto(f"{server}/run?run=undrawable")
    note = ".st-key-chart_loss .metrics-chart-note"
    wait_until(page, lambda: page.evaluate(f"!!document.querySelector({note!r})"), timeout=60)
    text = page.evaluate(f"document.querySelector({note!r}).textContent")
    assert text == "This chart could not be drawn (injected draw failure). Reload the page to try again."
    drawn = "[...document.querySelectorAll('.metrics-chart')].filter(g => g.querySelector('.main-svg')).length"
    assert wait_until(page, lambda: page.evaluate(drawn) == 5, timeout=30)  # every chart but the loss


def test_a_double_click_shows_every_point_and_a_live_update_keeps_it_so(
    page: object, server: str, served_root: Path
) -> None:
    """A decaying loss with one bad batch of 40: the default range draws the whole curve from its
    first point and leaves the spike at the edge; a double-click shows every point, and the live
    update that brings a new default range keeps showing them."""
    path = served_root / "spike" / "metrics.jsonl"
    losses = {s: 40.0 if s == 150 else 3.0 / (1 + s / 20) for s in range(1, 301)}
    append_records(path, *(base_record(s, train_loss=losses[s]) for s in range(1, 301)))
    open_run(page, server, "spike", 300)
    low, high = wait_until(page, lambda: page.evaluate(AXIS_JS, ["Loss", "yaxis"]))["range"]
    assert low <= min(losses.values()) and losses[1] <= high < 40.0
    page.locator(".st-key-chart_loss .nsewdrag").first.dblclick()
    assert wait_until(page, lambda: page.evaluate(AXIS_JS, ["Loss", "yaxis"])["range"][1] >= 40.0)
    append_records(path, *(base_record(s, train_loss=3.0 / (1 + s / 20)) for s in range(301, 601)))
    wait_until(page, lambda: last_step(page) == 600)
    assert page.evaluate(AXIS_JS, ["Loss", "yaxis"])["range"][1] >= 40.0
