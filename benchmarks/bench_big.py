"""A very long run in the dashboard: time to the first chart against the reader's cold
load of the same file, and the memory the dashboard holds per record.

Run: python benchmarks/bench_big.py [--records 5000000] [--dir DIR]

Each measurement runs in its own fresh subprocess, side by side in one invocation, on the same
file (``generate.write_run``; kept in ``--dir`` between invocations):

* reader: ``RunReader(path).refresh()``, wall time;
* dashboard: ``RunStore.view`` then ``view_charts`` and the six charts' first payloads
  (``chart.encode`` + JSON), wall time, and resident memory growth (VmRSS) per record;
* ratio dashboard / reader (goal <= 1.5x) and growth per record (goal <= 250 B).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.testing.generate import write_run

READER = """
import sys, time
from metrics_core.read.run_reader import RunReader
start = time.perf_counter()
reader = RunReader(sys.argv[1])
reader.refresh()
print(time.perf_counter() - start, reader.records)
"""

DASHBOARD = """
import sys, time
from pathlib import Path
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
from metrics_core.dashboard.live.chart_component import encode
from metrics_core.dashboard.figures.chart_memo import view_charts
from metrics_core.dashboard.views.memo import view_findings
from metrics_core.dashboard.views.chart_specs import ChartOptions
from metrics_core.dashboard.store.run_store import RunStore
before = rss()
start = time.perf_counter()
store = RunStore(Path(sys.argv[1]))
view = store.view("big")
figures = view_charts(view, ChartOptions(smoothing=0.6))
sizes = [len(encode(figure).json) for figure in figures.values()]
first = time.perf_counter() - start
view_findings(view)
print(first, view.records, rss() - before, sum(sizes))
store.close()
"""


def run(code: str, *args: str) -> list[float]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    return [float(value) for value in out.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "metrics_bench_big")
    args = parser.parse_args()
    root = args.dir / str(args.records)
    path = root / "big" / "metrics.jsonl"
    done = root / ".complete"
    if not done.exists():
        write_run(path, args.records)
        done.write_text("ok")
    size = path.stat().st_size
    reader_s, records = run(READER, str(path))
    first_s, _, growth, payload = run(DASHBOARD, str(root))
    print(json.dumps({"records": int(records), "file_gb": round(size / 1e9, 2)}))
    print(f"reader cold load {reader_s:.1f} s; dashboard first charts {first_s:.1f} s "
          f"({first_s / reader_s:.2f}x the reader, goal <= 1.5x); resident growth {growth / records:.0f} B/record "
          f"(goal <= 250 B); six charts' first payload {payload / 1e3:.0f} KB")  # fmt: skip


if __name__ == "__main__":
    main()
