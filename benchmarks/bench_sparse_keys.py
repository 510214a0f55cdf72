"""What keys logged on few records cost: a per-task evaluation of ``--keys`` keys on ``--evals``
train records of a ``--records``-record run, against the same run without them, and the shape
doubled (twice the records and twice the evaluations: twice the values held; a record holds at
most ``records.MAX_FIELDS`` keys, so the keys stay as they are).

Run: python benchmarks/bench_sparse_keys.py [--records 20000] [--keys 2500] [--evals 20] [--settle 10]
                                            [--server] [--baseline DIR]

* ``reader``: the bytes of the parsed columns (``RunReader.resident_bytes``) of each run, and the
  time to read it cold, in this process.
* ``snapshot``: the bytes the dashboard's snapshot holds for the keys (``EventColumns`` arrays),
  and a live append's cost: one record appended, then the refresh, the next snapshot, its chart
  list and x-axis keys, the median of ``APPENDS``.
* ``--server``: the resident memory (``/proc/<pid>/status`` VmRSS) of a real dashboard server with
  one headless Chromium tab on each run's page, its first charts drawn and ``--settle`` seconds
  later; the difference is what the keys cost the server (goal: within 60 MB at 20,000 records of
  2,500 keys on 20 records).  ``--baseline DIR``: the same servers run from the tree ``DIR`` too
  (another checkout, before a change), side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_live import server_pid
from benchmarks.bench_memory import open_run_page, rss
from metrics_core.dashboard.store.snapshot import Lineage, build_view
from metrics_core.dashboard.views.memo import view_charts_of, view_x_keys
from metrics_core.read.run_reader import RunReader
from metrics_core.testing.generate import record, write_run
from metrics_core.testing.live_server import REPO, chromium, streamlit_app

MB = 1e6


APPENDS = 9


def offline(path: Path) -> tuple[int, int, float, float]:
    """(reader's column bytes, snapshot bytes of the ``eval/`` keys, seconds to read cold, seconds
    of a live append: ``APPENDS`` records appended one at a time, the median)."""
    start = time.perf_counter()
    reader = RunReader(path)
    reader.refresh()
    seconds = time.perf_counter() - start
    lineage = Lineage()
    view = build_view(path.parent.name, reader, "running", lineage)
    view_charts_of(view), view_x_keys(view)
    train = view.columns["train"]
    held = sum(train.array(name).nbytes for name in train.names if name.startswith("eval/"))
    costs = []
    for index in range(APPENDS):
        with open(path, "ab") as out:
            out.write(record(reader.sessions[-1].session_id, "train", 10**9 + index, 0, 0, 2 * 10**18, train_loss=1.0))
        start = time.perf_counter()
        reader.refresh()
        view = build_view(path.parent.name, reader, "running", lineage, previous=view)
        view_charts_of(view), view_x_keys(view)
        costs.append(time.perf_counter() - start)
    return reader.resident_bytes(), held, seconds, statistics.median(costs)


def server_rss(root: Path, run: str, settle: float, repo: Path) -> int:
    """The RSS of a server (the code of the tree ``repo``) with one tab on ``run``, ``settle`` s after it drew."""
    with tempfile.TemporaryDirectory() as cache:
        args = ("--runs", str(root), "--refresh", "1.0", "--cache-dir", cache)
        with streamlit_app(repo / "app.py", *args, repo=repo) as url, chromium() as browser:
            open_run_page(browser, url, run, 4)
            time.sleep(settle)
            return rss(server_pid(url))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=2_500)
    parser.add_argument("--evals", type=int, default=20)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after the charts drew")
    parser.add_argument("--server", action="store_true", help="measure real servers too")
    parser.add_argument("--baseline", type=Path, help="another tree whose servers are measured beside these")
    args = parser.parse_args()
    trees = [REPO] + ([args.baseline.resolve()] if args.baseline else [])
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (1, 2):
            records, keys, evals = args.records * scale, args.keys, args.evals * scale
            root = Path(tmp) / f"x{scale}"
            write_run(root / "evals" / "metrics.jsonl", records, eval_keys=keys, evals=evals)
            write_run(root / "plain" / "metrics.jsonl", records)
            shape = f"{records:,} records, {keys:,} keys on {evals} of them ({keys * evals:,} values)"
            (sparse, held, seconds, append), (plain, _, plain_seconds, plain_append) = (
                offline(root / run / "metrics.jsonl") for run in ("evals", "plain")
            )
            print(
                f"{shape}: reader columns {sparse / MB:.1f} MB vs {plain / MB:.1f} MB without the keys "
                f"(+{(sparse - plain) / MB:.2f} MB), read cold in {seconds:.2f} s vs {plain_seconds:.2f} s; "
                f"snapshot's arrays of the keys {held / MB:.2f} MB; a live append {append * 1e3:.1f} ms vs "
                f"{plain_append * 1e3:.1f} ms"
            )
            if not args.server:
                continue
            for tree in trees:
                with_keys = server_rss(root, "evals", args.settle, tree)
                without = server_rss(root, "plain", args.settle, tree)
                print(
                    f"  server ({tree}): {with_keys / MB:.0f} MB with the keys, {without / MB:.0f} MB without: "
                    f"+{(with_keys - without) / MB:.0f} MB (goal at 20,000 records of 2,500 keys: <= 60 MB)"
                )


if __name__ == "__main__":
    main()
