"""Incremental reader of one run's ``metrics.jsonl``, held as columns for the dashboard and notebooks.

``RunReader`` stacks the read layers, each its own module and tested alone:

    run_file.RunFile -> line_follower.LineFollower -> records / arrow_records -> session_accounting.SessionLog
                                                                               -> column_table.Table per event

and keeps a columnar copy of its parse, restored when the file is opened (``reader_cache.ReaderCache``).

Promises
--------
* ``refresh()`` reads only what was appended since the last call and hands out only **new,
  complete** records: bytes after the last ``\\n`` are ``pending_bytes`` until their newline
  arrives (``metrics_core.read.line_follower``).
* A complete line that is not a record (``metrics_core.read.records``) is skipped and counted in
  ``bad_lines``, with the line number and reason of the first few in ``bad_line_samples``; it is
  never fatal.  ``schema_version`` above 1 is read and reported.
* A file that shrank, was replaced or was rewritten before the consumed offset is re-read from
  the start; ``resets`` counts that and ``reset_reasons`` says why.
* Records are held column-wise (``read.column_table``): ~8 bytes per numeric value, strings as
  categories, a field on few rows as what it holds; each numeric field a series (``column``, ``frame``).

Cost: a refresh that finds nothing new is one ``stat``.  After an append, ``frame()`` and
``sessions`` cost O(appended records): each row is converted for pandas once (``row_conversions``),
and supersession (``read.supersession``, O(rows + sessions)) is recomputed only when a session
starts, logs an event first, or an earlier one gains records.  New bytes are parsed line by line,
or by pyarrow for large blocks (a cold load), on worker threads.

Assumed: one writer at a time appends (``MetricsWriter`` enforces it), so the records of a session
are contiguous and an earlier session's records never change once a later session has begun.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.errors import RunNotFoundError
from metrics_core.read.arrow_records import ARROW_MIN_BLOCK, PARSE_DEPTH, Batch, BulkParses
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.column_table import PendingRows, SparseColumn, Table
from metrics_core.read.columns import CategoryTypes, Column, return_memory_to_os
from metrics_core.read.health import IngestHealth
from metrics_core.read.line_follower import LineFollower, Lines, LongLine, Restart
from metrics_core.read.reader_cache import ReaderCache
from metrics_core.read.records import MAX_RECORD_BYTES, BadLine, check_lines
from metrics_core.read.run_file import LocalFile, RunFile, run_file_path
from metrics_core.read.run_summary import FollowedLog, LastValue
from metrics_core.read.session_accounting import AccountedSessions
from metrics_core.read.session_model import LostWork, Progress, Session
from metrics_core.read.supersession import EventRows, Range, redone_by_ranges, rows_by_session
from metrics_core.write.writer import BASE_FIELD_ORDER, METRICS_FILENAME

__all__ = ["IngestHealth", "LostWork", "Progress", "RunReader", "Session"]

FLUSH_ROWS = 4096  # per-line rows kept as dicts before they are columnarised


class RunReader(FollowedLog, AccountedSessions, ReaderCache):
    """Tails one run's ``metrics.jsonl``; see the module docstring for what it promises."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        bulk_threshold: int = ARROW_MIN_BLOCK,
        max_record_bytes: int = MAX_RECORD_BYTES,
        cache: CachePolicy | None = None,
        file: RunFile | None = None,
    ) -> None:
        """``bulk_threshold``: new bytes from which pyarrow parses instead of the per-line loop.
        ``max_record_bytes``: longer lines are bad lines, found by their length, never parsed.
        ``cache``: where and when to keep a columnar copy of the parsed run (``metrics_core.read.column_cache``),
        so that a reader opened later, in this process or another, parses only appended bytes.
        ``file``: where the bytes come from (``metrics_core.read.run_file``; a local file by default)."""
        given, path = Path(path), run_file_path(path)
        if path == given and file is None and not path.exists():  # a run directory may await its file
            raise RunNotFoundError(
                f"{path}: no such run directory or metrics file (expected a directory holding {METRICS_FILENAME})"
            )
        self.path = path
        self.file = file if file is not None else LocalFile(path)
        self.bulk_threshold = bulk_threshold
        self.max_record_bytes = max_record_bytes
        self.cache = cache
        self._cache_saved_at: float | None = None  # clock of the last save or load, None: never
        self._cache_lines = 0  # lines the cache file holds
        self.cache_due = False  # a save is due and the policy leaves it to the owner (``capture_cache``)
        self.served_from_cache = False  # the last (re)open restored the parse from the cache
        self._restored: tuple[int, int] | None = None  # (records, lines) a refresh's open restored
        self._follower = LineFollower(self.file, max_record_bytes=max_record_bytes, on_open=self._load_cache)
        self._clear()

    def _clear(self) -> None:
        super()._clear()
        self._tables: dict[str, Table] = {}
        self._pending = PendingRows()
        self._session_types = CategoryTypes()  # of this log's session ids, which only ever grow
        self._event_types: dict[str, pd.CategoricalDtype] = {}
        self._redone: dict[str, tuple[tuple[int, int, int], np.ndarray, list[Range]]] = {}  # per event, by key
        self._mappings: dict[Table, tuple[Column, np.ndarray]] = {}  # per table: its session codes' sessions

    # -- what the layers below know ------------------------------------------------------------

    @property
    def read_identity(self) -> tuple[int, ...] | None:
        """The file's identity as the last ``refresh()`` found it, before reading (a write after
        that changes it); None before the first."""
        return self._follower.read_identity

    @property
    def read_position(self) -> tuple[int, int]:
        """(bytes read, file size as the current or last ``refresh()`` found it), for another thread
        to show a long refresh: two integers the read sets anyway, read without a lock."""
        return self._follower.offset, self._follower.target

    def close(self) -> None:
        """Save the cache if it is behind, and release the file (the parsed data stays)."""
        cached = self._cache_saved_at is not None or self.cache_due
        if self._follower.opened and cached and self._lines() != self._cache_lines:
            self.save_cache()
        self._follower.close()

    # -- reading -------------------------------------------------------------------------------

    def refresh(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Parse whatever complete lines were appended since the last call; return how many records.
        Never raises for what the file holds: bad lines are counted, not thrown.  ``progress(bytes
        parsed, file size)`` after each block (``line_follower.READ_CHUNK``): a terminal's bar."""
        before, lines = self.records, self._lines()
        parses = BulkParses(self.bulk_threshold, self.max_record_bytes)
        bulk = False
        try:
            for item in self._follower.follow():
                if isinstance(item, Lines) and (parses.queue or item.end >= self.bulk_threshold):
                    parses.add(item)
                    bulk |= self._store(parses, keep=PARSE_DEPTH, progress=progress)
                elif isinstance(item, Lines):  # a few lines (a live append), none queued before them: parsed now
                    self._check_lines(item.data, 0, item.end, item.first_line, item.lines)
                    if progress is not None:
                        progress(item.offset + item.end, self._follower.target)
                elif isinstance(item, LongLine):
                    bulk |= self._store(parses, keep=0, progress=progress)  # the lines before it are counted first
                    self._note_bad([item.bad])
                elif isinstance(item, Restart):
                    self._clear()
                    self._cache_saved_at = None
                    before = lines = 0
            bulk |= self._store(parses, keep=0, progress=progress)
        finally:
            parses.close()
        if self._restored is not None:  # what the cache held is not news, nor worth saving again
            before, lines = self._restored
            self._restored = None
        if bulk:
            return_memory_to_os()
        if self.cache is not None and self._lines() != lines:
            self._maybe_save_cache(self._lines() - lines)
        return self.records - before

    def _lines(self) -> int:
        return self._follower.lines_read

    def _store(self, parses: BulkParses, *, keep: int, progress: Callable[[int, int], None] | None = None) -> bool:
        """Store queued blocks, oldest first, until ``keep`` remain; True if pyarrow parsed any."""
        bulk = False
        while len(parses.queue) > keep:
            block, parts = parses.take()
            line = block.first_line
            for start, stop, batch in parts:
                if batch is None:
                    count = self._check_lines(block.data, start, stop, line)
                else:
                    self._ingest(batch)
                    bulk, count = True, batch.lines
                line += count
            if progress is not None:
                progress(block.offset + block.end, self._follower.target)
        return bulk

    def _check_lines(self, data: bytes, start: int, stop: int, line: int, lines: list[bytes] | None = None) -> int:
        """Parse and store the lines of ``data[start:stop]`` (split into ``lines``, if given), the
        first numbered ``line``; returns how many lines they were."""
        rows, bad, count = check_lines(data[start:stop], line, max_bytes=self.max_record_bytes, lines=lines)
        self._ingest_rows(rows, bad)
        return count

    def _ingest_rows(self, rows: list[dict[str, Any]], bad: list[BadLine]) -> None:
        """Store what the per-line parser found: the rows stay dicts until ``_flush``."""
        if bad:
            self._note_bad(bad)
        if rows:
            self._pending.add(rows, self.schema_versions)
            self.log.add(rows)
            if self._pending.count >= FLUSH_ROWS:
                self._flush()

    def _ingest(self, batch: Batch) -> None:
        """Store one pyarrow batch: counts, sessions, markers, columns."""
        self._note_bad(batch.bad)
        if not batch.count:
            return
        for version, count in batch.schema_versions.items():
            self.schema_versions[version] = self.schema_versions.get(version, 0) + count
        log = self.log
        to_global = np.array([log.session(sid) for sid in batch.session_ids], dtype=np.int32)
        sessions = to_global[batch.session_codes]
        # per session of the block: its first row, its rows, its last row (vectorised: no object per session)
        indices, firsts, counts = np.unique(sessions, return_index=True, return_counts=True)
        lasts = len(sessions) - 1 - np.unique(sessions[::-1], return_index=True)[1]
        starts = zip(
            *(values[firsts].tolist() for values in (batch.steps, batch.times, batch.tokens_seen)), strict=True
        )
        ends = zip(
            *(v[lasts].tolist() for v in (batch.steps, batch.times, batch.tokens_seen, batch.skipped)), strict=True
        )
        for index, count, first, last in zip(indices.tolist(), counts.tolist(), starts, ends, strict=True):
            log.add_run(index, count, first, last)
        unique, first_rows = np.unique(batch.event_codes.astype(np.int64) * len(log) + sessions, return_index=True)
        firsts = (values.tolist() for values in (*np.divmod(unique, len(log)), batch.steps[first_rows]))
        for event, index, step in zip(*firsts, strict=True):  # lists: no numpy scalar per session
            log.note_first_step(batch.event_names[event], index, step)
        for marker in batch.markers:
            log.note_marker(marker)
        log.note_times(batch.event_names[batch.event_codes[-1]], batch.times[-64:].tolist())
        if batch.chunks:
            self._flush()  # rows parsed earlier come first in every table
            for event, (chunks, count) in batch.chunks.items():
                self._tables.setdefault(event, Table()).extend(chunks, count)

    def _flush(self) -> None:
        """Columnarise rows the per-line parser left as dicts (called before any query)."""
        self._pending.flush(self._tables)

    # -- queries -------------------------------------------------------------------------------

    @property
    def events(self) -> list[str]:
        """Event names seen so far."""
        self._flush()
        return list(self._tables)

    def fields(self, event: str) -> list[str]:
        """The fields of ``event`` records that held a value, in order of first appearance."""
        self._flush()
        table = self._tables.get(event)
        return [] if table is None else list(table.columns)

    def column(self, event: str, name: str) -> Column | SparseColumn | None:
        """Field ``name`` of ``event`` as the reader holds it (held on few rows: sparse), or None.

        O(1): the latest values of a field without building the run's frame (``frame()`` is
        O(records)).  Rows are only ever appended, so a view of it stays valid; do not modify it.
        """
        self._flush()
        table = self._tables.get(event)
        return None if table is None else table.columns.get(name)

    def last_number(self, event: str, name: str) -> LastValue | None:
        """The last number logged as ``name`` by an ``event`` record, and its record's step, or None.

        Read from the column's end backwards in doubling blocks: the cost grows with the trailing
        run of missing values, not with the run.  A string or a bool is no number.
        """
        column = self.column(event, name)
        if column is None or column.size == 0 or column.kind not in ("int", "float", "object"):
            return None
        values = column.view() if column.kind != "object" else column.numbers()  # object: rare, O(rows)
        end, block = column.size, 64
        while end > 0:
            chunk = values[max(0, end - block) : end].astype(np.float64, copy=False)
            found = np.flatnonzero(~np.isnan(chunk))
            if len(found):
                row = max(0, end - block) + int(found[-1])
                return LastValue(float(chunk[found[-1]]), int(self.column(event, "step").view()[row]))
            end, block = end - block, block * 2
        return None

    def frame(self, event: str) -> pd.DataFrame:
        """All records of ``event`` in file order, one column per field seen in any of them.

        A new frame per call, costing O(columns + rows appended since the last call): numbers
        are views of the reader's columns, and times, categories and booleans are converted once
        per row and kept (``row_conversions.Derived``).  Rows are never modified once handed out, so an
        earlier frame stays as it was; do not modify a frame in place.
        """
        return pd.DataFrame(self.frame_columns(event), copy=False)

    def frame_columns(self, event: str, *, sparse: bool = False) -> dict[str, Any]:
        """What ``frame(event)`` holds, field by field in its order, without the frame.

        As ``frame`` minus building it (pandas checks every column a frame is given: a caller that
        needs a few of hundreds of keys builds a frame of those).  ``sparse``: a ``SparseColumn``
        as its ``Held`` rows and values, O(1) (``Held.series``); else dense, O(rows) a call.
        """
        self._flush()
        table = self._tables.get(event)
        if table is None:
            return {name: np.empty(0, dtype=object) for name in BASE_FIELD_ORDER}
        data: dict[str, Any] = {}
        for name in BASE_FIELD_ORDER:
            if name == "event":  # zeros from calloc: pages are mapped when read, not per call
                codes = np.zeros(table.size, np.int8)
                dtype = self._event_types.get(event)
                if dtype is None:
                    dtype = self._event_types[event] = pd.CategoricalDtype([event])
                data[name] = pd.Categorical.from_codes(codes, dtype=dtype, validate=False)
            elif name == "time":
                data[name] = table.columns["time"].times()
            elif name == "session_id":
                dtype = self._session_types.of(self.log.session_ids())
                data[name] = pd.Categorical.from_codes(self._global_sessions(table), dtype=dtype, validate=False)
            else:
                data[name] = table.columns[name].series()
        for name, column in table.columns.items():
            if name not in data:
                data[name] = column.series() if isinstance(column, Column) else column.for_frame(sparse=sparse)
        return data

    def effective(self, event: str) -> pd.DataFrame:
        """Records of ``event`` that no later session redid: the run as if it had never crashed."""
        return self.frame(event)[~self.superseded(event)].reset_index(drop=True)

    def superseded(self, event: str) -> np.ndarray:
        """Per row of ``frame(event)``, whether a later session redid that work (``redone_by``)."""
        return self.redone_by(event) >= 0

    def redone_by(self, event: str) -> np.ndarray:
        """Per row of ``frame(event)``, the index in ``sessions`` of the session that redid it, -1
        where none did (``metrics_core.read.supersession``'s rule).  Kept until the rows, sessions
        or thresholds change: O(rows + sessions) then, O(1) after (read-only)."""
        self._flush()
        table = self._tables.get(event)
        if table is None:
            return np.zeros(0, dtype=np.int32)
        key, found = (table.size, len(self.log), self.log.thresholds_version), self._redone.get(event)
        if found is None or found[0] != key:
            sessions, steps = self._global_sessions(table), table.columns["step"].view()
            found = self._redone[event] = (key, *redone_by_ranges(self.log.thresholds(event), sessions, steps))
        return found[1]

    def session_indices(self, event: str) -> np.ndarray:
        """Per row of ``frame(event)``, the index of its session in ``sessions`` (a view: read only)."""
        self._flush()
        table = self._tables.get(event)
        return np.zeros(0, dtype=np.int64) if table is None else self._global_sessions(table)

    def resident_bytes(self) -> int:
        """Bytes held by the parsed columns (the data a dashboard keeps per run)."""
        self._flush()
        return sum(table.nbytes() for table in self._tables.values())

    def _global_sessions(self, table: Table) -> np.ndarray:
        """Per row of ``table``, the index of its session in the log, in the integer type a
        ``Categorical`` of the sessions keeps (O(sessions + new rows): kept per column)."""
        column = table.columns["session_id"]
        kept, mapping = self._mappings.get(table, (None, np.zeros(0, dtype=np.int64)))
        mapping = mapping if kept is column else mapping[:0]  # a column's categories only grow
        if len(mapping) < len(column.categories):
            mapping = np.append(mapping, [self.log.session(sid) for sid in column.categories[len(mapping) :]])
            self._mappings[table] = (column, mapping)
        return column.codes(mapping, len(self.log))

    def _event_rows(self) -> dict[str, Mapping[int, EventRows]]:
        """What ``SessionLog.replayed`` reads of the columns: each event's rows per session."""
        self._flush()
        found = {}
        for event, table in self._tables.items():
            columns, train = table.columns, None
            if event == "train":
                tokens = np.zeros(table.size) if "tokens" not in columns else columns["tokens"].numbers()
                train = (tokens, columns["time"].view(), columns["tokens_seen"].view())
            self.redone_by(event)  # keeps its ranges beside it: the sweep over the sessions is made once
            rows, ranges = (self._global_sessions(table), columns["step"].view(), len(self.log)), self._redone[event][2]
            found[event] = rows_by_session(*rows, thresholds=self.log.thresholds(event), train=train, ranges=ranges)
        return found
