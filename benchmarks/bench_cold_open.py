"""A big run opened cold in a served dashboard: how soon the page says what it is doing, whether its
progress moves, and how soon the first chart replaces it, against the reader's cold load.

Run: python benchmarks/bench_cold_open.py [--records 2000000] [--dir DIR] [--rounds 1]

The run is ``generate.write_run``'s (kept in ``--dir`` between invocations).  Each round, side by
side on the same file:

* reader: ``RunReader(path).refresh()`` in a fresh subprocess, wall time (before and after the page,
  so a machine busier during one of them shows);
* page: a fresh ``streamlit run app.py`` on the run's root with an empty cache directory (a cold
  read, as after a first start), a fresh headless Chromium opening ``/run?run=big``, polled every
  ``POLL_S`` from navigation: ``first paint`` (the run's title and its read's progress bar shown),
  how many times the progress bar's value moved, and ``first chart`` (a plotly chart drawn);
* the same from a warm browser: the tab first showed a small run of the same root (Streamlit's
  scripts and plotly.js loaded, as for a user who opens a second run), then opens the big one.

Goals: first paint <= 2 s; the progress moving at least 3 times; first chart <= 1.5x the reader's
cold load + 2 s.  Prints each figure and its ratio to the goal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import CHART_SHOWN_JS, chromium, streamlit_server

RUN, SMALL = "big", "small"
POLL_S = 0.05

READER = """
import sys, time
from metrics_core.read.run_reader import RunReader
start = time.perf_counter()
reader = RunReader(sys.argv[1])
reader.refresh()
print(time.perf_counter() - start)
"""

# In the page: whether the run's title is shown, the read progress bar's value (None: none shown),
# and whether a chart is drawn.
STATE_JS = f"""() => {{
  const title = [...document.querySelectorAll('h1')].some(h => h.textContent.includes({json.dumps(RUN)}));
  const bar = document.querySelector('[class*="st-key-run_reading"] [role=progressbar]');
  return {{title, progress: bar ? bar.getAttribute('aria-valuenow') : null, chart: {CHART_SHOWN_JS}}};
}}"""


def reader_cold_load(path: Path) -> float:
    out = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    return float(out.stdout)


def open_cold(root: Path, *, warm: bool, timeout_s: float = 300.0) -> dict[str, float | int | None]:
    """One cold open of the big run's page on a fresh server (``warm``: in a tab that showed the
    small run first): seconds from navigation to the first paint (title and progress) and to the
    first chart, and how many times the progress moved."""
    with (
        tempfile.TemporaryDirectory() as cache,
        streamlit_server(root, "--cache-dir", cache) as url,
        chromium() as browser,
    ):
        page = browser.new_page()
        if warm:
            page.goto(f"{url}/run?run={SMALL}")
            page.wait_for_function(f"() => {CHART_SHOWN_JS}", timeout=timeout_s * 1000)
        start = time.perf_counter()
        page.goto(f"{url}/run?run={RUN}", wait_until="commit")
        first_paint = first_chart = None
        values: list[str] = []
        while time.perf_counter() - start < timeout_s:
            state = page.evaluate(STATE_JS)
            now = time.perf_counter() - start
            if state["progress"] is not None:
                if first_paint is None and state["title"]:
                    first_paint = now
                if not values or values[-1] != state["progress"]:
                    values.append(state["progress"])
            if state["chart"]:
                first_chart = now
                break
            page.wait_for_timeout(POLL_S * 1000)
        page.close()
    return {"first_paint_s": first_paint, "first_chart_s": first_chart, "progress_moves": max(len(values) - 1, 0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "metrics_bench_cold")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    root = args.dir / str(args.records)
    path = root / RUN / "metrics.jsonl"
    if not (root / ".complete").exists():
        write_run(path, args.records)
        write_run(root / SMALL / "metrics.jsonl", 1000)
        (root / ".complete").write_text("ok")
    readers: list[float] = []
    pages: dict[str, list[dict[str, float | int | None]]] = {"fresh browser": [], "warm browser": []}
    for _ in range(args.rounds):
        readers.append(reader_cold_load(path))
        pages["fresh browser"].append(open_cold(root, warm=False))
        pages["warm browser"].append(open_cold(root, warm=True))
        readers.append(reader_cold_load(path))
    reader_s = statistics.median(readers)
    allowed = 1.5 * reader_s + 2.0
    print(json.dumps({"records": args.records, "file_gb": round(path.stat().st_size / 1e9, 2), "pages": pages}))
    print(f"reader cold load {reader_s:.1f} s (each: {', '.join(f'{s:.1f}' for s in readers)})")
    for kind, opened in pages.items():
        paint = statistics.median(_seconds(p["first_paint_s"]) for p in opened)
        chart = statistics.median(_seconds(p["first_chart_s"]) for p in opened)
        moves = min(p["progress_moves"] for p in opened)
        print(
            f"{kind}: first paint {paint:.2f} s (goal <= 2 s: {paint / 2.0:.2f}x); progress moved {moves} times "
            f"(goal >= 3); first chart {chart:.1f} s "
            f"(goal <= 1.5x reader + 2 s = {allowed:.1f} s: {chart / allowed:.2f}x)"
        )


def _seconds(value: float | int | None) -> float:
    return float("inf") if value is None else float(value)


if __name__ == "__main__":
    main()
