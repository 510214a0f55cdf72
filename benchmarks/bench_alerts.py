"""The alert evaluator on a cluster head's root of 1,000 runs: a first pass, then idle passes.

Run: python benchmarks/bench_alerts.py [--root DIR] [--passes 20]

On ``generate_root``'s root (990 small runs, 9 of 100k records, one live run), one
``AlertEvaluator`` (what ``python -m metrics_core alerts`` and a dashboard server run):

* first pass: wall and CPU time (``time.process_time``) of the pass that reads every run;
* idle pass: CPU time of a pass that finds nothing appended (median of ``--passes``), the
  figure to hold against the runs page's goal for an idle ``runs_table()`` (docs/PERFORMANCE.md),
  and the bytes it read (0 expected);
* the root's walk (``find_runs``), which a pass adds once per ``REDISCOVER_S``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generate_root import make_root
from metrics_core.alerts.evaluator import REDISCOVER_S, AlertEvaluator
from metrics_core.roots.discovery import find_runs


def cpu_ms(work: object) -> float:
    start = time.process_time()
    work()
    return (time.process_time() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/metrics_bench_root1000"))
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    root = make_root(args.root)
    evaluator = AlertEvaluator(root)
    wall = time.perf_counter()
    first = cpu_ms(lambda: evaluator.evaluate(now=datetime.now(timezone.utc)))
    wall = time.perf_counter() - wall
    print(f"runs: {len(find_runs(root)):,}; first pass: {wall:.2f} s wall, {first / 1e3:.2f} s CPU, "
          f"{evaluator.stats['bytes_read'] / 1e6:.0f} MB read, {evaluator.stats['records']:,} records")  # fmt: skip
    read = evaluator.stats["bytes_read"]
    idle = [cpu_ms(lambda: evaluator.evaluate(now=datetime.now(timezone.utc))) for _ in range(args.passes)]
    walk = [cpu_ms(lambda: find_runs(root)) for _ in range(args.passes)]
    print(f"idle pass CPU, median of {args.passes}: {statistics.median(idle):.1f} ms; bytes read: "
          f"{evaluator.stats['bytes_read'] - read}; walks: {evaluator.stats['walks'] - 1}")  # fmt: skip
    print(f"the root's walk (find_runs, once per {REDISCOVER_S:.0f} s): {statistics.median(walk):.1f} ms")
    evaluator.close()


if __name__ == "__main__":
    main()
