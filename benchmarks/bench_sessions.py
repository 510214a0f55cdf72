"""A run resumed thousands of times against the same records in three sessions: what opening it
costs as the sessions double, side by side in one process.

Run: python benchmarks/bench_sessions.py [--records 20000] [--sessions 3,4000,8000] [--rounds 5] [--clock cpu]

The runs (``generate.write_resumed_run``: the same ``--records`` records, each resume superseding
one train window) are opened, in alternating rounds, three ways:

* ``page``: a fresh ``RunStore``'s snapshot of the run (``view()``: the read, the supersession
  and replay accounting, the snapshot) and its first chart built (``chart_builders``);
* ``summary``: ``python -m metrics_core summary`` in this process (``cli.main``: ``RunDigest``);
* ``sql facts``: a fresh ``RunReader`` read and the export's table and facts of the run
  (``sql.export_table.run_table``, ``run_facts``).

Prints each one's median seconds per session count, then each count's median over the one before
it.  Goals (docs/PERFORMANCE.md): 4,000 sessions at most 2x three sessions, 8,000 at most 2.4x
4,000.  ``--clock cpu``: the process's CPU seconds (every thread's) instead of the wall clock's,
which on a machine shared with other work measure the load as much as the run.
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.cli.main import main as cli_main
from metrics_core.dashboard.figures.run_charts import chart_builders
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.chart_specs import ChartOptions
from metrics_core.read.run_reader import RunReader
from metrics_core.sql.export_table import run_facts, run_table
from metrics_core.testing.generate import write_resumed_run


def page(root: Path) -> None:
    store = RunStore(root, StoreSettings(safety_interval=0.0))
    try:
        view = store.view("r")
        next(iter(chart_builders(view, ChartOptions()).values()))()
    finally:
        store.close()


def summary(root: Path) -> None:
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        if cli_main(["summary", "--quiet", str(root / "r")]) != 0:
            raise RuntimeError("summary failed")


def sql_facts(root: Path) -> None:
    reader = RunReader(root / "r")
    reader.refresh()
    run_table(reader, "r")
    run_facts(reader)
    reader.close()


WAYS: dict[str, Callable[[Path], None]] = {"page": page, "summary": summary, "sql facts": sql_facts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--sessions", default="3,4000,8000")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    counts = [int(count) for count in args.sessions.split(",")]
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    base = Path(tempfile.mkdtemp(prefix="metrics_bench_sessions_"))
    try:
        roots = {}
        for count in counts:
            roots[count] = base / f"s{count}"
            path = roots[count] / "r" / "metrics.jsonl"
            written = write_resumed_run(path, args.records, count)
            print(f"{count:>6,} sessions: {written:,} records, {path.stat().st_size:,} bytes")
        times: dict[tuple[str, int], list[float]] = {(way, count): [] for way in WAYS for count in counts}
        for _ in range(args.rounds):
            for way, run in WAYS.items():
                for count in counts:
                    start = clock()
                    run(roots[count])
                    times[way, count].append(clock() - start)
        print(f"\nmedian {args.clock} seconds of {args.rounds} rounds, and each over the one before it")
        print(f"{'':<10}" + "".join(f"{count:>12,}" for count in counts) + "".join(
            f"{f'{b:,}/{a:,}':>14}" for a, b in pairwise(counts)))  # fmt: skip
        for way in WAYS:
            medians = [statistics.median(times[way, count]) for count in counts]
            ratios = [b / a for a, b in pairwise(medians)]
            print(f"{way:<10}" + "".join(f"{m:>12.3f}" for m in medians) + "".join(f"{r:>13.2f}x" for r in ratios))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
