"""Where the first chart's time goes on a cold `/run` load, ours against plain serving and against
a bare Streamlit app.

Run: python benchmarks/bench_first_chart.py [--rounds 6] [--warm 3] [--via-runs] [--tools ours,plain,bare]

Each round, alternately, the tools of ``--tools``: ``ours`` is app.py as served (``serving.py``'s
middleware and lifespan), ``plain`` the same app as plain Streamlit serves it
(``METRICS_SERVE_PLAIN=1``), ``bare`` a Streamlit app of one ``st.plotly_chart`` of the same run's
loss (the figure ``metric_figures.metric_figure`` makes of it): the 1k-record three-session run of
``bench_rivals.py``, a fresh server, a fresh headless Chromium, then marks in milliseconds from
navigation, read in the page (``performance.now()``):

* ``scripts``: every script the HTML names has arrived (the last ``responseEnd`` before the
  websocket) — Streamlit's bundles;
* ``root``: Streamlit's React root is in the page;
* ``socket``: its websocket is open (after ``_stcore/health`` and ``host-config``);
* ``loader``: the element that loads plotly.js is in the page (the first script run's deltas have
  arrived and been rendered; ours only);
* ``plotly``: ``window.Plotly`` is set (plotly.js downloaded and run; ours only);
* ``chart``: plotly's ``.main-svg`` of the first chart, shown — what ``bench_rivals.py`` calls drawn;
* ``live``: the same in a Streamlit element: the live chart (the bare app's ``st.plotly_chart``);
plus ``wall``: the same as seen from the benchmark, polled every 20 ms.
Medians per mark; then each tool's median ``live`` over the first tool's (with ``bare`` among the
tools: ours over bare, the goal being at most 1.1).
``--warm N``: the N loads that follow the cold one in the same browser instead (a reader reopening
the page: Streamlit's bundles and plotly.js come from the HTTP cache, their compiled code from
Chromium's code cache where it keeps it).  ``--via-runs``: each load is a click on the runs page
(the same document, no reload: how a reader usually reaches a chart), marks counted from the click;
ours and plain only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_rivals import DRAWN_JS, RECORDS, RUN, Ours, load
from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import CHART_SHOWN_JS, chromium, streamlit_app

MARKS = ("scripts", "root", "socket", "loader", "plotly", "chart", "live")

# Installed before the page's own scripts: records when each mark is first reached.
PROBE = r"""
window.__marks = {};
const mark = (name) => { if (!(name in window.__marks)) window.__marks[name] = performance.now(); };
const NativeSocket = window.WebSocket;
window.WebSocket = function (...args) {
  const socket = new NativeSocket(...args);
  socket.addEventListener("open", () => mark("socket"));
  return socket;
};
window.WebSocket.prototype = NativeSocket.prototype;
Object.assign(window.WebSocket, NativeSocket);
let plotly;
Object.defineProperty(window, "Plotly", {
  configurable: true, get: () => plotly, set: (value) => { plotly = value; mark("plotly"); },
});
new MutationObserver(() => {
  if (document.querySelector("[data-testid=stApp]")) mark("root");
  if (document.querySelector(".st-key-metrics_plotly_loader")) mark("loader");
  if (CHART_SHOWN_JS) mark("chart");
  if (document.querySelector("[data-testid=stElementContainer] .js-plotly-plot .main-svg")) mark("live");
}).observe(document, { subtree: true, childList: true, attributes: true, attributeFilter: ["style"] });
""".replace("CHART_SHOWN_JS", CHART_SHOWN_JS)

SCRIPTS_JS = """Math.max(...performance.getEntriesByType('resource')
    .filter(r => r.name.includes('/static/js/') && r.startTime < (window.__marks.socket || Infinity))
    .map(r => r.responseEnd))"""


# One st.plotly_chart of the run's train loss, as the run page's loss chart draws it.
BARE_APP = """
import sys
import streamlit as st
from metrics_core.dashboard.figures.metric_figures import metric_figure
from metrics_core.dashboard.views.chart_specs import Series
from metrics_core.dashboard.store.run_store import RunStore

view = RunStore(sys.argv[1]).view(sys.argv[2])
st.plotly_chart(metric_figure([Series(view.effective("train"), "train_loss", "train")], title="Loss",
                              sessions=view.sessions))
