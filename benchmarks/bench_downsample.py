"""Candidate downsamplers for a chart's lines, side by side: time, and whether spikes, gaps and the
last point survive.

Run: python benchmarks/bench_downsample.py [--rows 100000 1000000] [--budget 4000] [--spikes 50]
                                          [--charts 300000]

Each series is a falling loss with noise, ``--spikes`` one-point spikes and as many one-point dips
at random rows, and a few runs of missing values (windows with no successful update).  Candidates:

* ``minmax``: ``analysis.downsample.minmax_indices``, the default;
* ``lttb-numpy``: Largest-Triangle-Three-Buckets written here in numpy (one step per bucket);
* ``tsdownsample-*``: the Rust ``tsdownsample`` package's LTTB (of the finite rows) and its
  NaN-aware MinMaxLTTB, asked for as many points as min/max keeps (three quarters of the budget),
  only when it is installed (it is no dependency).

Columns: median ms per call (interleaved rounds), points kept, the share of spikes and of dips
whose row is kept (a spike not kept is not drawn), whether every run of missing values keeps one
(a gap that stays a gap, not a line across it) and whether the last row is kept.

``--charts RECORDS``: every chart of the run page (``run_charts``, smoothing 0.6) of a generated
run of that many records, drawn with each candidate passed as its ``downsample``: what the
candidate saves where it is used, the median of ``--rounds``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.analysis.downsample import minmax_indices

GAP_RUNS = 5  # runs of missing values per series
GAP_ROWS = 30  # rows per run


def lttb_indices(values: np.ndarray, max_points: int) -> np.ndarray:
    """Largest-Triangle-Three-Buckets over row numbers as x (Steinarsson 2013): the first and last
    rows, and from each of ``max_points - 2`` buckets the row making the largest triangle with the
    row kept before it and the next bucket's mean.  Missing values are never picked (LTTB has no
    notion of a gap)."""
    count = len(values)
    if count <= max_points or max_points < 3:
        return np.arange(count)
    finite = np.isfinite(values)
    y = np.where(finite, values, 0.0)
    x = np.arange(count, dtype=np.float64)
    edges = np.linspace(1, count - 1, max_points - 1).astype(np.int64)
    sums = np.add.reduceat(y * finite, edges[:-1])
    counts = np.maximum(np.add.reduceat(finite.astype(np.float64), edges[:-1]), 1)
    means_y, means_x = sums / counts, (edges[:-1] + edges[1:] - 1) / 2
    keep = np.empty(max_points, dtype=np.int64)
    keep[0], keep[-1] = 0, count - 1
    previous = 0
    for bucket in range(max_points - 2):
        start, stop = edges[bucket], edges[bucket + 1]
        if bucket + 1 < max_points - 2:
            next_x, next_y = means_x[bucket + 1], means_y[bucket + 1]
        else:
            next_x, next_y = x[-1], y[-1]
        xs, ys = x[start:stop], y[start:stop]
        area = np.abs((x[previous] - next_x) * (ys - y[previous]) - (x[previous] - xs) * (next_y - y[previous]))
        area[~finite[start:stop]] = -1.0
        previous = start + int(np.argmax(area))
        keep[bucket + 1] = previous
    return keep


def series(rows: int, spikes: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """A noisy falling loss with ``spikes`` spikes and dips; return it, the spike rows, the dip rows, the gap runs."""
    rng = np.random.default_rng(seed)
    values = 2.0 + 3.0 / np.sqrt(1 + np.arange(rows) / 100) + rng.normal(0, 0.05, rows)
    picked = rng.choice(np.arange(1, rows - 1), 2 * spikes, replace=False)
    up, down = np.sort(picked[:spikes]), np.sort(picked[spikes:])
    values[up] += 3.0
    values[down] -= 1.5
    gaps = []
    for start in rng.choice(np.arange(rows // 10, rows - GAP_ROWS), GAP_RUNS, replace=False):
        run = np.arange(start, start + GAP_ROWS)
        run = run[~np.isin(run, picked)]
        values[run] = np.nan
        gaps.append(run)
    return values, up, down, gaps


def candidates() -> dict[str, Callable[[np.ndarray, int], np.ndarray]]:
    found: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {"minmax": minmax_indices, "lttb-numpy": lttb_indices}
    try:
        import tsdownsample
    except ImportError:
        print("tsdownsample not installed: its candidates left out")
        return found
    lttb, nan_minmax_lttb = tsdownsample.LTTBDownsampler(), tsdownsample.NaNMinMaxLTTBDownsampler()

    # As many points as min/max keeps (three per bucket of ``budget // 4``): the same JSON per trace.
    def ts_lttb(values: np.ndarray, budget: int) -> np.ndarray:
        if len(values) <= budget:
            return np.arange(len(values))
        finite = np.flatnonzero(np.isfinite(values))  # its LTTB takes no NaN: the finite rows only
        return finite[lttb.downsample(values[finite], n_out=3 * budget // 4)]

    def ts_nan_minmax_lttb(values: np.ndarray, budget: int) -> np.ndarray:
        if len(values) <= budget:
            return np.arange(len(values))
        return nan_minmax_lttb.downsample(values, n_out=3 * budget // 4)

    found["tsdownsample-lttb"] = ts_lttb
    found["tsdownsample-nanminmaxlttb"] = ts_nan_minmax_lttb
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--budget", type=int, default=4000)
    parser.add_argument("--spikes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--charts", type=int, default=0, help="records of a run whose page's charts are drawn")
    args = parser.parse_args()
    pick = candidates()
    if args.charts:
        charts(args.charts, pick, args.rounds)
    print(f"{'rows':>9} {'candidate':<28} {'ms':>8} {'kept':>6} {'spikes':>7} {'dips':>6} {'gaps':>5} {'last':>5}")
    for rows in args.rows:
        values, up, down, gaps = series(rows, args.spikes, seed=rows)
        times: dict[str, list[float]] = {name: [] for name in pick}
        for _ in range(args.rounds):
            for name, downsample in pick.items():
                start = time.perf_counter()
                downsample(values, args.budget)
                times[name].append((time.perf_counter() - start) * 1000)
        for name, downsample in pick.items():
            kept = np.asarray(downsample(values, args.budget))
            print(
                f"{rows:>9,} {name:<28} {statistics.median(times[name]):>8.2f} {len(kept):>6}"
                f" {np.isin(up, kept).mean():>7.0%} {np.isin(down, kept).mean():>6.0%}"
                f" {sum(bool(np.isin(run, kept).any()) for run in gaps):>3}/{len(gaps)}"
                f" {bool(rows - 1 in kept)!s:>5}"
            )


def charts(records: int, pick: dict[str, Callable[[np.ndarray, int], np.ndarray]], rounds: int) -> None:
    """The run page's charts drawn with each candidate, interleaved."""
    import tempfile

    from metrics_core.dashboard.figures.run_charts import run_charts
    from metrics_core.dashboard.store.run_store import RunStore
    from metrics_core.dashboard.views.chart_specs import ChartOptions
    from metrics_core.testing.generate import write_run

    with tempfile.TemporaryDirectory() as tmp:
        write_run(Path(tmp) / "run" / "metrics.jsonl", records)
        store = RunStore(tmp)
        try:
            view, options = store.view("run"), ChartOptions(smoothing=0.6)
            times: dict[str, list[float]] = {name: [] for name in pick}
            for _ in range(rounds):
                for name, downsample in pick.items():
                    start = time.perf_counter()
                    run_charts(view, options, downsample=downsample)
                    times[name].append(time.perf_counter() - start)
        finally:
            store.close()
    for name in pick:
        print(f"run page's charts, {records:,} records, {name:<28} {statistics.median(times[name]) * 1000:8.0f} ms")


if __name__ == "__main__":
    main()
