"""What one live append costs the browser: the run page's six charts extended by one point per trace.

Run: python benchmarks/bench_draw.py [--records 1000000] [--dir DIR] [--repeats 8]

``bench_live.py --big`` measures write -> visible on a live run of a million records against one of
100; once the server is idle, what is left of the difference is the page's.  Here, in a real headless
Chromium with the page's plotly.js: the six charts of each run (``feed.drawn_charts``, default
options) drawn with ``Plotly.newPlot``, then, ``--repeats`` times, every trace that has points
extended by one (``Plotly.extendTraces``, one call per chart, as an append's payload is applied:
plotly redraws the whole chart), timed to the next animation frame.  The big run is
``generate.write_run``'s, kept in ``--dir`` between invocations; the small one is written by the
real writer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.dashboard.figures.figure_dicts import figure_json
from metrics_core.dashboard.live.chart_component import plotly_source
from metrics_core.dashboard.live.feed import drawn_charts
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.views.chart_specs import ChartOptions
from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import chromium

ASSETS = Path(__file__).resolve().parents[1] / "metrics_core" / "dashboard" / "assets" / "live_chart.js"

EXTEND_JS = """async ([figures, repeats]) => {
  const graphs = [];
  for (const text of figures) {
    const graph = document.createElement('div');
    graph.style.width = '1300px';
    document.body.appendChild(graph);
    const figure = unpack(JSON.parse(text));
    await Plotly.newPlot(graph, figure.data, figure.layout);
    graphs.push(graph);
  }
  const widened = (values) => ArrayBuffer.isView(values) ? Float64Array.from(values) : values;
  const taken = [];
  for (let repeat = 0; repeat < repeats; repeat++) {
    await new Promise((done) => setTimeout(done, 200));
    const start = performance.now();
    for (const graph of graphs) {
      const drawn = (trace) => trace.x && trace.x.length && trace.x.at(-1) !== null;
      const indices = graph.data.flatMap((trace, i) => (drawn(trace) ? [i] : []));
      for (const i of indices) {
        graph.data[i].x = widened(graph.data[i].x);
        graph.data[i].y = widened(graph.data[i].y);
      }
      const point = (i, name) => { const values = graph.data[i][name]; const last = values.at(-1);
        const next = [name === 'x' && typeof last === 'number' ? last + 10 : last];
        return ArrayBuffer.isView(values) ? Float64Array.from(next) : next; };
      const update = { x: indices.map((i) => point(i, 'x')), y: indices.map((i) => point(i, 'y')) };
      Plotly.extendTraces(graph, update, indices);
    }
    await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
    taken.push(performance.now() - start);
  }
  return taken;
}"""


def figures(root: Path, name: str) -> list[str]:
    """The JSON of the run page's charts of run ``name`` under ``root``."""
    store = RunStore(root)
    try:
        return [figure_json(figure) for figure in drawn_charts(store.view(name), ChartOptions()).values()]
    finally:
        store.close()


def small_run(root: Path) -> None:
    run = RunContext(root / "small", "small", "s1")
    state = TrainingState()
    with MetricsWriter(run) as writer:
        for step in range(10, 1010, 10):
            state.step = step
            writer.write("train", state, train_loss=1.0 / step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "metrics_bench_draw")
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    big = args.dir / "big" / "metrics.jsonl"
    if not big.exists():
        write_run(big, args.records)
    with tempfile.TemporaryDirectory() as tmp:
        small_run(Path(tmp))
        runs = {"100-record run": figures(Path(tmp), "small"), f"{args.records}-record run": figures(args.dir, "big")}
    runtime = ASSETS.read_text(encoding="utf-8")
    unpack = runtime[runtime.index("const TYPED") : runtime.index("// plotly.py packs arrays in their narrowest")]
    medians = {}
    with chromium() as browser:
        for label, charts in runs.items():
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_content("<html><body></body></html>")
            page.add_script_tag(content=plotly_source().read_text(encoding="utf-8"))
            page.add_script_tag(content=f"{unpack}\nwindow.unpack = unpack;")
            medians[label] = statistics.median(page.evaluate(EXTEND_JS, [charts, args.repeats]))
            print(f"{label:>22}: six charts, {sum(len(chart) for chart in charts) / 1e3:.0f} KB of JSON; one point "
                  f"per trace appended, drawn in {medians[label]:.0f} ms (median of {args.repeats})")  # fmt: skip
            page.close()
    small, large = medians.values()
    print(f"difference {large - small:.0f} ms per append ({large / small:.1f}x)")


if __name__ == "__main__":
    main()
