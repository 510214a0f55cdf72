"""SQL over every run: ``python -m metrics_core export|query`` and the runs page's query box.

``query`` runs one read-only statement through DuckDB (the optional ``sql`` extra) over an export
made by ``metrics_core.sql.export``: an export directory as it is (local or in a bucket), or a runs
root (a directory, or a bucket prefix read through ``roots.open_root`` as the dashboard reads it),
which is first exported incrementally into a directory of the cache (``cache.default_directory``,
never the runs root: ``<cache>/sql/<hash of the root's path or address>``).  The views (``VIEWS``) are ``records`` (the
Parquet files, one row per record), ``runs`` and ``sessions`` (from the export's manifest; a run's
status is decided when the query runs, by ``runs.run_status``, since the clock and the writer's
lock move it).

Only reads, held by two independent locks, so a trick that slips past one meets the other:

* the statement is parsed by DuckDB's own parser first, and anything but one ``SELECT`` (or
  ``EXPLAIN``) is refused before any work: ``CREATE``, ``COPY … TO``, ``ATTACH``, ``SET``, ``INSTALL``…
* the connection is locked down after the views are made: the records are an Arrow dataset handed
  to DuckDB from Python, so DuckDB itself needs no file access and gets none
  (``enable_external_access=false``: no file read or written, no extension installed or loaded),
  Python objects are not looked up by name, and ``lock_configuration`` keeps every setting as set.
  A connection serves one query and is closed: nothing a query changes in it outlives the query.

Importing this module loads neither DuckDB nor pyarrow (the command line imports it on training
nodes for its help); the functions that need them import them.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metrics_core.errors import MetricsError, RunPathError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from metrics_core.sql.export import Destination, ExportReport

ALLOWED_STATEMENTS = ("SELECT", "EXPLAIN")
BATCH_ROWS = 65_536

# The views every query sees: name -> (what a row is, {column: meaning}).
VIEWS: dict[str, tuple[str, dict[str, str]]] = {
    "records": (
        "one row per record of every run, replayed ones included",
        {
            "run": "the run's name under the root",
            "session": "its session_id",
            "session_index": "0, 1, …: the session's place in the run",
            "event": "train, validation, session_start…",
            "step": "the record's step",
            "tokens_seen": "tokens trained so far",
            "skipped_updates": "skipped so far",
            "time": "when it was written (UTC)",
            "superseded": "true when a later session redid it (resumed before it)",
            "<key>": 'every other field under its own name: train_loss, lr, val_loss, "sys/gpu_mem_gb"…',
        },
    ),
    "runs": (
        "one row per run",
        {
            "run": "its name",
            "status": "live, stalled, finished, interrupted, failed, crashed, empty (now)",
            "reason": "why it stopped",
            "sessions": "how many",
            "records": "how many",
            "superseded_records": "records a later session redid",
            "last_step": "of its last record",
            "tokens_seen": "of its last record",
            "started": "its first record (UTC)",
            "last_record_time": "its last record (UTC)",
            "min_train_loss": "over records no later session redid",
            "last_train_loss": "of its last train record",
            "min_val_loss": "over records no later session redid",
            "bad_lines": "lines that are no record",
            "file": "its Parquet file",
        },
    ),
    "sessions": (
        "one row per session of every run",
        {
            "run": "its run",
            "session": "its session_id",
            "session_index": "0, 1, …",
            "first_step, last_step": "of its first and last record",
            "records": "it wrote",
            "own_records_superseded": "of its records, those a later session redid",
            "min_train_loss": "over all its train records",
            "start_time, end_time": "its first and last record (UTC)",
            "downtime_s": "since the previous session",
            "steps_replayed, tokens_replayed, records_superseded": "earlier work its resume redid",
            "end_status, end_error": "from its session_end",
            "discarded_bytes, resumed_from_step": "from its session_start",
        },
    ),
}


class QueryError(MetricsError, ValueError):
    """A statement that was refused (it would write or change state) or that failed: why, in one line."""


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A query's rows (at most the ``max_rows`` asked for) and whether more were left out."""

    table: pa.Table
    truncated: bool


def help_text() -> str:
    """The views and their columns, as ``query --help`` lists them."""
    lines = ["views:"]
    for view, (row, columns) in VIEWS.items():
        lines.append(f"  {view}: {row}")
        lines += [f"    {name:<28} {meaning}" for name, meaning in columns.items()]
    return "\n".join(lines)


# -- the statement check -----------------------------------------------------------------------


def check_read_only(sql: str) -> None:
    """Refuse anything but one ``SELECT`` or ``EXPLAIN`` (``QueryError``), by DuckDB's own parser."""
    duckdb = _duckdb()
    parser = duckdb.connect(":memory:")
    try:
        statements = parser.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the query: {_one_line(exc)}") from None
    finally:
        parser.close()
    if len(statements) != 1:
        raise QueryError(f"refused: one statement at a time, got {len(statements)}")
    kind = statements[0].type.name
    if kind not in ALLOWED_STATEMENTS:
        raise QueryError(f"refused: a {kind} statement; only reading queries (SELECT) are allowed")


