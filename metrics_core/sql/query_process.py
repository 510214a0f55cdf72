"""A query in a process of its own, held to ``ENGINE_BYTES`` of memory: what the dashboard's SQL
box and ``python -m metrics_core query`` run.

DuckDB's ``memory_limit`` bounds what its buffer manager holds (sorts, joins, aggregates), not the
vectors an expression builds: ``SELECT repeat('x', 2000000) a, repeat('y', 2000000) b FROM
range(1000)`` builds one vector of 1,000 rows, 4 GB, whatever the limit says, before a byte of it
can be counted or the query interrupted.  So ``query_export`` runs the statement (``query.connect``
and ``query.run_query``, unchanged) in a child process (``python -m metrics_core.sql.query_process``)
and watches it: the child's resident memory is read every ``WATCH_S``, and past ``ENGINE_BYTES``
the child is killed and the query stopped with a message saying why; past its time limit too.

What passes between them: the request (the statement included: never on a command line, which
every user of the node can read in ``/proc``) as one JSON document on the child's stdin; the
answer as an Arrow IPC stream on its stdout, cut by the child to the asked rows and bytes and sent
in pieces of at most ``PIECE_BYTES`` (one row may be more), so the parent holds no more than it
keeps; the stream's last batch is empty and carries how it ended (``end`` or ``error``) in its
metadata.  The child's stderr is the parent's.  A killed child's spill directory is removed by
the parent (each query spills under a directory of its own).  Importing this module loads neither
DuckDB nor pyarrow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import metrics_core
from metrics_core.errors import MetricsError
from metrics_core.sql.query import QueryResult, connect, export_for_query, run_query, spill_directory
from metrics_core.sql.statement_check import QueryError, check_read_only, one_line

if TYPE_CHECKING:
    import pyarrow as pa

ENGINE_BYTES = 1 << 30  # a query process's resident memory: past it, the query is stopped
# DuckDB's own limit inside it, so that a big sort or join spills well before the bound: the
# process itself, with Python, pyarrow and DuckDB loaded, is ~220 MB.
ENGINE_MEMORY_LIMIT = "640MB"
WATCH_S = 0.01  # how often the child's memory and time are looked at
PIECE_BYTES = 1 << 20  # the most the parent reads at once, but for a row longer than that
TIME_GRACE_S = 0.5  # the child stops itself at the time limit; killed if it has not by then
_END = b"metrics_core.end"
_ERROR = b"metrics_core.error"


def query_export(
    export: Path | str,
    sql: str,
    *,
    now: datetime,
    spill: Path | None = None,
    timeout_s: float | None = None,
    started: float | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    on_batch: Callable[[pa.RecordBatch], None] | None = None,
    memory_bytes: int = ENGINE_BYTES,
) -> QueryResult:
    """``sql`` over the export directory ``export`` as ``query.run_query`` runs it on a
    ``query.connect`` connection (the same arguments), in a child process killed when its
    resident memory passes ``memory_bytes`` or its time is up (``QueryError`` saying which)."""
    import pyarrow as pa

    check_read_only(sql)  # refused before a process is started
    started = time.monotonic() if started is None else started
    own_spill = None if spill is None else spill / uuid.uuid4().hex
    request = {
        "export": str(export),
        "sql": sql,
        "now": now.isoformat(),
        "spill": None if own_spill is None else str(own_spill),
        "timeout_s": timeout_s,
        "started": started,  # CLOCK_MONOTONIC: one clock for every process of the machine
        "max_rows": max_rows,
        "max_bytes": max_bytes,
    }
    package_home = str(Path(metrics_core.__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, (package_home, os.environ.get("PYTHONPATH"))))
    child = subprocess.Popen(
        [sys.executable, "-m", "metrics_core.sql.query_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
    )
    deadline = None if timeout_s is None else started + timeout_s + TIME_GRACE_S
    watch = _Watch(child, memory_bytes, deadline)
    kept: list[pa.RecordBatch] = []
    ending: dict[Any, Any] = {}
    batches = _answer(child, request, ending)
    try:
        while True:
            try:  # a failure to read is the child's; one of on_batch (a closed stdout) is the caller's
                batch = next(batches, None)
            except (pa.ArrowException, OSError, EOFError) as exc:
                stopped = watch.why_stopped(timeout_s)  # the watch says why before it kills
                raise QueryError(stopped or f"the query process ended without an answer: {one_line(exc)}") from None
            if batch is None:
                break
            if on_batch is not None:
                on_batch(batch)
            else:
                kept.append(batch)
    finally:
        watch.stop()
        if child.poll() is None:
            child.kill()
        child.wait()
        if own_spill is not None:
            shutil.rmtree(own_spill, ignore_errors=True)  # what a killed child left
    if _ERROR in ending:
        raise QueryError(ending[_ERROR].decode())
    end = json.loads(ending[_END])
    return QueryResult(pa.Table.from_batches(kept, schema=ending["schema"]), end["truncated"], end["over_bytes"])


def _answer(
    child: subprocess.Popen[bytes], request: dict[str, Any], ending: dict[Any, Any]
) -> Iterator[pa.RecordBatch]:
    """Send ``request`` to ``child`` and read its answer, batch by batch; the answer's schema
    (``"schema"``) and how it ended (the last batch's metadata) go into ``ending``."""
    import pyarrow as pa

    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(json.dumps(request).encode())
    child.stdin.close()
    reader = pa.ipc.open_stream(child.stdout)
    ending["schema"] = reader.schema
    while True:
        try:
            batch, metadata = reader.read_next_batch_with_custom_metadata()
        except StopIteration:  # the stream ended without its last batch: the child died between two
            raise EOFError("the answer ended before its end") from None
        if metadata:
            ending.update(dict(metadata))
            return
        yield batch


def query_root(
    root: Path | str,
    sql: str,
    *,
    cache_home: Path,
    now: datetime,
    timeout_s: float | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
) -> QueryResult:
    """``sql`` over the runs ``root``: refused before any work unless it only reads, then over the
    root's export in ``cache_home``, brought up to date first (``query.export_for_query``), in a
    process of its own (``query_export``) spilling in ``cache_home`` (``query.spill_directory``).
    ``timeout_s`` covers all of it (past the limit, one run being exported ends first): an export
    that runs out of time keeps what it did, and the next query goes on from there."""
    started = time.monotonic()
    check_read_only(sql)
    deadline = None if timeout_s is None else started + timeout_s
    export, report = export_for_query(root, cache_home, deadline=deadline)
    if report.left:
        raise QueryError(
            f"stopped after {timeout_s:g} s: bringing the runs' export up to date took too long "
            f"({report.left:,} run(s) left); run the query again to go on from there"
        )
    limits = {"timeout_s": timeout_s, "started": started, "max_rows": max_rows, "max_bytes": max_bytes}
    return query_export(export, sql, now=now, spill=spill_directory(cache_home), **limits)


class _Watch:
    """A thread that kills ``child`` when its resident memory passes ``memory_bytes`` or the
    monotonic clock passes ``deadline``, and remembers which."""

    def __init__(self, child: subprocess.Popen[bytes], memory_bytes: int, deadline: float | None) -> None:
        self.child, self.memory_bytes, self.deadline = child, memory_bytes, deadline
        self.reason: str | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="query-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        statm = f"/proc/{self.child.pid}/statm"
        while not self.done.wait(WATCH_S) and self.child.poll() is None:
            try:
                with open(statm, "rb") as file:
                    resident = int(file.read().split()[1]) * page
            except (OSError, IndexError, ValueError):
                resident = 0  # no /proc (not Linux) or the child just ended: the time limit still holds
            if resident > self.memory_bytes:
                self.reason = "memory"
            elif self.deadline is not None and time.monotonic() > self.deadline:
                self.reason = "time"
            else:
                continue
            self.child.kill()
            return

    def why_stopped(self, timeout_s: float | None) -> str | None:
        """Why the child was killed, as the query's error; None if it was not."""
        if self.reason == "memory":
            return (
                f"stopped: the query needed more than {self.memory_bytes >> 20:,} MB of memory; "
                "ask for fewer rows or shorter values"
            )
        if self.reason == "time":
            return f"stopped after {timeout_s:g} s: the query took too long"
        return None

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


# -- the child ---------------------------------------------------------------------------------


def _pieces(batch: pa.RecordBatch, piece_bytes: int) -> list[pa.RecordBatch]:
    """``batch`` in slices of about ``piece_bytes`` each (at least one row)."""
    if batch.nbytes <= piece_bytes or batch.num_rows <= 1:
        return [batch]
    rows = max(1, batch.num_rows * piece_bytes // batch.nbytes)
    return [batch.slice(at, rows) for at in range(0, batch.num_rows, rows)]


def _serve(request: dict[str, Any], out: BinaryIO) -> None:
    """Run ``request`` and write its answer to ``out`` as the module docstring says."""
    import pyarrow as pa

    writer: list[tuple[pa.ipc.RecordBatchStreamWriter, pa.Schema]] = []  # opened with the first batch

    def open_stream(schema: pa.Schema) -> tuple[pa.ipc.RecordBatchStreamWriter, pa.Schema]:
        if not writer:
            writer.append((pa.ipc.new_stream(out, schema), schema))
        return writer[0]

    def send(batch: pa.RecordBatch) -> None:
        stream, _ = open_stream(batch.schema)
        for piece in _pieces(batch, PIECE_BYTES):
            stream.write_batch(piece)

    def finish(schema: pa.Schema, key: bytes, value: str) -> None:
        stream, schema = open_stream(schema)
        stream.write_batch(pa.RecordBatch.from_pylist([], schema=schema), custom_metadata={key: value.encode()})
        stream.close()

    try:
        spill = None if request["spill"] is None else Path(request["spill"])
        connection = connect(
            request["export"],
            now=datetime.fromisoformat(request["now"]),
            spill=spill,
            memory_limit=ENGINE_MEMORY_LIMIT,
        )
        try:
            result = run_query(
                connection,
                request["sql"],
                timeout_s=request["timeout_s"],
                started=request["started"],
                max_rows=request["max_rows"],
                max_bytes=request["max_bytes"],
                on_batch=send,
            )
        finally:
            connection.close()
    except (MetricsError, OSError) as exc:
        finish(pa.schema([]), _ERROR, one_line(exc))
        return
    finish(result.table.schema, _END, json.dumps({"truncated": result.truncated, "over_bytes": result.over_bytes}))


def main() -> None:
    """The child: one request on stdin, its answer on stdout (nothing else may be written there)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print goes to stderr, never into the answer
    with out:
        _serve(json.loads(sys.stdin.buffer.read()), out)


if __name__ == "__main__":
    main()
