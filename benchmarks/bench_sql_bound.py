"""One SQL statement against the query process's memory bound, and what the process costs a query.

Run: python benchmarks/bench_sql_bound.py [--rows 1000] [--repeats 5] [--unguarded]

The statement ``SELECT repeat('x', 2000000) a, repeat('y', 2000000) b FROM range(ROWS)`` (one
vector of 4 MB a row, outside DuckDB's memory_limit) goes through ``query_process.query_root``
with the SQL box's 16 MB answer cap, in a process of its own standing for the server: printed,
how it ended, that process's peak resident memory (VmHWM) and the query process's
(``RUSAGE_CHILDREN``).  ``--unguarded`` runs it the old way too, in the server's own process
(``query.connect`` + ``query.run_query``): it takes about ROWS × 4 MB.  Then the price of the
process: a small query over a small root's export, median of ``--repeats``, in a process of its
own (``query_export``) and on a connection in this process, as wall time and as CPU time (which a
loaded machine does not stretch).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metrics_core.testing.generate import write_run  # noqa: E402

ATTACK = "SELECT repeat('x', 2000000) a, repeat('y', 2000000) b FROM range({rows})"
SERVER = """
import resource, sys
from datetime import datetime, timezone
from pathlib import Path
from metrics_core.sql.query import QueryError, connect, export_for_query, run_query
from metrics_core.sql.query_process import query_root
root, cache, sql, guarded = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
now = datetime.now(timezone.utc)
try:
    if guarded:
        result = query_root(root, sql, cache_home=cache, now=now, max_bytes=16 << 20)
    else:
        connection = connect(export_for_query(root, cache)[0], now=now)
        result = run_query(connection, sql, max_bytes=16 << 20)
    said = f"kept {result.table.nbytes >> 20} MB ({result.table.num_rows} rows)"
except QueryError as exc:
    said = str(exc)
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) >> 10
print(f"{said} | server peak {peak:,} MB | query process peak "
      f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10:,} MB")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--unguarded", action="store_true", help="also run it in the server's process (ROWS × 4 MB)")
    args = parser.parse_args()
    from metrics_core.sql.query import connect, export_for_query, run_query
    from metrics_core.sql.query_process import query_export

    with tempfile.TemporaryDirectory() as scratch:
        root, cache = Path(scratch) / "runs", Path(scratch) / "cache"
        for number in range(20):
            write_run(root / f"run{number:02d}" / "metrics.jsonl", 2_000, seed=number)
        sql = ATTACK.format(rows=args.rows)
        for guarded in (True, False) if args.unguarded else (True,):
            done = subprocess.run([sys.executable, "-c", SERVER, str(root), str(cache), sql, "1" if guarded else "0"],
                                  capture_output=True, text=True, cwd=REPO, check=True)  # fmt: skip
            print(f"{'in a query process' if guarded else 'in the server':<20} {done.stdout.strip()}")
        export = export_for_query(root, cache)[0]
        small = "SELECT run, count(*) AS n, min(train_loss) AS best FROM records GROUP BY run"
        now = datetime.now(timezone.utc)

        def in_process() -> None:
            connection = connect(export, now=now)
            try:
                run_query(connection, small)
            finally:
                connection.close()

        for name, ask in (("query process", lambda: query_export(export, small, now=now)), ("in process", in_process)):
            times, cpu = [], []
            for _ in range(args.repeats):
                started, used = time.perf_counter(), cpu_seconds()
                ask()
                times.append(time.perf_counter() - started)
                cpu.append(cpu_seconds() - used)
            print(f"small query, {name:<14} median {statistics.median(times):.3f} s, "
                  f"{statistics.median(cpu):.3f} s of CPU (both processes) over {args.repeats}")  # fmt: skip


def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children: a figure the machine's load does not move."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    main()
