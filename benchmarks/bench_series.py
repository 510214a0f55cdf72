"""Incremental chart state vs recomputing it, per refresh of 10 new rows on a long trace.

Run: python benchmarks/bench_series.py [--rows 1000000]
Candidates (extend the state by 10 rows) and baselines (recompute over the whole trace, as
figures.py does today) run in interleaved batches in one process; ratios are printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import median_us_interleaved
from metrics_core.dashboard.metric_figures import ema_smooth
from metrics_core.downsample import minmax_indices
from metrics_core.series import EmaState, MinMaxPyramid, RangeIndex


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    values = 2 + 8 / np.sqrt(np.arange(1, args.rows + 1)) + rng.normal(0, 0.02, args.rows)
    tail = rng.normal(2, 0.02, 10)
    pyramid, ema = MinMaxPyramid(4000), EmaState(0.6)
    pyramid.extend(values)
    ema.extend(values)
    index = RangeIndex()
    index.extend(np.arange(args.rows, dtype=float), values)
    x = np.arange(args.rows, dtype=float)
    mid = args.rows // 2

    def extend_pyramid() -> np.ndarray:
        pyramid.extend(tail)
        return pyramid.indices_from(pyramid.stable_buckets())  # what a chart redraws: the last bucket

    timings = median_us_interleaved(
        {
            "pyramid extend(10) + new points": extend_pyramid,
            "minmax_indices(all)": lambda: minmax_indices(values, 4000),
            "EmaState.extend(10)": lambda: ema.extend(tail),
            "ema_smooth(all)": lambda: ema_smooth(values, 0.6),
            "RangeIndex.query(1k rows)": lambda: index.query(mid, mid + 999),
            "mask scan (1k rows)": lambda: np.flatnonzero((x >= mid) & (x <= mid + 999)),
        },
        calls=3,
        batches=15,
    )  # fmt: skip
    for name, us in timings.items():
        print(f"{name:34s} {us:10.1f} us")
    pairs = [("pyramid extend(10) + new points", "minmax_indices(all)"), ("EmaState.extend(10)", "ema_smooth(all)"),
             ("RangeIndex.query(1k rows)", "mask scan (1k rows)")]  # fmt: skip
    for candidate, baseline in pairs:
        print(f"{candidate} / {baseline} on {args.rows:,} rows: {timings[candidate] / timings[baseline]:.4f}")


if __name__ == "__main__":
    main()
