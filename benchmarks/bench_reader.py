"""Read-side benchmark: cold load vs pandas, cache reopen vs cold parse, refresh vs the floor.

Run: python benchmarks/bench_reader.py [--sizes 100000,300000,1000000] [--small 10000 --big 300000]
     METRICS_BENCH_5M=1 adds a 5,000,000-record run to the refresh measurement.
     --baseline DIR adds the cold load and the cache reopen of another version's ``metrics_core``
     (a directory holding it, e.g. from ``git archive <rev> metrics_core | tar -x -C DIR``), side by
     side in the rounds; its reopen reads a cache file it wrote itself, in its own format.
Each load runs in its own subprocess so its wall time and peak RSS are its own; candidate and
baseline subprocesses alternate (``--repeats`` rounds) and the median of per-round ratios is
printed.  The refresh timings alternate between the runs and the floor in one process, timed
twice: by the wall clock, and by the thread's CPU time, which a loaded machine does not inflate
(a refresh of a few records runs on the calling thread alone).

Peak RSS is the child's ``VmHWM``, not its ``ru_maxrss``: Linux carries the parent's peak RSS
across the ``vfork`` + ``exec`` that ``subprocess`` uses, and this parent has just parsed the
same run to build the cache (hence the unexplained 0.78 GB a 1M-record load used to show).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.read.run_reader import RunReader
from metrics_core.testing.generate import write_run

COLD = """
import resource, sys, time
from pathlib import Path
mode, path, cache_dir, baseline = sys.argv[1:5]
if mode.startswith("baseline"):
    sys.path.insert(0, baseline)  # that version's metrics_core, not this one
import pandas as pd
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.run_reader import RunReader
import pyarrow.json, pyarrow.ipc  # imported up front by all so import time is not counted
policy = CachePolicy(Path(cache_dir), min_records=1)
def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()
before = rss()
start, cpu = time.perf_counter(), time.process_time()
if mode == "pandas":
    rows = len(pd.read_json(path, lines=True))
elif mode == "pyarrow":  # the ceiling of this approach: pyarrow's JSON reader alone, default options
    rows = pyarrow.json.read_json(path).num_rows
elif mode in ("reader", "baseline"):
    reader = RunReader(path)
    rows = reader.refresh()
else:  # "reopen", "baseline reopen": the cache file must exist (and be of the version's cache format)
    reader = RunReader(path, cache=policy)
    reader.refresh()
    rows = reader.records
    assert reader.served_from_cache if hasattr(reader, "served_from_cache") else reader._cache_saved_at is not None
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
print(elapsed, cpu, rows, peak, rss() - before)
"""


class Load(NamedTuple):
    """One load in a fresh subprocess: wall and CPU seconds (all threads), rows, peak RSS, RSS growth."""

    seconds: float
    cpu: float
    rows: int
    peak: int
    grown: int


def cold_load(mode: str, path: Path, cache_dir: Path | None = None, baseline: Path | None = None) -> Load:
    args = [sys.executable, "-c", COLD, mode, str(path), str(cache_dir or path.parent / "cache"), str(baseline or "")]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    seconds, cpu, rows, peak, grown = out.stdout.split()
    return Load(float(seconds), float(cpu), int(rows), int(peak), int(grown))


class FloorTail:
    """The least any tailer must do per refresh: stat, pread the new bytes (fd held open), parse each line."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, path.stat().st_size
        self.fd = os.open(path, os.O_RDONLY)

    def refresh(self) -> int:
        size = os.stat(self.path).st_size
        data = os.pread(self.fd, size - self.offset, self.offset)
        self.offset = size
        return len([orjson.loads(line) for line in data.splitlines()])


