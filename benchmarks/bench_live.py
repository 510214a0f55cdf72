"""Live latency and figure size: a real server, a real headless Chromium, a real writer.

Run: python benchmarks/bench_live.py [--appends 25] [--records 1000000]
Latency is measured write -> visible: Python stamps the wall clock right after MetricsWriter.write
returns; the page stamps the wall clock (same machine, same clock) the first time the loss chart's
last point is that record's step, checking every 10 ms.  Appends come every 1.3 s, out of phase
with the 1 s refresh, so the figure includes the wait for the next refresh.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generate import write_run
from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.dashboard.charts import ChartOptions, run_charts
from metrics_core.dashboard.store import RunStore
from tests.live_server import chromium, streamlit_server

WATCH_JS = """() => {
  window.__seen = {};
  setInterval(() => {
    const graphs = [...document.querySelectorAll('.js-plotly-plot')];
    const graph = graphs.find(g => g.layout && g.layout.title.text === 'Loss');
    if (!graph) return;
    for (const trace of graph.data) {
      if (!trace.name.startsWith('train') || !trace.x || !trace.x.length) continue;
      const last = trace.x[trace.x.length - 1];
      if (!(last in window.__seen)) window.__seen[last] = Date.now();
    }
  }, 10);
}"""


def latency(appends: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = RunContext(root / "live", "live", "s1")
        state = TrainingState()
        written: dict[int, float] = {}
        with MetricsWriter(run) as writer, streamlit_server(root) as url, chromium() as browser:
            for step in range(10, 110, 10):
                state.step = step
                writer.write("train", state, train_loss=1.0 / step)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/run?run=live")
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 6", timeout=60_000)
            page.evaluate(WATCH_JS)
            time.sleep(2)
            for number in range(appends):
                state.step = 1000 + 10 * number
                writer.write("train", state, train_loss=0.5)
                written[state.step] = time.time() * 1000
                time.sleep(1.3)
            time.sleep(3)
            seen = {int(float(k)): v for k, v in page.evaluate("window.__seen").items()}
    missing = [step for step in written if step not in seen]
    if missing:
        raise SystemExit(f"records never became visible: steps {missing}")
    return [seen[step] - written[step] for step in written]


def figure_bytes(records: int) -> tuple[int, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        count = write_run(Path(tmp) / "big" / "metrics.jsonl", records)
        store = RunStore(Path(tmp))
        try:
            figures = run_charts(store.view("big"), ChartOptions(smoothing=0.6))
        finally:
            store.close()
        sizes = [len(figure.to_json()) for figure in figures.values()]
    return count, max(sizes), sum(sizes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--appends", type=int, default=25)
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    delays = sorted(latency(args.appends))
    p95 = delays[min(len(delays) - 1, round(0.95 * (len(delays) - 1)))]
    median = statistics.median(delays)
    print(f"write -> visible over {len(delays)} appends: median {median:.0f} ms, p95 {p95:.0f} ms, "
          f"max {delays[-1]:.0f} ms  (goal: median <= 1000 ms, p95 <= 2000 ms)")  # fmt: skip
    count, largest, total = figure_bytes(args.records)
    print(f"figure JSON for a {count}-record run: largest chart {largest / 1e3:.0f} KB, "
          f"all six {total / 1e3:.0f} KB (goal <= 200 KB per chart; 1M raw points ~16.8 MB)")  # fmt: skip


if __name__ == "__main__":
    main()
