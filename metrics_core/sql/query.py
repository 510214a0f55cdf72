"""SQL over every run: ``python -m metrics_core export|query`` and the runs page's query box.

``query`` runs one read-only statement through DuckDB (the optional ``sql`` extra) over an export
made by ``metrics_core.sql.export``: an export directory as it is (local or in a bucket), or a runs
root (a directory, or a bucket prefix read through ``runs_root.open_root`` as the dashboard reads it),
which is first exported incrementally into a directory of the cache (``column_cache.default_directory``,
never the runs root: ``<cache>/sql/<hash of the root's path or address>``; ``export_for_query``).  The views
(``query_views``) are ``records`` (the Parquet files, one row per record), ``runs`` and
``sessions`` (from the export's manifest; a run's status is decided when the query runs, by
``runs.run_status``, since the clock and the writer's lock move it).

Only reads, held by two independent locks, so a trick that slips past one meets the other:

* the statement is parsed by DuckDB's own parser first, and anything but one ``SELECT`` (or
  ``EXPLAIN`` of one: ``EXPLAIN ANALYZE`` runs what it explains) is refused before any work:
  ``CREATE``, ``COPY … TO``, ``ATTACH``, ``SET``, ``INSTALL``…
* the connection is locked down after the views are made: the records are an Arrow dataset handed
  to DuckDB from Python, so DuckDB itself needs no file access and gets none
  (``enable_external_access=false``: no file read or written, no extension installed or loaded),
  Python objects are not looked up by name, and ``lock_configuration`` keeps every setting as set.
  A connection serves one query and is closed: nothing a query changes in it outlives the query.

Bounded, since a query box on a shared server must not take it down: DuckDB's ``memory_limit``
bounds what its buffer manager holds, and beyond it DuckDB spills into a directory of the cache
(``connect``'s ``spill``, one per connection, capped by ``max_temp_directory_size``; without one
it does not spill), never ``.tmp`` in the working directory; the answer is read ``BATCH_ROWS`` at
a time (DuckDB's vector) and kept up to ``max_bytes`` (``run_query``).  DuckDB builds each vector
of an answer outside that memory limit: a vector of very long values costs their size, 4 GB for
two 2 MB values over 1,000 rows.  So the dashboard and the command line run these functions in a
process of their own, killed past a bound of resident memory (``query_process``, whose
``query_root`` also brings the export up to date under the same time limit).

Importing this module loads neither DuckDB nor pyarrow (the command line imports it on training
nodes for its help); the functions that need them import them.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from metrics_core.errors import RunPathError
from metrics_core.read.private_files import check_directory, private_directory
from metrics_core.sql.query_views import records_view, runs_view, sessions_view
from metrics_core.sql.statement_check import QueryError, check_read_only, load_duckdb, one_line

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from metrics_core.sql.export import ExportReport

BATCH_ROWS = 2048  # DuckDB's vector: an answer is read, and its size checked, this many rows at a time
MAX_SPILL = "4GB"  # what one query may spill into the cache directory (max_temp_directory_size)


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A query's rows (at most the ``max_rows`` and ``max_bytes`` asked for) and whether more were
    left out; ``over_bytes``: the byte cap, when that is what cut the answer."""

    table: pa.Table
    truncated: bool
    over_bytes: int | None = None


# -- the connection ----------------------------------------------------------------------------


def connect(
    export: Path | str,
    *,
    now: datetime,
    threads: int = 2,
    memory_limit: str = "1GB",
    spill: Path | None = None,
    max_spill: str = MAX_SPILL,
) -> duckdb.DuckDBPyConnection:
    """A locked-down DuckDB connection with the views over the export directory ``export``, local
    or a bucket prefix (module docstring).  ``now``: the time the runs' statuses are decided at.

    ``spill``: the directory (of the cache) under which DuckDB may spill what is over
    ``memory_limit``, into a directory of this connection's own (DuckDB removes it on close), at
    most ``max_spill``; None: no spilling (over the limit a query fails).  Never DuckDB's default,
    ``.tmp`` in the working directory."""
    duckdb = load_duckdb()
    from metrics_core.sql.export import Destination

    destination = Destination.of(export)
    manifest = destination.read_manifest()
    if manifest is None:
        raise QueryError(f"{export}: no export there (no usable manifest; `python -m metrics_core export` makes one)")
    entries = manifest["runs"]
    temp_directory = ""
    if spill is not None:
        private_directory(spill, tighten=True)
        temp_directory = str(spill / uuid.uuid4().hex)  # one per connection: two spilling into one collide
    config = {
        "threads": threads,
        "memory_limit": memory_limit,
        "temp_directory": temp_directory,
        "max_temp_directory_size": max_spill,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
    }
    connection = duckdb.connect(":memory:", config=config)
    try:
        connection.register("records", records_view(destination, entries))
        connection.register("runs", runs_view(entries, now))
        connection.register("sessions", sessions_view(entries))
        for setting in (
            "enable_progress_bar = false",  # DuckDB draws it on stdout: a server's log, a command's answer
            "python_enable_replacements = false",
            "enable_external_access = false",
            "lock_configuration = true",
        ):
            connection.execute(f"SET {setting}")
    except BaseException:
        connection.close()
        raise
    return connection