def _duckdb() -> Any:
    """The ``duckdb`` module, or a ``QueryError`` saying how to install it."""
    try:
        import duckdb
    except ImportError:
        raise QueryError("SQL needs DuckDB: pip install 'metrics-core[sql]'") from None
    return duckdb


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + "…" if len(text) > 300 else text or type(exc).__name__


# -- the connection ----------------------------------------------------------------------------


def connect(
    export: Path | str, *, now: datetime, threads: int = 2, memory_limit: str = "1GB"
) -> duckdb.DuckDBPyConnection:
    """A locked-down DuckDB connection with the views over the export directory ``export``, local
    or a bucket prefix (module docstring).  ``now``: the time the runs' statuses are decided at."""
    duckdb = _duckdb()
    from metrics_core.sql.export import Destination

    destination = Destination.of(export)
    manifest = destination.read_manifest()
    if manifest is None:
        raise QueryError(f"{export}: no export there (no usable manifest; `python -m metrics_core export` makes one)")
    entries = manifest["runs"]
    config = {
        "threads": threads,
        "memory_limit": memory_limit,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
    }
    connection = duckdb.connect(":memory:", config=config)
    try:
        connection.register("records", _records(destination, entries))
        connection.register("runs", _runs(entries, now))
        connection.register("sessions", _sessions(entries))
        for setting in (
            "python_enable_replacements = false",
            "enable_external_access = false",
            "lock_configuration = true",
        ):
            connection.execute(f"SET {setting}")
    except BaseException:
        connection.close()
        raise
    return connection


