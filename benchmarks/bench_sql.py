"""SQL over every run: Parquet export against a cold parse, incremental re-export, query latency.

Run: python benchmarks/bench_sql.py [--root DIR] [--small 990 --big 9 --big-records 550000 --huge 5000000]

The root is ``generate_root.make_root`` (``--small`` runs of ~100 records, ``--big`` runs of
``--big-records``, the live run: 1,000 runs by default) plus one run of ``--huge`` records from
``generate.write_run``: ~10M records in all.  Written once and reused (``.complete``).

Measured, each in a subprocess of its own so that its time and memory are its own:

* the cold parse of every run (``RunReader(...).refresh()``, no cache) against the export of the
  root (which parses the same and writes Parquet), for the whole root and for the huge run alone
  (a root holding a hard link of its file);
* a second export of the unchanged root (files written: none), then one after 100 records were
  appended to the huge run, with the parse cache the first export saved (one file rewritten);
* query latency over the export (the locked-down connection: ``metrics_core.sql.query.connect``), median
  of ``--repeats``, with DuckDB's own Parquet reader over the same files for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.generate_root import make_root  # noqa: E402
from metrics_core.testing.generate import write_run  # noqa: E402

QUERIES = {
    "records per run": "SELECT run, count(*) FROM records GROUP BY run",
    "min train loss per run, effective": "SELECT run, min(train_loss) FROM records WHERE NOT superseded GROUP BY run",
    "one run's loss, steps 1000..2000": "SELECT step, train_loss FROM records WHERE run = 'huge' AND event = 'train' "
    "AND step BETWEEN 1000 AND 2000",
    "runs view": "SELECT run, status, sessions, last_step, min_train_loss FROM runs ORDER BY min_train_loss LIMIT 10",
    "superseded per session": "SELECT run, session, count(*) FILTER (WHERE superseded) FROM records GROUP BY ALL",
}

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from metrics_core.read.column_cache import CachePolicy
from metrics_core.sql.export import export_root
from metrics_core.read.run_reader import RunReader
from metrics_core.roots.discovery import find_runs
what, args = sys.argv[1], json.loads(sys.argv[2])
start = time.perf_counter()
if what == "parse":
    records = 0
    for run in find_runs(args["root"]):
        reader = RunReader(run.directory)
        records += reader.refresh()
        reader.close()
    result = {{"records": records}}
else:
    report = export_root(args["root"], args["out"], cache=CachePolicy(args["cache"]))
    result = {{"written": len(report.written), "unchanged": report.unchanged}}
result["seconds"] = time.perf_counter() - start
result["peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(json.dumps(result))
"""


def child(what: str, **args: object) -> dict:
    output = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(REPO)), what, json.dumps(args)],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    return json.loads(output.strip().splitlines()[-1])


def parquet_state(out: Path) -> dict[str, tuple[int, int]]:
    return {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in out.glob("*.parquet")}


def query_latency(out: Path, repeats: int) -> None:
    from datetime import datetime, timezone

    import duckdb

    from metrics_core.sql.query import connect, run_query

    files = f"{out}/*.parquet"
    for name, sql in QUERIES.items():
        ours, native = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            connection = connect(out, now=datetime.now(timezone.utc))
            run_query(connection, sql)
            connection.close()
            ours.append(time.perf_counter() - start)
            if "runs" not in sql.split("FROM ")[1][:5]:
                plain = duckdb.connect()
                plain.execute(f"CREATE VIEW records AS SELECT * FROM read_parquet('{files}', union_by_name=true)")
                start = time.perf_counter()
                plain.sql(sql).fetchall()
                native.append(time.perf_counter() - start)
                plain.close()
        reference = f"; DuckDB's own Parquet reader {statistics.median(native):.3f} s" if native else ""
        print(f"query '{name}': {statistics.median(ours):.3f} s (connect + query){reference}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "bench_sql_root")
    parser.add_argument("--small", type=int, default=990)
    parser.add_argument("--big", type=int, default=9)
    parser.add_argument("--big-records", type=int, default=550_000)
    parser.add_argument("--huge", type=int, default=5_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    root = make_root(args.root / "root", small=args.small, big=args.big, big_records=args.big_records)
    huge = root / "huge" / "metrics.jsonl"
    if not huge.exists():
        write_run(huge, args.huge, seed=99)
    alone = args.root / "huge-alone"
    if not (alone / "huge" / "metrics.jsonl").exists():
        (alone / "huge").mkdir(parents=True, exist_ok=True)
        os.link(huge, alone / "huge" / "metrics.jsonl")
    work = Path(tempfile.mkdtemp(prefix="bench_sql_"))
    try:
        for label, where in (("huge run alone", alone), ("whole root", root)):
            parse = child("parse", root=str(where))
            export = child("export", root=str(where), out=str(work / label), cache=str(work / f"cache-{label}"))
            print(f"{label}: {parse['records']:,} records; cold parse {parse['seconds']:.1f} s "
                  f"(peak {parse['peak_gb']:.2f} GB), export {export['seconds']:.1f} s "
                  f"(peak {export['peak_gb']:.2f} GB): {export['seconds'] / parse['seconds']:.2f}x")  # fmt: skip
        out, cache = work / "whole root", work / "cache-whole root"
        size = sum(path.stat().st_size for path in out.glob("*.parquet"))
        source = sum(path.stat().st_size for path in root.rglob("metrics.jsonl"))
        print(f"export size: {size / 1e9:.2f} GB of Parquet for {source / 1e9:.2f} GB of JSON lines")
        before = parquet_state(out)
        again = child("export", root=str(root), out=str(out), cache=str(cache))
        changed = sum(before[name] != state for name, state in parquet_state(out).items())
        print(f"second export, unchanged root: {again['seconds']:.2f} s, {changed} files written")
        with open(huge, "rb+") as handle:
            handle.seek(-50_000, os.SEEK_END)
            tail = handle.read().split(b"\n", 1)[1]  # whole lines, appended again
            handle.write(tail)
        before = parquet_state(out)
        grown = child("export", root=str(root), out=str(out), cache=str(cache))
        changed = sum(before[name] != state for name, state in parquet_state(out).items())
        print(f"export after an append to the huge run: {grown['seconds']:.1f} s, {changed} file(s) written")
        query_latency(out, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
