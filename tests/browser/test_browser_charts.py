"""What a first-time reader of a run's charts sees in a real Chromium, at desktop and phone widths:
a legend on every chart of more than one line, the session key whole, the toolbar off the plot,
why the run stopped on every page, and a killed writer read as crashed."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from metrics_core.testing.live_server import list_only, wait_until
from tests.support import DESKTOP, append_records, base_record, spawn_python

REASON = "ValueError: loss went to the moon"
VIEWS = {"desktop": DESKTOP, "phone": {"width": 390, "height": 844}}


def served_runs(root: Path) -> None:
    """ "keyed": three sessions (resumes at 60 and 120), train and validation loss, a constant LR, no
    skipped update, extra keys, and a last session that failed."""
    path = root / "keyed" / "metrics.jsonl"
    for session, start, end, resumed in (("s1", 0, 100, None), ("s2", 60, 150, 60), ("s3", 120, 200, 120)):
        records = [base_record(start, event="session_start", session=session, resumed_from_step=resumed)]
        for step in range(start + 10, end + 1, 10):
            records.append(base_record(step, session=session, train_loss=10.0 / step, lr=3e-4, skipped_updates=0,
                                       skipped_updates_in_window=0, mfu=0.3 + step / 1e3))  # fmt: skip
            if step % 50 == 0:
                records.append(base_record(step, event="validation", session=session, val_loss=20.0 / step))
        append_records(path, *records)
    append_records(path, base_record(200, event="session_end", session="s3", status="failed", error=REASON))
    append_records(
        root / "other" / "metrics.jsonl", *(base_record(s, train_loss=8.0 / s, lr=3e-4) for s in range(10, 201, 10))
    )


# In the page: per chart, its lines (traces with points drawn: not legend entries, session-start or
# off-scale markers), whether plotly.js drew its legend and which entries, and where the legend,
# the toolbar and the plot area are, relative to the chart.
CHARTS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(g => {
  const box = (el) => { if (!el) return null; const r = el.getBoundingClientRect(), c = g.getBoundingClientRect();
                        return {left: r.left - c.left, top: r.top - c.top, right: r.right - c.left,
                                bottom: r.bottom - c.top, width: c.width, height: c.height}; };
  const lines = g.data.filter(t => t.hoverinfo !== 'skip' && t.yaxis !== 'y3' && t.x && t.x.length);
  return {title: g.layout.title.text, lines: lines.length, showlegend: g._fullLayout.showlegend,
          entries: [...g.querySelectorAll('.infolayer .legend .traces')].map(t => t.textContent),
          legend: box(g.querySelector('.infolayer .legend')), toolbar: box(g.querySelector('.modebar')),
          plot: box(g.querySelector('.nsewdrag'))};
})"""


@pytest.mark.parametrize("view", list(VIEWS))
def test_every_chart_of_two_lines_or_more_has_its_legend_in_view(browser: object, server: str, view: str) -> None:
    """On the run page, desktop and phone: every chart drawing two lines or more shows a legend, inside
    the chart (train and validation, raw and smoothed, each session); the toolbar sits above the plot,
    never on it; the page's session key shows every session, not cut off."""
    context = browser.new_context(viewport=VIEWS[view])
    page = context.new_page()
    try:
        page.goto(f"{server}/run?run=keyed")
        wait_until(page, lambda: len(page.evaluate(CHARTS_JS)) >= 7, timeout=60)
        page.locator(".js-plotly-plot").first.hover()  # plotly.js shows the toolbar on hover
        charts = {chart["title"]: chart for chart in page.evaluate(CHARTS_JS)}
        loss = charts["Loss"]
        sessions = ["S1 · start", "S2 · resume @ 60", "S3 · resume @ 120"]
        assert loss["entries"] == ["train", "validation", "raw (unsmoothed)", *sessions]
        assert charts["mfu"]["entries"] == ["train", "raw (unsmoothed)", *sessions]
        assert charts["Skipped updates"]["entries"] == ["per window", "cumulative", *sessions]
        for title, chart in charts.items():
            if chart["lines"] >= 2:
                assert chart["showlegend"] and chart["entries"], f"{title}: {chart['lines']} lines, no legend"
                legend = chart["legend"]
                assert legend["left"] >= 0 and legend["right"] <= legend["width"] + 1, title
                assert legend["bottom"] <= legend["height"] + 1, title
                assert chart["plot"]["bottom"] - chart["plot"]["top"] >= 180, f"{title}: the legend squashed the plot"
        toolbar, plot = loss["toolbar"], loss["plot"]
        assert toolbar is not None and toolbar["bottom"] <= plot["top"] and toolbar["right"] <= toolbar["width"] + 1
        key = page.locator(".st-key-session_key p")
        assert "S3" in key.inner_text()
        assert key.evaluate("p => p.scrollWidth <= p.clientWidth + 1"), "the session key is cut off"
    finally:
        context.close()


