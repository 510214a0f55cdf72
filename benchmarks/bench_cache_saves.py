"""A live long run's columnar cache saves, off the request path: ``RunStore.view()`` per append
across several save periods, p99 against the median, beside what one save costs.

Run: python benchmarks/bench_cache_saves.py [--records 1000000] [--seconds 60] [--interval 10] [--dir DIR]

On a copy of a run from ``generate.write_run`` (kept in ``--dir``), a store with a columnar cache
whose save period is ``--interval`` seconds (the dashboard's is minutes: the same save, more often)
and no saver delay, so saves run while the page's calls do.  A writer appends one train record of
the last session every ``APPEND_S`` for ``--seconds``; after each append the page's call, ``view()``,
is timed.  Printed: its median, p99 and max, the saves the store's saver thread wrote meanwhile,
and one save of the same reader timed on its own (what the refresh that noticed a save was due paid
for it, when the save ran there); beside it, in the same invocation, the same without a cache (no
save at all).  Goal: p99 <= 2x the median.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_snapshot import kept_run
from benchmarks.timing import percentile
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.read.column_cache import CachePolicy

APPEND_S = 0.1


def measure(kept: Path, *, seconds: float, interval: float | None) -> dict[str, float]:
    """``view()`` after each append to a copy of ``kept`` for ``seconds``, with a cache saved every
    ``interval`` seconds (None: no cache); and, with one, the saves written and one save timed."""
    last = orjson.loads(kept.read_bytes()[-4096:].splitlines()[-1])
    with tempfile.TemporaryDirectory() as tmp:
        root, cache = Path(tmp) / "runs", Path(tmp) / "cache"
        (root / "r").mkdir(parents=True)
        path = root / "r" / "metrics.jsonl"
        shutil.copyfile(kept, path)
        policy = None if interval is None else CachePolicy(cache, interval_s=interval)
        store = RunStore(root, StoreSettings(cache=policy, safety_interval=0.0, saver_delay_s=0.0))
        try:
            store.view("r")  # the cold parse (its save runs on the saver thread)
            deadline = time.monotonic() + 120
            while policy is not None and store.stats["cache_saves"] < 1:
                if time.monotonic() > deadline:  # a run below the cache's threshold is never saved
                    raise SystemExit(f"no cache save in 120 s: --records must be at least {policy.min_records:,}")
                time.sleep(0.1)
            saves_before, times = store.stats["cache_saves"], []
            end, number = time.monotonic() + seconds, 0
            while time.monotonic() < end:
                number += 1
                record = {**last, "step": last["step"] + 10 * number, "tokens_seen": last["tokens_seen"] + number}
                with open(path, "ab") as out:
                    out.write(orjson.dumps(record) + b"\n")
                start = time.perf_counter()
                store.view("r")
                times.append(time.perf_counter() - start)
                time.sleep(APPEND_S)
            found = {"saves": store.stats["cache_saves"] - saves_before, "one_save": float("nan")}
            if policy is not None:
                entry = store._entries["r"]
                with entry.lock:
                    start = time.perf_counter()
                    entry.reader.save_cache()
                    found["one_save"] = time.perf_counter() - start
        finally:
            store.close()
    times.sort()
    return {
        **found,
        "appends": len(times),
        "median": statistics.median(times),
        "p99": percentile(times, 0.99),
        "max": times[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=10.0, help="the cache's save period, seconds")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "metrics_bench_cache_saves")
    args = parser.parse_args()
    kept = kept_run(args.dir, args.records)
    for label, interval in (("no cache", None), (f"a save every {args.interval:.0f} s", args.interval)):
        found = measure(kept, seconds=args.seconds, interval=interval)
        median, p99 = found["median"], found["p99"]
        print(
            f"{label}: {found['appends']} appends, {found['saves']} saves on the saver thread; view() median "
            f"{median * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms ({p99 / median:.2f}x the median, goal <= 2x), "
            f"max {found['max'] * 1e3:.1f} ms; one save timed alone {found['one_save'] * 1e3:.0f} ms"
        )


if __name__ == "__main__":
    main()