"""


class Bare:
    """A bare Streamlit app of one ``st.plotly_chart`` of the same run; ``serve`` as ``Ours.serve``."""

    name = "bare st.plotly_chart"

    @contextmanager
    def serve(self, directory: Path) -> Iterator[tuple[str, int, None]]:
        write_run(directory / RUN / "metrics.jsonl", RECORDS)
        app = directory / "bare_app.py"
        app.write_text(BARE_APP)
        with streamlit_app(app, str(directory), RUN) as url:
            yield f"{url}/?run={RUN}", 0, None


# What a click on a run's link in the runs table does (widgets.SAME_TAB_JS): the run page in the
# same document, no reload.  Returns the click's time, from which that load's marks are counted.
CLICK_JS = """(href) => { const now = performance.now(); history.pushState(null, "", href);
    window.dispatchEvent(new PopStateEvent("popstate")); return now; }"""


def page_loads(tool: Ours | Bare, count: int, *, via_runs: bool = False) -> list[dict[str, float]]:
    """The marks of ``count`` loads of ``tool``'s run page, one after the other in one fresh browser
    and server: the first cold, the others with the browser's HTTP and code caches.  ``via_runs``:
    each reached from the runs page by a click (marks from the click; those the runs page already
    reached, such as its websocket, are left out)."""
    with tempfile.TemporaryDirectory() as tmp, tool.serve(Path(tmp)) as (url, _, _), chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.add_init_script(PROBE)
        base, _, query = url.partition("/run?")
        loads = []
        for _ in range(count):
            origin = 0.0
            if via_runs:
                page.goto(base + "/", wait_until="commit")
                page.wait_for_selector("[data-testid=stDataFrame]", timeout=120_000)
                page.wait_for_timeout(800)  # the runs page settles, as a reader reads it
                origin = page.evaluate(CLICK_JS, f"run?{query}")
            else:
                page.goto(url, wait_until="commit")
            start = time.monotonic()
            while not page.evaluate(DRAWN_JS["ours"]):
                if time.monotonic() - start > 120:
                    raise RuntimeError(f"{tool.name}: no chart drawn within 120 s")
                page.wait_for_timeout(20)
            wall = (time.monotonic() - start) * 1000
            while "live" not in page.evaluate("window.__marks") and time.monotonic() - start < 120:
                page.wait_for_timeout(20)
            marks = {name: at - origin for name, at in page.evaluate("window.__marks").items() if at >= origin}
            if not via_runs:
                marks["scripts"] = page.evaluate(SCRIPTS_JS)
            loads.append({**marks, "wall": wall})
            page.wait_for_timeout(500)  # the page settles, as a reader's would, before the next load
        return loads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warm", type=int, default=0, help="measure this many repeat loads per round instead")
    parser.add_argument("--via-runs", action="store_true", help="reach the run page by a click on the runs page")
    parser.add_argument("--tools", default="ours,plain", help="comma-separated: ours, plain, bare")
    args = parser.parse_args()
    known = {"ours": lambda: Ours(0.5), "plain": lambda: Ours(0.5, plain=True), "bare": Bare}
    tools = [known[name]() for name in args.tools.split(",")]
    results: dict[str, list[dict[str, float]]] = {tool.name: [] for tool in tools}
    print(f"start: {load()}")
    for number in range(args.rounds):
        for tool in tools if number % 2 == 0 else tools[::-1]:
            loads = page_loads(tool, 1 + args.warm, via_runs=args.via_runs)
            for marks in loads[1:] if args.warm else loads:
                results[tool.name].append(marks)
                shown = ", ".join(f"{k} {marks.get(k, -1):.0f}" for k in (*MARKS, "wall"))
                print(f"round {number + 1}: {tool.name:>16}: {shown}")
    kind = f"{args.warm} repeat loads in each of" if args.warm else "cold loads,"
    after = "a click on the runs page" if args.via_runs else "navigation"
    print(f"end: {load()}\n\nmedian ms after {after}, {kind} {args.rounds} rounds")
    print(f"{'':>20} | " + " | ".join(f"{k:>7}" for k in (*MARKS, "wall")))
    medians = {name: {k: statistics.median(m.get(k, float("nan")) for m in runs) for k in (*MARKS, "wall")}
               for name, runs in results.items()}  # fmt: skip
    for name, row in medians.items():
        print(f"{name:>20} | " + " | ".join(f"{row[k]:7.0f}" for k in (*MARKS, "wall")))
    first = medians[tools[0].name]
    for tool in tools[1:]:
        other = medians[tool.name]
        print(
            f"{tools[0].name} / {tool.name}: live chart {first['live'] / other['live']:.2f}x "
            f"({first['live']:.0f} / {other['live']:.0f} ms), wall {first['wall'] / other['wall']:.2f}x"
        )


if __name__ == "__main__":
    main()