def test_the_sessions_and_compare_charts_carry_their_key_on_a_phone(browser: object, server: str) -> None:
    """At phone width the sessions page's chart names each session in its legend, and every chart of
    the compare page names both runs in its own legend (not only the first chart)."""
    context = browser.new_context(viewport=VIEWS["phone"])
    page = context.new_page()
    try:
        page.goto(f"{server}/sessions?run=keyed")
        wait_until(page, lambda: page.evaluate(CHARTS_JS), timeout=60)
        (overlay,) = wait_until(page, lambda: [c for c in page.evaluate(CHARTS_JS) if c["entries"]], timeout=30)
        assert overlay["entries"][-3:] == ["S1 · start", "S2 · resume @ 60", "S3 · resume @ 120"]
        page.goto(f"{server}/compare?run=keyed&run=other")
        charts = wait_until(page, lambda: len(charts := page.evaluate(CHARTS_JS)) >= 5 and charts, timeout=60)
        assert sum(chart["lines"] >= 2 for chart in charts) >= 2
        for chart in charts:
            runs = [entry for entry in chart["entries"] if entry.startswith(("keyed", "other"))]
            assert chart["lines"] < 2 or (chart["showlegend"] and len(runs) == 2), chart
    finally:
        context.close()


# In the page: the cells of the runs table's row of the run named by the argument (its link's text ends "run=<name>").
RUN_ROW_JS = """(name) => {
  const rows = [...document.querySelectorAll('[data-testid=stDataFrame] tbody tr')]
    .map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent));
  return rows.find(row => row.length && row[0].endsWith('run=' + name)) || [];
}"""


def test_why_the_run_failed_is_on_the_runs_the_run_and_the_sessions_pages(page: object, server: str) -> None:
    """The failed session's exception reads on `/` (the run's row), above the run's charts and above
    the sessions table."""
    page.goto(f"{server}/")
    list_only(page, "^keyed$", ["keyed"])  # other modules' newer runs push its row out of the grid's view
    row = wait_until(page, lambda: page.evaluate(RUN_ROW_JS, "keyed"), timeout=30)
    assert "✕ failed" in row and REASON in row, row
    for path in ("/run?run=keyed", "/sessions?run=keyed"):
        page.goto(f"{server}{path}")
        alert = page.locator("[data-testid=stAlert]", has_text=REASON)
        alert.wait_for(timeout=30_000)
        assert f"Failed: {REASON}" in alert.inner_text()


WRITER = """
import sys, time
from pathlib import Path
from metrics_core import MetricsWriter, RunContext, TrainingState
state = TrainingState()
with MetricsWriter(RunContext(Path(sys.argv[1]), "doomed", "s1")) as writer:
    while True:
        state.step += 10
        writer.write("train", state, train_loss=1.0 / state.step)
        print(state.step, flush=True)
        time.sleep(0.2)
"""


def test_a_sigkilled_writer_reads_crashed_on_the_runs_page_long_before_the_heartbeat(
    page: object, server: str, served_root: Path
) -> None:
    """A writer killed with SIGKILL while `/` shows its run live: the row turns crashed from its
    writer's lock let go, not after the 60 s without a record the heartbeat rule waits for."""
    writer = spawn_python(WRITER, str(served_root / "doomed"))
    try:
        assert int(writer.stdout.readline()) == 10
        page.goto(f"{server}/")
        status = lambda: page.evaluate(RUN_ROW_JS, "doomed")  # noqa: E731
        wait_until(page, lambda: "● live" in status(), timeout=30)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        wait_until(page, lambda: "✕ crashed" in status(), timeout=20)  # two refreshes are 2 s; heartbeat: 60 s
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