def refresh_after_appends(
    run_dirs: list[Path], rounds: int = 200, appends: int = 10, clock: Callable[[], int] = time.perf_counter_ns
) -> dict[Path, float]:
    """Median µs of refresh() after `appends` new records, alternating between runs each round.

    The first run is also tailed by FloorTail, timed the same way, under the key Path("floor"),
    and the columnarisation a page's next query pays (``_flush``) is timed under Path("flush").
    ``clock``: wall time, or the thread's CPU time (``time.thread_time_ns``: what a refresh costs,
    without the time the thread waited for a core on a loaded machine), less the clock's own cost.
    """
    overhead = statistics.median(-clock() + clock() for _ in range(1000))
    readers: dict[Path, RunReader | FloorTail] = {d: RunReader(d) for d in run_dirs}
    for reader in readers.values():
        reader.refresh()
    readers[Path("floor")] = FloorTail(run_dirs[0] / "metrics.jsonl")
    timings: dict[Path, list[float]] = {d: [] for d in [*readers, Path("flush")]}
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
                start = clock()
                got = readers[key].refresh()
                timings[key].append((clock() - start - overhead) / 1000)
                assert got == appends, got
                if key == run_dirs[0]:
                    start = clock()
                    readers[key]._flush()
                    timings[Path("flush")].append((clock() - start - overhead) / 1000)
    for writer in writers.values():
        writer.close()
    return {d: statistics.median(t) for d, t in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,300000,1000000", help="cold-load sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--big", type=int, default=300_000)
    parser.add_argument("--skip-cold", action="store_true", help="only the refresh measurement")
    parser.add_argument("--baseline", type=Path, help="a directory holding another version's metrics_core package")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not args.skip_cold:
            for size in map(int, args.sizes.split(",")):
                cold_section(root, size, args.repeats, args.baseline)
        runs = {args.small: root / "small", args.big: root / "big"}
        if os.environ.get("METRICS_BENCH_5M"):
            runs[5_000_000] = root / "huge"
        for count, directory in runs.items():
            write_run(directory / "metrics.jsonl", count)
        for clock, name in [(time.perf_counter_ns, "wall"), (time.thread_time_ns, "CPU")]:
            refresh_section(runs, args.small, clock, name)


def refresh_section(runs: dict[int, Path], small_count: int, clock: Callable[[], int], name: str) -> None:
    """Print refresh() after 10 appended records against the floor, timed by ``clock``."""
    medians = refresh_after_appends(list(runs.values()), clock=clock)
    small = medians[runs[small_count]]
    floor = medians[Path("floor")]
    for count, directory in runs.items():
        took = medians[directory]
        print(f"refresh()  {name:4s} after 10 appended records, {count:>9,} records: {took:6.0f} us, "
              f"{took / floor:.2f}x floor, {took / small:.2f}x the {small_count:,} run")  # fmt: skip
    print(f"refresh()  {name:4s} floor (stat + pread on an open fd + orjson per line): {floor:.0f} us  "
          f"(goal: reader <= 2.5x floor, big/small <= 1.3)")  # fmt: skip
    flush = medians[Path("flush")]
    print(f"refresh()  {name:4s} + the columnarisation the next query pays (_flush): {small + flush:.0f} us, "
          f"{(small + flush) / floor:.2f}x floor")  # fmt: skip


def cold_section(root: Path, records: int, repeats: int, baseline: Path | None) -> None:
    """Cold load vs pandas, cache reopen vs cold load, and resident bytes per record."""
    cold = root / f"cold{records}" / "metrics.jsonl"
    cache_dir = root / f"cache{records}"
    count = write_run(cold, records)
    size = cold.stat().st_size
    print(f"cold file: {count:,} records, {size / 1e6:.0f} MB, {size / count:.0f} B/line")
    from metrics_core.read.column_cache import CachePolicy

    writer = RunReader(cold, cache=CachePolicy(cache_dir, min_records=1))
    writer.refresh()
    writer.close()
    del writer  # its columns would distort the RSS measurement below
    baseline_cache = root / f"cache{records}-baseline"
    if baseline is not None:  # the baseline's own cache file, in its own format
        build = (f"import sys; sys.path.insert(0, {str(baseline)!r}); from pathlib import Path\n"
                 "from metrics_core.read.column_cache import CachePolicy\n"
                 "from metrics_core.read.run_reader import RunReader\n"
                 f"r = RunReader({str(cold)!r}, cache=CachePolicy(Path({str(baseline_cache)!r}), min_records=1))\n"
                 "r.refresh(); r.close()")  # fmt: skip
        subprocess.run([sys.executable, "-c", build], check=True)
    modes = ["reader", "pyarrow", "pandas", "reopen", *(["baseline", "baseline reopen"] if baseline else [])]
    loads: dict[str, list[Load]] = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode in modes:
            directory = baseline_cache if mode == "baseline reopen" else cache_dir if mode == "reopen" else None
            loads[mode].append(cold_load(mode, cold, directory, baseline))
    assert {load.rows for mode in modes if not mode.endswith("reopen") for load in loads[mode]} == {count}
    med = statistics.median

    def ratios(mode: str, over: str = "pandas", what: str = "seconds") -> list[float]:
        return [getattr(b, what) / getattr(a, what) for a, b in zip(loads[mode], loads[over], strict=True)]

    names = {"reader": "RunReader", "baseline": "RunReader --baseline", "pyarrow": "pyarrow.json.read_json",
             "pandas": "pandas.read_json(lines=True)"}  # fmt: skip
    for mode, name in names.items():
        if mode not in loads:
            continue
        runs = loads[mode]
        line = (
            f"cold load  {name:29s} {med(r.seconds for r in runs):6.2f} s wall, {med(r.cpu for r in runs):6.2f} s CPU"
        )
        line += f", peak RSS {max(r.peak for r in runs) / 1e9:.2f} GB (+{med(r.grown for r in runs) / 1e6:.0f} MB kept)"
        if mode != "pandas":
            rounds = ", ".join(f"{r:.1f}" for r in ratios(mode))
            line += f", {med(ratios(mode)):.1f}x pandas (rounds: {rounds})"
            # CPU seconds (all threads) per round: a round slow in wall time but not in CPU time was
            # descheduled (other work on the machine), not slowed by the loader.
            cpu_rounds = ", ".join(f"{r:.1f}" for r in ratios(mode, what="cpu"))
            line += f"; CPU {med(ratios(mode, what='cpu')):.1f}x ({cpu_rounds})"
        print(line)
    slower = med(1 / r for r in ratios("reader", "pyarrow"))
    print(f"cold load  RunReader takes {slower:.2f}x the time of pyarrow.json alone; goal: RunReader >= 5x pandas")
    cache_bytes = sum(p.stat().st_size for p in cache_dir.glob("*.mcc"))
    for reopen, parse, name in [("reopen", "reader", ""), ("baseline reopen", "baseline", " --baseline")]:
        if reopen not in loads:
            continue
        vs_cold = [1 / r for r in ratios(reopen, parse)]
        rounds = ", ".join(f"{100 * r:.1f}" for r in vs_cold)
        cpu = [1 / r for r in ratios(reopen, parse, what="cpu")]
        print(f"reopen{name:11s} from the cache: {med(r.seconds for r in loads[reopen]):.3f} s = "
              f"{100 * med(vs_cold):.1f} % of its cold parse (rounds: {rounds} %; goal <= 10 %); "
              f"CPU {100 * med(cpu):.1f} % ({', '.join(f'{100 * r:.1f}' for r in cpu)}), "
              f"cache file {cache_bytes / 1e6:.0f} MB")  # fmt: skip
    reader = RunReader(cold)
    reader.refresh()
    print(
        f"resident   {med(r.grown for r in loads['reader']) / count:.0f} B/record by RSS growth over the load, "
        f"{reader.resident_bytes() / count:.0f} B/record in columns (goal <= 150)"
    )
    cold.unlink()


if __name__ == "__main__":
    main()
