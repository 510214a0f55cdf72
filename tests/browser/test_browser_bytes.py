"""Bytes over the wire on a repeat page load, in a real headless Chromium against a real
`streamlit run`: plotly.js comes from the browser's cache, not again through the server, and the
dashboard's reload costs at most 3x a bare Streamlit app's reload (one st.plotly_chart of the same
run) + 200 KB.  Bytes are what Chromium's network events count: every HTTP response's
encodedDataLength (headers and body as received, 0 for a cache hit) plus every websocket frame
received.

The first load (cold browser cache) is held under TensorBoard's: 2.18 MB measured by
benchmarks/bench_rivals.py for the same kind of page (docs/PERFORMANCE.md).  Ours was 4.1 MB while
Streamlit sent its static bundles uncompressed; app.py's st.App gzips them (serving.py): 1.79 MB
here (50-record run), which leaves ~18 % for Streamlit's chunks to grow.  Websocket bytes count as decoded
payload, so websocket compression does not show here."""

from __future__ import annotations

from pathlib import Path

from metrics_core.testing.live_server import (
    Wire,
    installed_dashboard,
    live_charts_drawn,
    streamlit_app,
    streamlit_server,
    wait_until,
)
from tests.support import DESKTOP, small_run

PLOTLY_ROUTE = "/_stcore/bidi-components/metrics-core.plotly/plotly-"
BUDGET_FACTOR, BUDGET_SLACK = 3, 200_000
TENSORBOARD_FIRST_LOAD = 2_180_000  # bytes, bench_rivals.py: TensorBoard 2.21 on a 1k-record run

BARE_APP = """
import sys
import streamlit as st
from metrics_core.dashboard.figures.metric_figures import metric_figure
from metrics_core.dashboard.views.chart_specs import Series
from metrics_core.dashboard.store.run_store import RunStore

view = RunStore(sys.argv[1]).view("small")
st.plotly_chart(metric_figure([Series(view.effective("train"), "train_loss", "train")], title="Loss",
                              sessions=view.sessions))
"""


def reload_bytes(browser: object, url: str, settle_ms: int = 2000) -> Wire:
    """Open ``url`` until its live chart is drawn, then reload it in the same context (so with its HTTP
    cache) and count what the reload received until the live chart is drawn again and ``settle_ms``
    have passed."""
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        wire = Wire(context, page)
        page.goto(url)
        wait_until(page, lambda: live_charts_drawn(page), timeout=60)
        page.wait_for_timeout(settle_ms)
        wire.first = dict(wire.http)  # the cold load, kept for the assertions
        wire.first_frames = wire.frames
        wire.reset()
        page.reload()
        wait_until(page, lambda: live_charts_drawn(page), timeout=60)
        page.wait_for_timeout(settle_ms)
        return wire
    finally:
        context.close()


def served_runs(root: Path) -> None:
    """This module's runs in the shared dashboard's ``served_root`` (browser/conftest.py): a short run, ``small``."""
    small_run(root / "small" / "metrics.jsonl")


def test_a_reload_takes_plotly_js_from_the_cache_and_costs_little_more_than_a_bare_app(
    browser: object, served_root: Path, tmp_path: Path
) -> None:
    """Reload /run in the same browser: plotly.js is not received again, and the reload's bytes are
    <= 3x a bare st.plotly_chart app's reload + 200 KB.  The cold first load stays under
    TensorBoard's."""
    app = tmp_path / "bare.py"
    app.write_text(BARE_APP)
    with streamlit_app(app, str(served_root)) as url:
        bare = reload_bytes(browser, url + "/")
    with streamlit_server(served_root) as url:
        ours = reload_bytes(browser, f"{url}/run?run=small")
    budget = BUDGET_FACTOR * bare.total + BUDGET_SLACK
    plotly_first = {u: n for u, n in ours.first.items() if PLOTLY_ROUTE in u}
    plotly_reload = {u: n for u, n in ours.http.items() if PLOTLY_ROUTE in u}
    first_load = sum(ours.first.values()) + ours.first_frames
    print(f"\nreload bytes: dashboard {ours.total:,} (http {sum(ours.http.values()):,}, websocket {ours.frames:,}); "
          f"bare st.plotly_chart {bare.total:,} (http {sum(bare.http.values()):,}, websocket {bare.frames:,}); "
          f"budget {budget:,}; plotly.js cold {sum(plotly_first.values()):,}, on reload {plotly_reload}; "
          f"first load {first_load:,} (http {sum(ours.first.values()):,}, websocket {ours.first_frames:,}), "
          f"TensorBoard's {TENSORBOARD_FIRST_LOAD:,}")  # fmt: skip
    assert plotly_first and sum(plotly_first.values()) > 300_000  # the cold load fetched plotly.js (396 KB gzipped)
    assert all(n == 0 or u in ours.cached for u, n in plotly_reload.items()), plotly_reload
    assert sum(plotly_reload.values()) == 0
    assert ours.total <= budget
    assert first_load <= TENSORBOARD_FIRST_LOAD


def test_the_installed_command_draws_the_live_chart_and_the_browser_keeps_plotly_js(
    browser: object, served_root: Path, wheel_venv: Path, tmp_path: Path
) -> None:
    """``metrics-dashboard`` of a wheel installed in a venv of its own, started outside the checkout:
    /run draws its live chart, the cold load fetches plotly.js as a file (Streamlit found the package's
    component manifest in the installed wheel), and a reload takes it from the browser's cache."""
    with installed_dashboard(wheel_venv, served_root, "--refresh", "1", cwd=tmp_path) as (
        url,
        _,
    ):  # as streamlit_server
        wire = reload_bytes(browser, f"{url}/run?run=small")
    plotly_first = {u: n for u, n in wire.first.items() if PLOTLY_ROUTE in u}
    plotly_reload = {u: n for u, n in wire.http.items() if PLOTLY_ROUTE in u}
    print(f"\ninstalled: reload {wire.total:,} bytes (websocket {wire.frames:,}); plotly.js cold "
          f"{sum(plotly_first.values()):,}, on reload {plotly_reload}")  # fmt: skip
    assert plotly_first and sum(plotly_first.values()) > 300_000
    assert sum(plotly_reload.values()) == 0
    assert wire.frames < 1_000_000  # plotly.js (1.2 MB) does not ride in the page's websocket instead
