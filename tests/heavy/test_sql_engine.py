"""Parquet export and SQL over every run, in this process: DuckDB's answers equal the reader's, the
export is incremental, and nothing but a read gets through the locked-down connection."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pandas as pd
import pytest

from metrics_core.read.run_reader import RunReader
from metrics_core.roots.discovery import find_runs
from metrics_core.sql.export import MANIFEST, export_root, file_name
from metrics_core.sql.query import QueryError, connect, run_query
from metrics_core.sql.query_views import CONFIG_EXAMPLE, help_text
from tests.support import append_records, base_record, small_run, three_session_run
from tests.support.reading import NOW, query, snapshot_files

pytest.importorskip("duckdb", reason="duckdb (the sql extra) is not installed")

BIG_FIRST, BIG_RESUME, BIG_LAST = 100_000, 80_000, 180_000  # the big run: s1 to 100k, s2 resumes at 80k


def big_resumed_run(path: Path) -> None:
    """~200k records in two sessions: s1 logs steps 1..100,000 (a validation every 1,000), then crashes;
    s2 resumes at 80,000 and runs to 180,000, superseding s1's records above 80,000."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        for session, first, last in (("s1", 1, BIG_FIRST), ("s2", BIG_RESUME, BIG_LAST)):
            lines = [orjson.dumps(base_record(first, event="session_start", session=session)) + b"\n"]
            for step in range(first + (session == "s2"), last + 1):
                lines.append(orjson.dumps(base_record(step, session=session, train_loss=1.0 + 100.0 / step)) + b"\n")
                if step % 1000 == 0:
                    lines.append(orjson.dumps(base_record(step, event="validation", session=session,
                                                          val_loss=2.0 + 50.0 / step)) + b"\n")  # fmt: skip
            out.write(b"".join(lines))


def make_root(root: Path) -> Path:
    """~50 small runs of several shapes plus the big resumed run."""
    for number in range(45):
        small_run(root / f"team{number % 3}" / f"sweep-{number:02d}" / "metrics.jsonl")
    for number in range(4):
        three_session_run(root / f"resumed-{number}" / "metrics.jsonl")
    odd = (base_record(1, note="x", flag=True, Train_Loss=3.0, run="mine"), base_record(2, event="eval", note=5),
           base_record(3, event="session_end", status="finished"))  # fmt: skip
    append_records(root / "odd" / "metrics.jsonl", *odd)
    big_resumed_run(root / "big" / "metrics.jsonl")
    return root


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The root, exported once for the module's read-only tests."""
    base = tmp_path_factory.mktemp("sql")
    root = make_root(base / "runs")
    export_root(root, base / "export")
    return root, base / "export"


def readers(root: Path) -> dict[str, RunReader]:
    result = {}
    for run in find_runs(root):
        reader = RunReader(run.directory)
        reader.refresh()
        result[run.name] = reader
    return result


def same(a: float | None, b: float | None) -> bool:
    return ((a is None or math.isnan(a)) and (b is None or math.isnan(b))) or a == b


def test_duckdb_answers_equal_the_readers(exported: tuple[Path, Path]) -> None:
    """Per run: records, superseded records, last step and min effective train loss; per session: records,
    superseded records, first and last step and min train loss: DuckDB over the export says what RunReader says."""
    root, export = exported
    expected = readers(root)
    assert len(expected) == 51 and expected["big"].records > 200_000
    counts = {run: (records, superseded) for run, records, superseded in query(
        export, "SELECT run, count(*), count(*) FILTER (WHERE superseded) FROM records GROUP BY run")}  # fmt: skip
    runs = {row[0]: row[1:] for row in query(export, "SELECT run, records, last_step, min_train_loss FROM runs")}
    effective = dict(query(export, "SELECT run, min(train_loss) FROM records WHERE NOT superseded GROUP BY run"))
    sessions = {(row[0], row[1]): row[2:] for row in query(export, "SELECT run, session_index, count(*), count(*) "
                "FILTER (WHERE superseded), min(train_loss) FROM records GROUP BY ALL")}  # fmt: skip
    session_view = {(row[0], row[1]): row[2:] for row in query(
        export, "SELECT run, session_index, session, first_step, last_step, records, own_records_superseded, "
        "min_train_loss FROM sessions")}  # fmt: skip
    for name, reader in expected.items():
        superseded = sum(int(reader.superseded(event).sum()) for event in reader.events)
        loss = reader.effective("train").get("train_loss", pd.Series(dtype=float)).min()
        assert counts[name] == (reader.records, superseded), name
        assert runs[name][:2] == (reader.records, reader.progress().last_step), name
        assert same(runs[name][2], loss) and same(effective[name], loss), name
        train = reader.frame("train")
        for session in reader.sessions:
            own = sum(int(reader.superseded(e)[reader.session_indices(e) == session.index].sum())
                      for e in reader.events)  # fmt: skip
            mine = train[train["session_id"] == session.session_id].get("train_loss", pd.Series(dtype=float)).min()
            records, redone, low = sessions[(name, session.index)]
            assert (records, redone) == (session.records, own) and same(low, mine), (name, session.index)
            assert session_view[(name, session.index)][:5] == (session.session_id, session.first_step,
                                                               session.last_step, session.records, own)  # fmt: skip
            assert same(session_view[(name, session.index)][5], mine)
    assert counts["big"][1] == BIG_FIRST - BIG_RESUME + (BIG_FIRST - BIG_RESUME) // 1000  # train + validation


