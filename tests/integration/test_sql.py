"""Parquet export and SQL over every run through buckets and the command line: the export is
incremental in a bucket, and the CLI refuses every writing statement (the engine alone is in
tests/heavy/test_sql_engine.py)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metrics_core.sql.export import MANIFEST, export_root, file_name
from metrics_core.sql.query import connect, run_query
from tests.support import BUCKET, REPO, append_records, base_record, put_object, small_run, three_session_run
from tests.support.reading import NOW, query, snapshot_files

pytest.importorskip("duckdb", reason="duckdb (the sql extra) is not installed")


def test_export_to_a_bucket_and_a_second_export_uploads_nothing(tmp_path: Path, bucket: object) -> None:
    """s3://…: every run's file and the manifest are uploaded; a second export of the unchanged root
    uploads nothing (every object's Last-Modified as it was, a second later); an append re-uploads one."""
    from pyarrow import fs as pafs

    root = tmp_path / "runs"
    for number in range(3):
        small_run(root / f"run{number}" / "metrics.jsonl")
    url = f"s3://{BUCKET}/exports/team"

    def objects() -> dict[str, object]:
        infos = bucket.get_file_info(pafs.FileSelector(f"{BUCKET}/exports/team"))
        return {info.base_name: info.mtime for info in infos}

    assert len(export_root(root, url).written) == 3
    first = objects()
    assert set(first) == {MANIFEST, *(file_name(f"run{number}") for number in range(3))}
    time.sleep(1.1)  # Last-Modified counts seconds: an upload now would show
    assert export_root(root, url).written == () and objects() == first
    append_records(root / "run1" / "metrics.jsonl", base_record(510, train_loss=0.001))
    assert export_root(root, url).written == ("run1",)
    changed = {name for name, when in objects().items() if when != first[name]}
    assert changed == {file_name("run1"), MANIFEST}


WRITES = [
    "CREATE TABLE t AS SELECT 1",
    "DELETE FROM records",
    "COPY (SELECT 1) TO '{tmp}/copied.csv'",
    "INSERT INTO records VALUES (1)",
    "ATTACH '{tmp}/attached.duckdb'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET threads = 1",
    "DROP VIEW runs",
    "UPDATE records SET step = 0",
    "EXPORT DATABASE '{tmp}/dump'",
    "SELECT 1; COPY (SELECT 1) TO '{tmp}/second.csv'",
    "PRAGMA enable_profiling",
    "CALL pragma_version()",
    "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 42",
    "EXPLAIN (ANALYZE) COPY (SELECT 1) TO '{tmp}/explained.csv'",
]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metrics_core", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=60)  # fmt: skip


@pytest.mark.parametrize("statement", WRITES)
def test_the_cli_refuses_every_writing_statement_in_one_line(statement: str, tmp_path: Path) -> None:
    """`query ROOT "<a statement that writes or changes state>"`: exit status 2, one line on stderr
    naming the refusal, nothing on stdout, no file made anywhere under tmp_path."""
    root = tmp_path / "runs"
    small_run(root / "run0" / "metrics.jsonl")
    before = sorted(tmp_path.rglob("*"))
    done = cli("query", str(root), statement.format(tmp=tmp_path), env={"METRICS_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: refused: "), done.stderr
    assert sorted(tmp_path.rglob("*")) == before


def test_query_over_a_root_exports_into_the_cache_and_never_writes_the_root(tmp_path: Path) -> None:
    """`query ROOT "SELECT …" --format csv`: the answer, from an export made in the cache directory; the
    runs root is byte for byte and entry for entry as it was; a cache inside the root is refused."""
    root = tmp_path / "runs"
    three_session_run(root / "a" / "metrics.jsonl")
    small_run(root / "b" / "metrics.jsonl")
    before = {path: path.stat().st_mtime_ns for path in [root, *root.rglob("*")]}
    cache = tmp_path / "cache"
    done = cli("query", str(root), "SELECT run, sessions, records, last_step FROM runs ORDER BY run", "--format",
               "csv", "--cache-dir", str(cache))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "run,sessions,records,last_step\na,3,36,200\nb,1,50,500\n"
    assert {path: path.stat().st_mtime_ns for path in [root, *root.rglob("*")]} == before
    assert len(list((cache / "sql").glob("*/*.parquet"))) == 2
    inside = cli("query", str(root), "SELECT 1", "--cache-dir", str(root / "cache"))
    assert inside.returncode == 2 and "inside the runs root" in inside.stderr and not (root / "cache").exists()


def test_importing_the_package_and_the_cli_loads_no_duckdb_or_pyarrow() -> None:
    """The training side stays light with the sql commands in the command line."""
    code = (
        "import sys, metrics_core, metrics_core.cli.main, metrics_core.sql.query\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'duckdb', 'pyarrow', 'pandas', 'numpy'}))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_the_export_command_and_a_query_over_its_directory(tmp_path: Path) -> None:
    """`export ROOT OUT` says what it did (twice: the second time nothing), refuses an OUT inside the root,
    and `query OUT …` reads that export as it is."""
    root = tmp_path / "runs"
    three_session_run(root / "a" / "metrics.jsonl")
    small_run(root / "b" / "metrics.jsonl")
    out, cache = tmp_path / "export", ("--cache-dir", str(tmp_path / "cache"))
    first, second = cli("export", str(root), str(out), *cache), cli("export", str(root), str(out), *cache)
    assert first.stdout == "exported 2 run(s), 0 unchanged, 0 removed\n" and first.returncode == 0, first.stderr
    assert second.stdout == "exported 0 run(s), 2 unchanged, 0 removed\n" and second.returncode == 0
    inside = cli("export", str(root), str(root / "export"), *cache)
    assert inside.returncode == 2 and inside.stderr.count("\n") == 1 and not (root / "export").exists()
    done = cli("query", str(out), "SELECT count(*) AS n FROM records WHERE superseded", "--format", "csv")
    assert done.stdout == "n\n9\n" and done.returncode == 0


CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # all but \t and \n


def test_the_query_command_prints_another_users_text_inert_in_every_format(tmp_path: Path) -> None:
    """A run whose directory, session id, key and values hold terminal escapes, a bidi override and
    spreadsheet formulas: `query` as a table and as CSV prints none of the controls; in CSV a text
    cell or header that starts like a formula starts with ', and -1.5 stays a number."""
    evil = "\x1b]0;pwned\x07\x1b[31m\u202e"
    root = tmp_path / "runs"
    formula = '=HYPERLINK("http://evil.example","x")'
    records = (base_record(step, session=f"s{evil}", train_loss=-1.5, note=formula + evil, **{f"@k{evil}": -2.0})
               for step in (1, 2))  # fmt: skip
    append_records(root / f"ru{evil}n" / "metrics.jsonl", *records)
    cache = ("--cache-dir", str(tmp_path / "cache"))
    table = cli("query", str(root), "SELECT * FROM records", *cache)
    assert table.returncode == 0 and not CONTROLS.search(table.stdout + table.stderr), table.stdout
    done = cli("query", str(root), "SELECT * FROM records", "--format", "csv", *cache)
    assert done.returncode == 0 and not CONTROLS.search(done.stdout + done.stderr), done.stdout
    header, *rows = csv.reader(io.StringIO(done.stdout))
    assert "'@k" in header and len(rows) == 2  # the escapes gone, whole: no "]0;pwned" left over either
    for row in rows:
        cells = dict(zip(header, row, strict=True))
        assert cells["note"] == "'" + formula and cells["train_loss"] == "-1.5"
        assert cells["run"] == "run" and cells["session"] == "s" and cells["'@k"] == "-2.0"


def test_a_query_piped_into_a_reader_that_leaves_ends_quietly(tmp_path: Path) -> None:
    """`query … --format csv | head -1`: the reader closes the pipe after one line; the command
    ends with status 0 and says nothing (the query process is stopped, not reported as failed)."""
    root = tmp_path / "runs"
    small_run(root / "run" / "metrics.jsonl")
    command = [sys.executable, "-m", "metrics_core", "query", str(root), "SELECT * FROM range(10000000)", "--format",
               "csv", "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO) as query:
        assert query.stdout.readline() == b"range\n"
        query.stdout.close()
        assert query.wait(timeout=120) == 0 and query.stderr.read() == b""


def tamper(export: Path, run: str, file: str) -> None:
    """Give the export's manifest an entry for ``run`` (a copy of another's) whose file is ``file``."""
    manifest = json.loads((export / MANIFEST).read_text())
    manifest["runs"][run] = {**next(iter(manifest["runs"].values())), "file": file}
    (export / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("file", ["../victim.txt", "{tmp}/victim.txt", "sub/victim.txt", "..", "..\\victim.txt", ""])
def test_an_export_refuses_a_manifest_entry_that_is_not_a_plain_file_name(tmp_path: Path, file: str) -> None:
    """A manifest entry whose file is outside the export (``../victim.txt``, an absolute path, a
    subdirectory) for a run gone from the root: `export` refuses in one line naming the entry,
    and deletes nothing, the victim least of all."""
    root, out = tmp_path / "runs", tmp_path / "export"
    small_run(root / "a" / "metrics.jsonl")
    victim = tmp_path / "victim.txt"
    victim.write_text("not the export's")
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "victim.txt").write_text("not the export's either")
    assert export_root(root, out).written == ("a",)
    tamper(out, "gone", file.format(tmp=tmp_path))
    before = snapshot_files(tmp_path)
    done = cli("export", str(root), str(out), "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "the entry of run 'gone'" in done.stderr and "plain file name" in done.stderr
    assert victim.read_text() == "not the export's" and (out / "sub" / "victim.txt").exists()
    assert snapshot_files(tmp_path) == before


def test_a_query_refuses_a_manifest_entry_that_reads_outside_the_export(tmp_path: Path) -> None:
    """A manifest entry whose file is a Parquet file outside the export (by an absolute path or
    ``../``): `query` refuses in one line naming the entry instead of reading that file's rows."""
    root, out = tmp_path / "runs", tmp_path / "export"
    small_run(root / "a" / "metrics.jsonl")
    export_root(root, out)
    outside = tmp_path / "outside.parquet"
    outside.write_bytes((out / file_name("a")).read_bytes())
    for file in (str(outside), "../outside.parquet"):
        tamper(out, "stolen", file)
        done = cli("query", str(out), "SELECT count(*) AS n FROM records", "--format", "csv")
        assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stdout
        assert "the entry of run 'stolen'" in done.stderr and repr(file) in done.stderr


# -- a runs root in a bucket ----------------------------------------------------------------------

COMPARED = (
    "SELECT run, sessions, records, superseded_records, last_step, tokens_seen, min_train_loss, last_train_loss, "
    "min_val_loss, bad_lines, file FROM runs ORDER BY run",
    "SELECT run, session, session_index, first_step, last_step, records, own_records_superseded, min_train_loss, "
    "steps_replayed, resumed_from_step FROM sessions ORDER BY run, session_index",
    "SELECT run, event, count(*), sum(step), min(train_loss), max(val_loss), count(*) FILTER (WHERE superseded), "
    "min(time) FROM records GROUP BY ALL ORDER BY ALL",
)


def upload_root(filesystem: object, root: Path, prefix: str) -> None:
    """Every run of the local ``root`` into the test bucket under ``prefix``, one object per run."""
    for path in root.rglob("metrics.jsonl"):
        put_object(filesystem, f"{prefix}/{path.parent.relative_to(root).as_posix()}/metrics.jsonl", path.read_bytes())


def small_root(root: Path) -> Path:
    """Runs of several shapes: resumed, plain, nested, odd field names and events."""
    three_session_run(root / "resumed" / "metrics.jsonl")
    small_run(root / "team" / "plain" / "metrics.jsonl")
    odd = (base_record(1, note="x", flag=True, Train_Loss=3.0, run="mine"), base_record(2, event="eval", note=5),
           base_record(3, event="session_end", status="finished"))  # fmt: skip
    append_records(root / "odd" / "metrics.jsonl", *odd)
    return root


def answers(root: str | Path, cache: Path) -> list[list[tuple]]:
    from metrics_core.sql.query_process import query_root

    return [query_root(root, sql, cache_home=cache, now=NOW).table.to_pylist() for sql in COMPARED]


def test_a_query_over_a_bucket_root_equals_the_query_over_the_same_runs_on_disk(tmp_path: Path, bucket: object) -> None:
    """`query s3://bucket/prefix "SELECT …"` reads the runs through the bucket root the dashboard uses
    and answers what the same query over the runs on disk answers, for the runs, sessions and records
    views; a second export of the unchanged bucket root writes nothing, and a run uploaded longer
    rewrites its file alone."""
    root = small_root(tmp_path / "runs")
    upload_root(bucket, root, "exp")
    url = f"s3://{BUCKET}/exp"
    assert answers(url, tmp_path / "cache") == answers(root, tmp_path / "cache")
    assert len(list((tmp_path / "cache" / "sql").iterdir())) == 2  # one export per root, never the root itself
    done = cli("query", url, "SELECT run, records FROM runs ORDER BY run", "--format", "csv", "--cache-dir",
               str(tmp_path / "cache"))  # fmt: skip
    assert done.returncode == 0 and done.stdout == "run,records\nodd,3\nresumed,36\nteam/plain,50\n", done.stderr

    out = tmp_path / "export"
    assert sorted(export_root(url, out).written) == ["odd", "resumed", "team/plain"]
    before = snapshot_files(out)
    report = export_root(url, out)
    assert report.written == () and report.unchanged == 3 and snapshot_files(out) == before
    append_records(root / "odd" / "metrics.jsonl", base_record(4, train_loss=0.5))
    put_object(bucket, "exp/odd/metrics.jsonl", (root / "odd" / "metrics.jsonl").read_bytes())
    assert export_root(url, out).written == ("odd",)
    assert query(out, "SELECT count(*) FROM records WHERE run = 'odd'") == [(4,)]


def test_export_from_one_bucket_to_another_and_a_query_over_the_bucket_export(
    tmp_path: Path, bucket: object, gcs: object
) -> None:
    """`export s3://… gs://…` uploads every run's file and the manifest to Cloud Storage and, run
    again on the unchanged root, uploads nothing (every object's time as it was); `query gs://…`
    over that export answers as over the runs on disk, and a gs:// runs root answers alike too."""
    from pyarrow import fs as pafs

    root = small_root(tmp_path / "runs")
    upload_root(bucket, root, "exp")
    upload_root(gcs, root, "exp")
    cache = ("--cache-dir", str(tmp_path / "cache"))
    first = cli("export", f"s3://{BUCKET}/exp", f"gs://{BUCKET}/exports", *cache)
    assert first.stdout == "exported 3 run(s), 0 unchanged, 0 removed\n" and first.returncode == 0, first.stderr

    def objects() -> dict[str, object]:
        return {info.base_name: info.mtime for info in gcs.get_file_info(pafs.FileSelector(f"{BUCKET}/exports"))}

    uploaded = objects()
    assert set(uploaded) == {MANIFEST, *(file_name(run) for run in ("odd", "resumed", "team/plain"))}
    time.sleep(1.1)  # object times count seconds: an upload now would show
    second = cli("export", f"s3://{BUCKET}/exp", f"gs://{BUCKET}/exports", *cache)
    assert second.stdout == "exported 0 run(s), 3 unchanged, 0 removed\n" and objects() == uploaded
    local = answers(root, tmp_path / "cache")

    for sql, expected in zip(COMPARED, local, strict=True):
        connection = connect(f"gs://{BUCKET}/exports", now=NOW)
        try:
            assert run_query(connection, sql).table.to_pylist() == expected
        finally:
            connection.close()
    assert answers(f"gs://{BUCKET}/exp", tmp_path / "cache") == local
    inside = cli("export", f"gs://{BUCKET}/exp", f"gs://{BUCKET}/exp/export", *cache)
    assert inside.returncode == 2 and inside.stderr.count("\n") == 1 and "inside the runs root" in inside.stderr


def test_the_runs_pages_query_box_reads_a_bucket_root(
    tmp_path: Path, bucket: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--runs s3://bucket/prefix`: the runs page's SQL box answers from the runs in the bucket, read
    through the root, exported into the server's cache directory."""
    from tests.support import open_page

    upload_root(bucket, small_root(tmp_path / "runs"), "exp")
    monkeypatch.setenv("METRICS_RUNS_DIR", f"s3://{BUCKET}/exp")
    monkeypatch.setenv("METRICS_CACHE_DIR", str(tmp_path / "cache"))
    app = open_page("runs")
    app.text_area(key="sql_text").input("SELECT run, records FROM runs ORDER BY run")
    next(button for button in app.button if button.label == "Run query").click().run()
    assert not app.exception and not app.error, [*app.exception, *app.error]
    frame = next(frame.value for frame in app.dataframe if list(frame.value.columns) == ["run", "records"])
    assert frame.to_dict("list") == {"run": ["odd", "resumed", "team/plain"], "records": [3, 36, 50]}
