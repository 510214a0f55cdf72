"""Read-side benchmark: cold load vs pandas, refresh cost at two file sizes, bytes per record.

Run: python benchmarks/bench_reader.py [--records 1000000] [--big 5000000]
Each cold load runs in its own subprocess so its wall time and peak RSS are its own; the
refresh timings alternate between the small and the big run in one process.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generate import write_run
from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.reader import RunReader

COLD = """
import resource, sys, time
mode, path = sys.argv[1], sys.argv[2]
import pandas as pd
from metrics_core.reader import RunReader
import pyarrow.json  # imported up front by both so import time is not counted
start = time.perf_counter()
if mode == "pandas":
    rows = len(pd.read_json(path, lines=True))
else:
    reader = RunReader(path)
    rows = reader.refresh()
elapsed = time.perf_counter() - start
print(elapsed, rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def cold_load(mode: str, path: Path) -> tuple[float, int, int]:
    out = subprocess.run([sys.executable, "-c", COLD, mode, str(path)], capture_output=True, text=True, check=True)
    seconds, rows, peak = out.stdout.split()
    return float(seconds), int(rows), int(peak)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


class FloorTail:
    """The least any tailer must do per refresh: stat, read the new bytes, parse each line."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, path.stat().st_size

    def refresh(self) -> int:
        size = os.stat(self.path).st_size
        with open(self.path, "rb") as handle:
            data = os.pread(handle.fileno(), size - self.offset, self.offset)
        self.offset = size
        return len([orjson.loads(line) for line in data.splitlines()])


def refresh_after_appends(run_dirs: list[Path], rounds: int = 40, appends: int = 10) -> dict[Path, float]:
    """Median µs of refresh() after `appends` new records, alternating between runs each round.

    The first run is also tailed by FloorTail, timed the same way, under the key Path("floor").
    """
    readers: dict[Path, RunReader | FloorTail] = {d: RunReader(d) for d in run_dirs}
    for reader in readers.values():
        reader.refresh()
    readers[Path("floor")] = FloorTail(run_dirs[0] / "metrics.jsonl")
    timings: dict[Path, list[float]] = {d: [] for d in readers}
    state = TrainingState(step=10**9)
    writers = {d: MetricsWriter(RunContext(d, "bench", "append")).__enter__() for d in run_dirs}
    for _ in range(rounds):
        for d in run_dirs:
            for _ in range(appends):
                state.step += 10
                writers[d].write(
                    "train",
                    state,
                    train_loss=2.5,
                    lr=3e-4,
                    tokens=4096,
                    attempted_updates=10,
                    updates=10,
                    skipped_updates_in_window=0,
                    grad_norm_avg=0.9,
                    grad_norm_max=1.2,
                    clipped_fraction=0.1,
                    nonfinite_grad_norms=0,
                )
            for key in (d, Path("floor")) if d == run_dirs[0] else (d,):
                start = time.perf_counter_ns()
                got = readers[key].refresh()
                timings[key].append((time.perf_counter_ns() - start) / 1000)
                assert got == appends, got
    for writer in writers.values():
        writer.close()
    return {d: statistics.median(t) for d, t in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--big", type=int, default=5_000_000)
    parser.add_argument("--skip-cold", action="store_true", help="only the refresh measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not args.skip_cold:
            cold_section(root, args.records)
        small, big = root / "small", root / "big"
        write_run(small / "metrics.jsonl", args.small)
        write_run(big / "metrics.jsonl", args.big)
        medians = refresh_after_appends([small, big])
        print(
            f"refresh()  after 10 appended records: {medians[small]:.0f} us on {args.small} records, "
            f"{medians[big]:.0f} us on {args.big} records, ratio {medians[big] / medians[small]:.2f}x "
            "(goal <= 100 us, ratio <= 1.3x)"
        )
        print(
            f"refresh()  floor (stat + pread + orjson per line) {medians[Path('floor')]:.0f} us; "
            f"RunReader / floor {medians[small] / medians[Path('floor')]:.1f}x"
        )


def cold_section(root: Path, records: int) -> None:
    """Cold load vs pandas, and resident bytes per record."""
    cold = root / "cold" / "metrics.jsonl"
    count = write_run(cold, records)
    size = cold.stat().st_size
    print(f"cold file: {count} records, {size / 1e6:.0f} MB, {size / count:.0f} B/line")
    ours = cold_load("reader", cold)
    theirs = cold_load("pandas", cold)
    print(f"cold load  RunReader: {ours[0]:.2f} s, peak RSS {ours[2] / 1e9:.2f} GB ({ours[1]} records)")
    print(f"cold load  pandas.read_json(lines=True): {theirs[0]:.2f} s, peak RSS {theirs[2] / 1e9:.2f} GB")
    print(f"cold load  speed-up {theirs[0] / ours[0]:.1f}x  (goal >= 5x, peak <= 1.2 GB)")
    gc.collect()
    before = rss_bytes()
    reader = RunReader(cold)
    reader.refresh()
    gc.collect()
    after = rss_bytes()
    print(
        f"resident   {(after - before) / count:.0f} B/record by RSS, "
        f"{reader.resident_bytes() / count:.0f} B/record in columns (goal <= 150)"
    )
    cold.unlink()


if __name__ == "__main__":
    main()
