"""A live append to a long run: what ``RunStore.view()`` costs per append.

Run: python benchmarks/bench_snapshot.py [--records 1000000] [--appends 30] [--batch 10] [--dir DIR]

On a run from ``generate.write_run`` (kept in ``--dir`` between invocations, copied per size so
the appends never touch the kept file), side by side in one process:

* extended: a store with the run open appends one train record of the last session and calls
  ``view()``, ``--appends`` times (the snapshot and the runs page's summary extended from the last);
* from scratch: the same snapshot built anew from the same reader (``snapshot.build_view`` without a
  previous view: every frame and supersession mask recomputed), as each append cost before;
* both on ``--records`` and on a tenth of it: an O(appended records) update costs the same on both.

The two alternate in batches of ``--batch`` (appends, then as many from-scratch builds), not one
each: a from-scratch build of a 1M-record run allocates and touches ~100 MB, and the append
measured right after it paid for that churn (cache and page misses: 2.8 ms instead of 1.3 ms
per append), which is not what a live page pays between two appends.
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

from metrics_core.dashboard.store import run_store as store_module
from metrics_core.dashboard.store.snapshot import build_view
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.testing.generate import write_run


def kept_run(directory: Path, records: int) -> Path:
    path = directory / f"run-{records}" / "metrics.jsonl"
    if not path.exists():
        write_run(path, records)
    return path


def per_append_ms(path: Path, appends: int, batch: int) -> dict[str, float]:
    """Median ms per append of ``view()`` and of a from-scratch build, on a copy of ``path``,
    alternating in batches of ``batch``."""
    root = Path(tempfile.mkdtemp(prefix="metrics_bench_snapshot_"))
    try:
        (root / "r").mkdir()
        shutil.copyfile(path, root / "r" / "metrics.jsonl")
        last = orjson.loads(path.read_bytes()[-4096:].splitlines()[-1])
        store = store_module.RunStore(root, StoreSettings(safety_interval=0.0))
        try:
            view = store.view("r")
            extended, scratch = [], []
            for number in range(1, appends + 1):
                record = {**last, "step": last["step"] + 10 * number, "tokens_seen": last["tokens_seen"] + number}
                with open(root / "r" / "metrics.jsonl", "ab") as out:
                    out.write(orjson.dumps(record) + b"\n")
                start = time.perf_counter()
                view = store.view("r")  # the previous view is held: what the new one extends
                extended.append(time.perf_counter() - start)
                if number % batch and number != appends:
                    continue
                reader = store._entries["r"].reader
                for _ in range(batch):
                    start = time.perf_counter()
                    build_view("r", reader, view.status)
                    scratch.append(time.perf_counter() - start)
        finally:
            store.close()
    finally:
        shutil.rmtree(root)
    return {"extended": statistics.median(extended) * 1e3, "scratch": statistics.median(scratch) * 1e3,
            "records": view.records}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--appends", type=int, default=30)
    parser.add_argument("--batch", type=int, default=10, help="appends, then from-scratch builds, alternating")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "metrics_bench_snapshot")
    args = parser.parse_args()
    sizes = (args.records // 10, args.records)
    small, large = (per_append_ms(kept_run(args.dir, size), args.appends, args.batch) for size in sizes)
    for found in (small, large):
        ratio = found["scratch"] / found["extended"]
        print(f"{found['records']:>9} records: view() after an append {found['extended']:.1f} ms (median of "
              f"{args.appends}), from scratch {found['scratch']:.1f} ms: {ratio:.1f}x")  # fmt: skip
    print(f"10x the records: view() per append {large['extended'] / small['extended']:.1f}x, "
          f"from scratch {large['scratch'] / small['scratch']:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
