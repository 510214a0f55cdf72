"""A sweep in a real headless Chromium against a real `streamlit run`: the runs table shows the swept
config keys as columns (not the shared ones), two ticked rows open together on the compare page, and
the sweep page draws a chart per swept key whose zoom narrows the runs it lists, every control in
its URL."""

from __future__ import annotations

import math
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

from metrics_core.testing.live_server import (
    GRID_JS,
    RUN_ROWS_JS,
    click,
    list_only,
    live_charts_drawn,
    row_point,
    wait_until,
)
from tests.support.sweeps import NAMES_ORDER, SEEDS, SWEPT, sweep_run_name, write_sweep

HEADERS_JS = "[...document.querySelectorAll('[data-testid=stDataFrame] thead th')].map(h => h.textContent)"
# The sweep page's charts: each graph's x-axis title and how many points it draws in colour and faded.
SWEEP_CHARTS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].filter(g => g.layout && g.data)
  .map(g => ({key: g.layout.xaxis.title.text, y: g.layout.yaxis.title.text, type: g.layout.xaxis.type,
              chosen: g.data[0].x.length, others: g.data[1].x.length}))"""


def served_runs(root: Path) -> None:
    """The 12 runs of a 3 peak_lr × 4 seed sweep, written with the project's writer."""
    write_sweep(root)


NAMES = NAMES_ORDER


def test_the_runs_table_shows_the_swept_keys_and_two_ticked_rows_open_the_compare_page(
    page: object, server: str
) -> None:
    """Filtered to the sweep, the table's columns after the run and its status are the swept keys
    (init, peak_lr, seed), the shared ones (model, warmup, optim.*) nowhere; two ticked rows offer
    "Compare 2 runs", which opens the compare page with both runs in its URL, in this tab."""
    page.goto(server + "/")
    list_only(page, "^sweep-", NAMES)  # the shared root's other runs differ in the shared keys too
    headers = wait_until(page, lambda: (found := page.evaluate(HEADERS_JS)) and "seed" in found and found)
    assert headers[headers.index("run") :][:5] == ["run", "status", *SWEPT]
    assert not {"model", "warmup", "optim.name", "optim.betas"} & set(headers)
    first, second = (page.evaluate(RUN_ROWS_JS)["names"][row].removeprefix("run?run=") for row in (0, 1))
    click(page, *row_point(page, first, 17))
    link = page.get_by_role("link", name="Open the run")
    link.wait_for(timeout=20_000)
    click(page, *row_point(page, second, 17))
    compare = page.get_by_role("link", name="Compare 2 runs")
    compare.wait_for(timeout=20_000)
    compare.click()
    wait_until(page, lambda: urlsplit(page.url).path == "/compare" and live_charts_drawn(page), timeout=30)
    assert sorted(parse_qs(urlsplit(page.url).query)["run"]) == sorted([first, second])
    assert len(page.context.pages) == 1


def test_the_sweep_page_charts_the_swept_keys_and_a_zoom_narrows_its_runs(page: object, server: str) -> None:
    """``/sweep?run=…&metric=val_acc&value=best``: one chart per swept key (peak_lr on a log axis), none
    of a shared key, the metric's best (the greatest accuracy) on y, all 12 runs listed; zooming peak_lr's
    chart to around 3e-4 lists that rate's 4 runs, fades the others on the other charts, and puts the
    range in the URL, which a fresh tab opens to the same 4 runs."""
    query = urlencode([*(("run", name) for name in NAMES), ("metric", "val_acc"), ("value", "best")])
    page.goto(f"{server}/sweep?{query}")
    wait_until(page, lambda: live_charts_drawn(page, len(SWEPT)), timeout=60)
    charts = {chart["key"]: chart for chart in page.evaluate(SWEEP_CHARTS_JS)}
    assert sorted(charts) == SWEPT and charts["peak_lr"]["type"] == "log"
    assert all(chart["chosen"] == len(NAMES) and chart["y"] == "val_acc (best, max)" for chart in charts.values())

    def listed() -> list[str]:  # the runs table's names, none while it is not drawn yet
        grids = page.evaluate(GRID_JS, "")
        return [row[0] for row in grids[0][1:]] if grids else []

    wait_until(page, lambda: len(listed()) == len(NAMES), timeout=30)
    page.evaluate(
        """([low, high]) => {
          const graphs = [...document.querySelectorAll('.js-plotly-plot')];
          const graph = graphs.find(g => g.layout.xaxis.title.text === 'peak_lr');
          return window.Plotly.relayout(graph, {'xaxis.range[0]': low, 'xaxis.range[1]': high});
        }""",
        [math.log10(2e-4), math.log10(5e-4)],
    )
    kept = sorted(sweep_run_name(3e-4, seed) for seed in SEEDS)
    wait_until(page, lambda: sorted(name.removeprefix("run?run=") for name in listed()) == kept, timeout=30)
    seed_chart = wait_until(
        page, lambda: next((c for c in page.evaluate(SWEEP_CHARTS_JS) if c["key"] == "seed" and c["chosen"] == 4), None)
    )
    assert seed_chart["others"] == len(NAMES) - 4
    shared = wait_until(page, lambda: "range=" in page.url and page.url)
    assert parse_qs(urlsplit(shared).query)["metric"] == ["val_acc"]
    fresh = page.context.new_page()
    fresh.goto(shared)
    wait_until(fresh, lambda: live_charts_drawn(fresh, len(SWEPT)), timeout=60)
    again = lambda: [row[0] for grid in fresh.evaluate(GRID_JS, "")[:1] for row in grid[1:]]  # noqa: E731
    wait_until(fresh, lambda: sorted(name.removeprefix("run?run=") for name in again()) == kept, timeout=30)