def _records(export: Destination, entries: Mapping[str, Mapping[str, Any]]) -> Any:
    """The records as one Arrow dataset over every run's file, with the columns of all of them
    (a column a file lacks reads as nulls; types joined by ``export_table.common_type``), read by
    pyarrow from the export's file system (DuckDB's own file access stays off)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from metrics_core.sql.export import read_schema
    from metrics_core.sql.export_table import common_type

    types: dict[str, list[pa.DataType]] = {}
    for entry in entries.values():
        for column in read_schema(entry):
            types.setdefault(column.name, []).append(column.type)
    if not types:
        from metrics_core.sql.export_table import RECORD_COLUMNS

        return pa.table({name: pa.array([], pa.string()) for name in RECORD_COLUMNS})
    schema = pa.schema([(name, common_type(kinds)) for name, kinds in types.items()])
    files = [export.path(entry["file"]) for entry in entries.values()]
    return ds.dataset(files, schema=schema, format="parquet", filesystem=export.filesystem)


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _runs(entries: Mapping[str, Mapping[str, Any]], now: datetime) -> pa.Table:
    import pyarrow as pa

    from metrics_core.read.run_status import StatusRecord, run_status, stop_reason

    rows = []
    for name, entry in entries.items():
        facts = dict(entry["status"])
        source = StatusRecord(
            **{
                **facts,
                "path": Path(facts["path"]),
                "identity": tuple(facts["identity"]),
                "last_record_time": _time(facts["last_record_time"]),
            }
        )
        status = run_status(source, now=now)
        rows.append(
            {
                "run": name,
                "status": status,
                "reason": stop_reason(source, status),
                **{
                    key: entry[key] for key in ("sessions", "records", "superseded_records", "last_step", "tokens_seen")
                },
                "started": _time(entry["started"]),
                "last_record_time": source.last_record_time,
                **{
                    key: entry[key]
                    for key in ("min_train_loss", "last_train_loss", "min_val_loss", "bad_lines", "file")
                },
            }
        )
    time = pa.timestamp("us", tz="UTC")
    schema = pa.schema(
        [
            ("run", pa.string()),
            ("status", pa.string()),
            ("reason", pa.string()),
            ("sessions", pa.int64()),
            ("records", pa.int64()),
            ("superseded_records", pa.int64()),
            ("last_step", pa.int64()),
            ("tokens_seen", pa.int64()),
            ("started", time),
            ("last_record_time", time),
            ("min_train_loss", pa.float64()),
            ("last_train_loss", pa.float64()),
            ("min_val_loss", pa.float64()),
            ("bad_lines", pa.int64()),
            ("file", pa.string()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _sessions(entries: Mapping[str, Mapping[str, Any]]) -> pa.Table:
    import pyarrow as pa

    time, whole, text = pa.timestamp("us", tz="UTC"), pa.int64(), pa.string()
    schema = pa.schema(
        [
            ("run", text),
            ("session", text),
            ("session_index", whole),
            ("first_step", whole),
            ("last_step", whole),
            ("records", whole),
            ("own_records_superseded", whole),
            ("min_train_loss", pa.float64()),
            ("start_time", time),
            ("end_time", time),
            ("downtime_s", pa.float64()),
            ("steps_replayed", whole),
            ("tokens_replayed", whole),
            ("tokens_replayed_is_upper_bound", pa.bool_()),
            ("records_superseded", whole),
            ("first_tokens_seen", whole),
            ("last_tokens_seen", whole),
            ("skipped_updates", whole),
            ("discarded_bytes", whole),
            ("resumed_from_step", whole),
            ("end_status", text),
            ("end_error", text),
        ]
    )
    rows = []
    for name, entry in entries.items():
        for row in entry["session_rows"]:
            rows.append(
                {
                    **row,
                    "run": name,
                    "session": row["session_id"],
                    "session_index": row["index"],
                    "start_time": _time(row["start_time"]),
                    "end_time": _time(row["end_time"]),
                }
            )
    return pa.Table.from_pylist(rows, schema=schema)


# -- running a query ---------------------------------------------------------------------------


def run_query(
    connection: duckdb.DuckDBPyConnection,
    sql: str,
    *,
    timeout_s: float | None = None,
    max_rows: int | None = None,
    on_batch: Callable[[pa.RecordBatch], None] | None = None,
) -> QueryResult:
    """Check ``sql`` (``check_read_only``) and run it on ``connection`` (``connect``).

    ``timeout_s``: the query is interrupted then (``QueryError``); ``max_rows``: rows kept, the
    rest left unread (``truncated``); ``on_batch``: called with each batch as it arrives instead of
    keeping the rows (the command line streams them).  Any failure is a one-line ``QueryError``.
    """
    import pyarrow as pa

    duckdb = _duckdb()
    check_read_only(sql)
    timer = None
    if timeout_s is not None:
        timer = threading.Timer(timeout_s, connection.interrupt)
        timer.daemon = True
        timer.start()
    kept: list[pa.RecordBatch] = []
    rows, truncated = 0, False
    try:
        reader = connection.sql(sql).to_arrow_reader(BATCH_ROWS)
        for batch in reader:
            if max_rows is not None and rows + batch.num_rows > max_rows:
                batch, truncated = batch.slice(0, max_rows - rows), True
            rows += batch.num_rows
            if on_batch is not None:
                on_batch(batch)
            else:
                kept.append(batch)
            if truncated:
                break
        schema = reader.schema
    except duckdb.InterruptException:
        raise QueryError(f"stopped after {timeout_s:g} s: the query took too long") from None
    except duckdb.Error as exc:
        raise QueryError(_one_line(exc)) from None
    finally:
        if timer is not None:
            timer.cancel()
    return QueryResult(pa.Table.from_batches(kept, schema=schema), truncated)


def export_for_query(
    root: Path | str, cache_home: Path, progress: Callable[[int, int], None] | None = None
) -> tuple[Path, ExportReport]:
    """Bring the export of the runs ``root`` (a directory or a bucket prefix) in ``cache_home`` up
    to date; its directory and what the export did.  The cache may not lie inside the root
    (nothing is written there).  ``progress``: as ``export.export_root`` takes it."""
    from metrics_core.read.column_cache import CachePolicy
    from metrics_core.sql.export import export_root, root_name

    check_cache_outside(root, cache_home)
    key = hashlib.blake2b(root_name(root).encode(), digest_size=8).hexdigest()
    directory = cache_home.resolve() / "sql" / key
    return directory, export_root(root, directory, cache=CachePolicy(cache_home.resolve()), progress=progress)


def check_cache_outside(root: Path | str, cache_home: Path) -> None:
    """``RunPathError`` when the cache directory lies inside the local runs ``root``."""
    from metrics_core.roots.locations import is_bucket_url

    if not is_bucket_url(root) and cache_home.resolve().is_relative_to(Path(root).resolve()):
        raise RunPathError(f"{cache_home}: the cache directory is inside the runs root {root}: it must live elsewhere")


def query_root(
    root: Path | str,
    sql: str,
    *,
    cache_home: Path,
    now: datetime,
    timeout_s: float | None = None,
    max_rows: int | None = None,
) -> QueryResult:
    """``sql`` over the runs ``root``: refused before any work unless it only reads, then over the
    root's export in ``cache_home``, brought up to date first (``export_for_query``)."""
    check_read_only(sql)
    export, _ = export_for_query(root, cache_home)
    connection = connect(export, now=now)
    try:
        return run_query(connection, sql, timeout_s=timeout_s, max_rows=max_rows)
    finally:
        connection.close()


def is_export(path: Path | str) -> bool:
    """Whether ``path`` is an export directory (it holds the manifest) rather than a runs root; for
    a bucket prefix, one GET of the manifest."""
    from metrics_core.roots.locations import is_bucket_url

    if is_bucket_url(path):
        from metrics_core.sql.export import Destination

        return Destination.of(path).read_manifest() is not None
    from metrics_core.sql.export import MANIFEST

    return (Path(path) / MANIFEST).is_file()