# -- running a query ---------------------------------------------------------------------------


def run_query(
    connection: duckdb.DuckDBPyConnection,
    sql: str,
    *,
    timeout_s: float | None = None,
    started: float | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    on_batch: Callable[[pa.RecordBatch], None] | None = None,
) -> QueryResult:
    """Check ``sql`` (``check_read_only``) and run it on ``connection`` (``connect``).

    ``timeout_s``: the query is interrupted that long after ``started`` (a ``time.monotonic()``;
    default now), its answer's reading included (``QueryError``); ``max_rows``, ``max_bytes``: rows
    and Arrow bytes kept, the rest left unread (``truncated``); ``on_batch``: called with each
    batch as it arrives instead of keeping the rows (the command line streams them).  Any failure
    is a one-line ``QueryError``.
    """
    import pyarrow as pa

    duckdb = load_duckdb()
    check_read_only(sql)
    deadline = None if timeout_s is None else (time.monotonic() if started is None else started) + timeout_s
    timer = None
    if deadline is not None:
        timer = threading.Timer(max(deadline - time.monotonic(), 0.0), connection.interrupt)
        timer.daemon = True
        timer.start()
    kept: list[pa.RecordBatch] = []
    rows, size, truncated, over_bytes = 0, 0, False, None
    try:
        reader = connection.sql(sql).to_arrow_reader(BATCH_ROWS)
        for batch in reader:
            if deadline is not None and time.monotonic() > deadline:
                raise duckdb.InterruptException("out of time while reading the answer")
            if max_rows is not None and rows + batch.num_rows > max_rows:
                batch, truncated = batch.slice(0, max_rows - rows), True
            if max_bytes is not None and size + batch.nbytes > max_bytes:
                batch, truncated, over_bytes = _fitting(batch, max_bytes - size), True, max_bytes
            rows, size = rows + batch.num_rows, size + batch.nbytes
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
        raise QueryError(one_line(exc)) from None
    finally:
        if timer is not None:
            timer.cancel()
    return QueryResult(pa.Table.from_batches(kept, schema=schema), truncated, over_bytes)


def _fitting(batch: pa.RecordBatch, room: int) -> pa.RecordBatch:
    """The longest first rows of ``batch`` within ``room`` bytes (a binary search over slices)."""
    low, high = 0, batch.num_rows  # batch.slice(0, low) fits, batch.slice(0, high + 1) does not
    while low < high:
        middle = (low + high + 1) // 2
        if batch.slice(0, middle).nbytes <= room:
            low = middle
        else:
            high = middle - 1
    return batch.slice(0, low)


def export_for_query(
    root: Path | str,
    cache_home: Path,
    progress: Callable[[int, int], None] | None = None,
    *,
    deadline: float | None = None,
) -> tuple[Path, ExportReport]:
    """Bring the export of the runs ``root`` (a directory or a bucket prefix) in ``cache_home`` up
    to date; its directory and what the export did.  The cache may not lie inside the root
    (nothing is written there), nor be writable by another user (``UntrustedCacheError``: a
    planted export would answer the query); its directories are made 0700
    (``private_files.private_directory``).  ``progress``: as ``export.export_root`` takes it.  ``deadline``
    (a ``time.monotonic()``): runs not reached by then are left for the next export
    (``ExportReport.left``)."""
    from metrics_core.read.column_cache import CachePolicy
    from metrics_core.sql.export import export_root, root_name

    check_cache_outside(root, cache_home)
    key = hashlib.blake2b(root_name(root).encode(), digest_size=8).hexdigest()
    check_directory(cache_home.resolve())
    directory = cache_home.resolve() / "sql" / key
    for managed in (directory.parent, directory):
        private_directory(managed, tighten=True)
    report = export_root(root, directory, cache=CachePolicy(cache_home.resolve()), progress=progress, deadline=deadline)
    return directory, report


def spill_directory(cache_home: Path) -> Path:
    """Where queries over the exports in ``cache_home`` spill (``connect``); ``UntrustedCacheError``
    when another user owns or can write to ``cache_home``."""
    check_directory(cache_home.resolve())
    return cache_home.resolve() / "sql-spill"


def check_cache_outside(root: Path | str, cache_home: Path) -> None:
    """``RunPathError`` when the cache directory lies inside the local runs ``root``."""
    from metrics_core.roots.locations import is_bucket_url

    if not is_bucket_url(root) and cache_home.resolve().is_relative_to(Path(root).resolve()):
        raise RunPathError(f"{cache_home}: the cache directory is inside the runs root {root}: it must live elsewhere")


def is_export(path: Path | str) -> bool:
    """Whether ``path`` is an export directory (it holds the manifest) rather than a runs root; for
    a bucket prefix, one GET of the manifest."""
    from metrics_core.roots.locations import is_bucket_url

    if is_bucket_url(path):
        from metrics_core.sql.export import Destination

        return Destination.of(path).read_manifest() is not None
    from metrics_core.sql.export import MANIFEST

    return (Path(path) / MANIFEST).is_file()
