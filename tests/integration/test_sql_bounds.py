"""The SQL box is bounded, against real DuckDB, real exports, the CLI as a process and the runs page
run in-process: answers capped in bytes, spills only in the cache directory and capped, a time
limit over the whole request, one query box query at a time per server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from metrics_core.sql.export import export_root
from metrics_core.sql.query import QueryError, connect, run_query, spill_directory
from metrics_core.sql.query_process import ENGINE_BYTES, query_root
from tests.support import REPO, open_page, small_run
from tests.support.reading import NOW

pytest.importorskip("duckdb", reason="duckdb (the sql extra) is not installed")

WIDE = "SELECT repeat('x', 10000) || i AS s FROM range(100000) t(i)"  # ~1 GB of answer
SORTED = "SELECT i, md5(i::VARCHAR) AS m FROM range(3000000) t(i) ORDER BY m"  # ~100 MB to sort
SLOW = "SELECT count(*) FROM range(1000000000000) a"
ATTACK = "SELECT repeat('x', 2000000) a, repeat('y', 2000000) b FROM range(1000)"  # one 4 GB vector
STOPPED = "stopped: the query needed more than 1,024 MB of memory; ask for fewer rows or shorter values"


def exported(tmp_path: Path, runs: int = 1) -> tuple[Path, Path]:
    """A root of ``runs`` small runs and its export."""
    root = tmp_path / "runs"
    for number in range(runs):
        small_run(root / f"run{number:03d}" / "metrics.jsonl")
    export_root(root, tmp_path / "export")
    return root, tmp_path / "export"


def test_an_answer_is_kept_up_to_its_byte_cap_and_says_so(tmp_path: Path) -> None:
    """A 1 GB answer with a 1 MB cap: the first rows that fit, marked as cut by the byte cap."""
    _, export = exported(tmp_path)
    connection = connect(export, now=NOW)
    try:
        result = run_query(connection, WIDE, max_bytes=1 << 20)
    finally:
        connection.close()
    assert result.truncated and result.over_bytes == 1 << 20
    assert 50 < result.table.num_rows < 105 and result.table.nbytes <= 1 << 20


def test_a_wide_answer_costs_the_process_its_cap_not_its_size(tmp_path: Path) -> None:
    """``query_root`` of a 1 GB answer with the query box's 16 MB cap, in a process of its own: its
    peak resident memory stays far below the answer (DuckDB's memory_limit does not bound it)."""
    root = tmp_path / "runs"
    small_run(root / "run" / "metrics.jsonl")
    code = (
        "import resource, sys\nfrom datetime import datetime, timezone\nfrom pathlib import Path\n"
        "from metrics_core.sql.query_process import query_root\n"
        f"result = query_root(sys.argv[1], {WIDE!r}, cache_home=Path(sys.argv[2]), now=datetime.now(timezone.utc), "
        "max_bytes=16 << 20)\n"
        # VmHWM, not ru_maxrss: Linux carries the parent's peak across the vfork + exec of subprocess
        "peak = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "print(result.table.num_rows, result.over_bytes, peak >> 10)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(root), str(tmp_path / "cache")], capture_output=True,
                          text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows, cap, peak_mb = map(int, done.stdout.split())
    assert cap == 16 << 20 and 1000 < rows < 1700 and peak_mb < 600, done.stdout


def test_a_statement_past_the_engine_bound_is_stopped_and_the_server_stays_small(tmp_path: Path) -> None:
    """Two 2 MB values a row over 1,000 rows, one 4 GB vector that DuckDB's memory_limit does not
    bound: ``query_root`` (the SQL box's call, in a process of its own standing for the server) and
    the command line stop it with the message; the server's peak stays far below the engine bound,
    the query process's near it, and the killed query leaves no spill directory behind."""
    root = tmp_path / "runs"
    small_run(root / "run" / "metrics.jsonl")
    cache = tmp_path / "cache"
    code = (
        "import resource, sys\nfrom datetime import datetime, timezone\nfrom pathlib import Path\n"
        "from metrics_core.sql.query import QueryError\nfrom metrics_core.sql.query_process import query_root\n"
        "try:\n"
        f"    query_root(sys.argv[1], {ATTACK!r}, cache_home=Path(sys.argv[2]), now=datetime.now(timezone.utc), "
        "max_bytes=16 << 20)\n"
        "except QueryError as exc:\n    print(exc)\n"
        "peak = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "print(peak >> 10, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(root), str(cache)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    *said, peaks = done.stdout.splitlines()
    server_mb, query_mb = map(int, peaks.split())
    assert said == [STOPPED] and server_mb < 512 and query_mb < 2 * (ENGINE_BYTES >> 20), done.stdout
    assert list(spill_directory(cache).iterdir()) == []
    command = subprocess.run([sys.executable, "-m", "metrics_core", "query", str(root), ATTACK, "--cache-dir",
                              str(cache)], capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert command.returncode == 2 and command.stdout == ""
    assert command.stderr.splitlines()[-1] == f"error: {STOPPED}"


def test_spills_go_to_the_cache_directory_capped_and_never_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sort over the memory limit spills into a directory of its own under ``spill`` while it runs,
    stops at ``max_spill`` with DuckDB's one-line reason, and leaves nothing there once closed;
    without ``spill`` it does not spill at all: no ``.tmp`` in the working directory."""
    _, export = exported(tmp_path)
    work, spill = tmp_path / "work", tmp_path / "cache" / "spill"
    work.mkdir()
    monkeypatch.chdir(work)
    seen: list[Path] = []
    connection = connect(export, now=NOW, memory_limit="32MB", spill=spill, max_spill="16MB")
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            seen.extend(path for path in spill.rglob("*") if path.is_file())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with pytest.raises(QueryError, match="max_temp_directory_size"):
            run_query(connection, SORTED, max_rows=1)
    finally:
        watching.set()
        watcher.join(timeout=30)
        connection.close()
    assert seen and all(path.parent.parent == spill for path in seen)
    assert list(spill.iterdir()) == [] and list(work.iterdir()) == []
    unspilled = connect(export, now=NOW, memory_limit="32MB")
    try:
        with pytest.raises(QueryError, match="Out of Memory"):
            run_query(unspilled, SORTED, max_rows=1)
    finally:
        unspilled.close()
    assert list(work.iterdir()) == []


def test_the_time_limit_covers_bringing_the_export_up_to_date(tmp_path: Path) -> None:
    """A root whose export takes longer than the limit: the query stops at the limit saying so,
    having exported some runs and not all; the next query goes on from there.  The command line's
    ``--timeout`` counts the export too."""
    root = tmp_path / "runs"
    for number in range(100):
        small_run(root / f"run{number:03d}" / "metrics.jsonl")
    cache = tmp_path / "cache"

    def exported_runs() -> int:
        return len(list((cache / "sql").glob("*/*.parquet")))

    for _ in range(2):
        before = exported_runs()
        with pytest.raises(QueryError, match=r"stopped after 0\.01 s: bringing the runs' export up to date"):
            query_root(root, "SELECT count(*) FROM runs", cache_home=cache, now=NOW, timeout_s=0.01)
        assert before < exported_runs() < 100
    done = subprocess.run([sys.executable, "-m", "metrics_core", "query", str(root), "SELECT 1", "--timeout", "0.01",
                           "--cache-dir", str(tmp_path / "other")], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ}, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    said = done.stderr.splitlines()[-1]
    assert said == "error: stopped after 0.01 s: the export took too long; run it again to go on"


def run_box(sql: str) -> object:
    """The runs page with ``sql`` asked in its query box."""
    app = open_page("runs")
    app.text_area(key="sql_text").input(sql)
    next(button for button in app.button if button.label == "Run query").click().run()
    assert not app.exception, app.exception
    return app


def answer_of(app: object, columns: list[str]) -> object:
    """The query box's answer: the page's data grid of these columns."""
    return next(frame.value for frame in app.dataframe if list(frame.value.columns) == columns)


def test_the_query_box_keeps_a_capped_answer_and_says_where_it_was_cut(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 40 MB answer in the query box: the rows within its byte cap, and a caption saying so."""
    from metrics_core.dashboard import sql_box

    monkeypatch.setenv("METRICS_CACHE_DIR", str(tmp_path / "cache"))
    small_run(runs_root / "run" / "metrics.jsonl")
    app = run_box("SELECT repeat('x', 20000) || i AS s FROM range(2000) t(i)")
    frame = answer_of(app, ["s"])
    assert 0 < len(frame) < 2000 and frame["s"].str.len().sum() <= sql_box.SQL_MAX_BYTES
    cut = f"The first {len(frame):,} rows: the whole answer is over {sql_box.SQL_MAX_BYTES >> 20} MB."
    assert cut in [caption.value for caption in app.caption]


def test_the_query_box_runs_one_query_at_a_time_per_server(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one session's query runs, another session's query is told the server is busy (not
    queued); once the first is done, the second goes through."""
    from metrics_core.dashboard import sql_box

    monkeypatch.setenv("METRICS_CACHE_DIR", str(tmp_path / "cache"))
    small_run(runs_root / "run" / "metrics.jsonl")
    run_box("SELECT 1")  # the export made, so that the slow query holds the gate while it runs
    limit = sql_box.SQL_TIMEOUT_S
    monkeypatch.setattr(sql_box, "SQL_TIMEOUT_S", 3.0)  # the slow query's only: a loaded machine starts a query slowly
    first: list[object] = []
    slow = threading.Thread(target=lambda: first.append(run_box(SLOW)), daemon=True)
    slow.start()
    deadline = time.monotonic() + 30
    while not sql_box._one_query().locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    busy = run_box("SELECT 42 AS answer")
    assert [error.value for error in busy.error] == [f"Query failed: {sql_box.BUSY}"]
    slow.join(timeout=60)
    (stopped,) = [error.value for error in first[0].error]  # escaped markdown: "3 s\\: the query…"
    assert stopped.startswith("Query failed: stopped after 3 s") and stopped.endswith("the query took too long")
    monkeypatch.setattr(sql_box, "SQL_TIMEOUT_S", limit)
    after = run_box("SELECT 42 AS answer")
    assert not after.error and answer_of(after, ["answer"]).to_dict("list") == {"answer": [42]}