def test_records_hold_every_field_under_its_own_name(exported: tuple[Path, Path]) -> None:
    """Metric keys are columns of their own type; a key that is a record column gets a trailing _ (and one
    that another run logs in another case, DuckDB's _1); a key whose type differs between events is text."""
    _, export = exported
    rows = query(export, "SELECT event, step, note, flag, Train_Loss_1, run_, status, time FROM records "
                 "WHERE run = 'odd' ORDER BY step")  # fmt: skip
    stamp = datetime(2026, 11, 29, 10, 0, 1, tzinfo=timezone.utc)
    assert rows[0] == ("train", 1, "x", True, 3.0, "mine", None, stamp)
    assert rows[1][:3] == ("eval", 2, "5") and rows[2][6] == "finished"


def test_second_export_writes_nothing_and_an_append_rewrites_one_file(tmp_path: Path) -> None:
    """An unchanged root: no file of the export is touched (inodes and mtimes as they were); one run
    appended to: exactly its file is rewritten (and the manifest), holding the new record."""
    root = tmp_path / "runs"
    for number in range(5):
        small_run(root / f"run{number}" / "metrics.jsonl")
    out = tmp_path / "export"
    assert len(export_root(root, out).written) == 5
    before = snapshot_files(out)
    report = export_root(root, out)
    assert report.written == () and report.unchanged == 5 and snapshot_files(out) == before
    append_records(root / "run3" / "metrics.jsonl", base_record(510, train_loss=0.001))
    assert export_root(root, out).written == ("run3",)
    after = snapshot_files(out)
    assert {name for name in after if after[name] != before.get(name)} == {file_name("run3"), MANIFEST}
    assert query(out, "SELECT count(*), min(train_loss) FROM records WHERE run = 'run3'") == [(51, 0.001)]


def test_a_run_removed_from_the_root_loses_its_file(tmp_path: Path) -> None:
    """A run deleted from the root disappears from the export: its file removed, no row left."""
    root = tmp_path / "runs"
    for number in range(2):
        small_run(root / f"run{number}" / "metrics.jsonl")
    out = tmp_path / "export"
    export_root(root, out)
    (root / "run1" / "metrics.jsonl").unlink()
    assert export_root(root, out).removed == ("run1",)
    assert not (out / file_name("run1")).exists()
    assert query(out, "SELECT DISTINCT run FROM records") == [("run0",)]


def test_the_connection_itself_refuses_writes_and_file_access(exported: tuple[Path, Path], tmp_path: Path) -> None:
    """Past the statement check (straight to the connection), the lockdown still holds: no file is
    written or read, no setting changed, no extension installed."""
    _, export = exported
    connection = connect(export, now=NOW)
    try:
        for statement in (f"COPY (SELECT 1) TO '{tmp_path}/x.csv'", f"COPY records TO '{export}/x.parquet'",
                          "SELECT * FROM read_csv('/etc/passwd')", f"SELECT * FROM read_parquet('{export}/*.parquet')",
                          "SET enable_external_access = true", "RESET lock_configuration", "INSTALL httpfs",
                          f"ATTACH '{tmp_path}/db.duckdb'"):  # fmt: skip
            with pytest.raises(Exception, match=r"Permission|locked|disabled"):
                connection.execute(statement)
        assert connection.execute("SELECT count(*) FROM records").fetchone()[0] > 200_000
    finally:
        connection.close()
    assert list(tmp_path.iterdir()) == [] and sorted(p.name for p in export.iterdir() if p.suffix == ".csv") == []


def test_a_query_past_its_time_is_interrupted(exported: tuple[Path, Path]) -> None:
    """A slow query with a time limit stops with a one-line error instead of running on."""
    _, export = exported
    connection = connect(export, now=NOW)
    try:
        with pytest.raises(QueryError, match=r"stopped after 0\.2 s"):
            run_query(connection, "SELECT count(*) FROM range(100000000000) a, records b", timeout_s=0.2)
    finally:
        connection.close()


def test_the_config_example_query_help_gives_reads_a_sweeps_keys(tmp_path: Path) -> None:
    """``query --help`` says how to read config keys (``config->>'$.path'``), and its example gives
    each run of a sweep once, with its learning rate beside its result."""
    from tests.support.sweeps import PEAK_LRS, SEEDS, write_sweep

    assert "config->>" in help_text() and CONFIG_EXAMPLE in help_text()
    write_sweep(tmp_path / "runs", windows=4)
    export_root(tmp_path / "runs", tmp_path / "export")
    rows = query(tmp_path / "export", CONFIG_EXAMPLE.replace("optim.lr", "peak_lr"))
    assert len(rows) == len(PEAK_LRS) * len(SEEDS) and {float(lr) for _, lr, _ in rows} == set(PEAK_LRS)
