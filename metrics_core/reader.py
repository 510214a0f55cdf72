"""Incremental reader of one run's ``metrics.jsonl``.

Promises
--------
* ``refresh()`` hands out only **new, complete** records: it remembers the byte offset after the
  last ``\\n`` it consumed and reads only what was appended since.  Bytes after the last ``\\n``
  are never parsed, even when they happen to be valid JSON: they are ``pending_bytes`` until
  their newline arrives (a writer may be mid-line, or was killed there and the next writer will
  cut them).
* A complete line that is not a JSON object with valid base fields is skipped and counted in
  ``bad_lines``, with the line number and reason of the first few in ``bad_line_samples``; it
  is never fatal.  Blank lines are ignored.  ``schema_version`` above 1 is read and reported.
* A file that shrank, was replaced (new inode) or was rewritten before the consumed offset is
  re-read from the start; ``resets`` counts that and ``reset_reasons`` says why.
* Records are held column-wise (``metrics_core.columns``): ~8 bytes per numeric field, strings
  as categories.

Cost: a refresh that finds nothing new is one ``stat``.  After an append, ``frame()`` and
``sessions`` cost O(appended records), not O(run): each row is converted for pandas once
(``columns.Derived``), and a session's replay accounting is recomputed only when a session
starts, logs an event for the first time, or an earlier one gains records.

New bytes are parsed by an exact per-line loop (orjson) for small appends and by pyarrow's JSON
reader for large blocks (a cold load); pyarrow is only given complete lines, and any block it
rejects, or in which any line fails validation, is re-parsed line by line so that every bad line
is found and located exactly.  A cold load reads ``READ_CHUNK`` blocks and parses up to
``PARSE_THREADS`` of them at once on worker threads (pyarrow and numpy release the GIL), storing
them in file order on the calling thread; it holds at most ``PARSE_DEPTH + 1`` blocks and their
tables at a time.

Assumed: one writer at a time appends (``MetricsWriter`` enforces it), so the records of a session
are contiguous and an earlier session's records never change once a later session has begun.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.cache import FORMAT as _CACHE_FORMAT
from metrics_core.cache import CachePolicy
from metrics_core.columns import Chunk, Column, Table, chunk_from_pylist
from metrics_core.digest import int_or_none, rereads, supersede_thresholds
from metrics_core.errors import RunNotFoundError
from metrics_core.records import (
    EXCERPT_BYTES,
    MAX_FIELDS,
    MAX_RECORD_BYTES,
    TIME_MAX_NS,
    TIME_MIN_NS,
    BadLine,
    check_lines,
    excerpt,
)
from metrics_core.writer import BASE_FIELD_ORDER, METRICS_FILENAME, lock_is_held

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_BASE_ORDER = BASE_FIELD_ORDER
_STRING_FIELDS = ("time", "run_id", "session_id", "event")
READ_CHUNK = 8 << 20  # bytes per read: a cold load holds PARSE_DEPTH + 1 of them and their tables
PARSE_THREADS = min(4, os.cpu_count() or 1)  # blocks pyarrow parses at once during a cold load
PARSE_DEPTH = PARSE_THREADS + 1  # blocks read ahead of the one being stored
ARROW_MIN_BLOCK = 1 << 20  # below this the per-line loop is faster than pyarrow's start-up
ARROW_MAX_LINE = 16 << 10  # longer lines go to the exact parser: no real record is this wide
MAX_BAD_LINE_SAMPLES = 20
_FINGERPRINT = 256  # first bytes of a line compared to notice a rewrite (time and session id)
FLUSH_ROWS = 4096  # per-line rows kept as dicts before they are columnarised
_MARKER_EVENTS = ("session_start", "session_end")
_RECENT_TIMES = 64


@dataclass(frozen=True, slots=True)
class Session:
    """One process lifetime writing the run, with what its resume cost.

    ``steps_replayed`` / ``tokens_replayed`` / ``records_superseded`` describe the earlier
    sessions' records this session made obsolete by resuming from an older step (work redone).
    ``downtime_s`` is the wall-clock gap since the previous session's last record.
    """

    session_id: str
    index: int
    first_step: int
    last_step: int
    start_time: datetime
    end_time: datetime
    records: int
    first_tokens_seen: int
    last_tokens_seen: int
    skipped_updates: int
    downtime_s: float | None
    steps_replayed: int
    tokens_replayed: int
    records_superseded: int
    discarded_bytes: int | None
    resumed_from_step: int | None
    end_status: str | None

    @property
    def resume_step(self) -> int:
        """The step this session (re)started at: its first record's step."""
        return self.first_step


@dataclass(frozen=True, slots=True)
class Progress:
    """Where the run stands, in O(1): no replay accounting (``sessions`` has that, at a cost)."""

    sessions: int
    started: datetime | None  # the first session's first record
    last_step: int | None  # of the last session's last record
    tokens_seen: int | None


@dataclass(frozen=True, slots=True)
class IngestHealth:
    """What reading the file ran into: skipped lines, an incomplete tail, versions, restarts."""

    bad_lines: int
    bad_line_samples: tuple[BadLine, ...]
    pending_bytes: int
    schema_versions: dict[int, int]
    resets: int
    reset_reasons: tuple[str, ...]


class _SessionAcc:
    """Running aggregates of one session, updated per ingested batch."""

    __slots__ = (
        "discarded_bytes", "end_ns", "end_status", "first_step", "first_tokens", "last_skipped",
        "last_step", "last_tokens", "records", "resumed_from_step", "session_id", "start_ns",
    )  # fmt: skip

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.records = 0
        self.first_step = self.last_step = 0
        self.first_tokens = self.last_tokens = self.last_skipped = 0
        self.start_ns = self.end_ns = 0
        self.discarded_bytes: int | None = None
        self.resumed_from_step: int | None = None
        self.end_status: str | None = None


@dataclass(slots=True)
class _Batch:
    """What pyarrow parsed: base fields as arrays in file order, values as typed chunks per event.

    (The per-line parser hands over dicts instead, see ``RunReader._ingest_rows``.)
    """

    count: int
    lines: int
    bad: list[BadLine]
    session_codes: np.ndarray  # int32 codes into session_ids
    session_ids: list[str]
    event_codes: np.ndarray  # int32 codes into event_names
    event_names: list[str]
    steps: np.ndarray
    times: np.ndarray  # int64 ns since epoch
    tokens_seen: np.ndarray
    skipped: np.ndarray
    schema_versions: dict[int, int]
    markers: list[dict[str, Any]]  # session_start / session_end records
    chunks: dict[str, tuple[dict[str, Chunk], int]]


def _parse_lines(block: bytes, first_line: int, max_bytes: int) -> tuple[list[dict[str, Any]], list[BadLine], int]:
    """Exact parse of complete lines (``metrics_core.records``): every bad line is found, counted and located."""
    return check_lines(block, first_line, max_bytes=max_bytes)


def _columnarize(rows: list[dict[str, Any]]) -> dict[str, Chunk]:
    """Typed chunks, one per key seen in any of ``rows`` (absent = missing)."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    del keys["event"]
    return {key: chunk_from_pylist([row.get(key) for row in rows]) for key in keys}


# The writer's time format.  pyarrow reads more than this, and where it does, Python may read the
# same text differently (or not at all): only times of this shape are trusted to pyarrow.
_ARROW_TIME = r"^\d{4}-\d{2}-\d{2}T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)$"


def _segments(data: bytes, end: int) -> Iterator[tuple[int, int, bool]]:
    """``data[:end]`` cut into runs of lines, as ``(start, stop, wide)``: ``wide`` when the run's
    lines exceed ``ARROW_MAX_LINE``.

    Wide lines (a hostile line, a record of thousands of fields) go to the exact parser alone, so
    that pyarrow never builds thousands of columns for a whole block, and the rest of the block
    keeps its fast path.  Ranges, not slices: a block is not copied to be parsed.
    """
    if not _may_hold_wide_lines(data, end):
        yield 0, end, False
        return
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8, count=end) == 10)
    wide = np.diff(ends, prepend=-1) > ARROW_MAX_LINE + 1
    if not wide.any():
        yield 0, end, False
        return
    starts = np.concatenate(([0], ends[:-1] + 1))
    changes = np.flatnonzero(np.diff(wide.astype(np.int8))) + 1
    for first, last in zip(np.concatenate(([0], changes)), np.concatenate((changes, [len(ends)])), strict=True):
        yield int(starts[first]), int(ends[last - 1]) + 1, bool(wide[first])


_NEWLINE_WINDOW = (ARROW_MAX_LINE + 1) // 2


def _may_hold_wide_lines(data: bytes, end: int) -> bool:
    """False when no line of ``data[:end]`` can be longer than ``ARROW_MAX_LINE``: ~1 ms per 32 MB.

    Every aligned window of ``_NEWLINE_WINDOW`` bytes holding a newline bounds the distance
    between newlines by two windows, ``ARROW_MAX_LINE + 1``.  A ``find`` per window stops at the
    first newline (a few hundred bytes in), where an exact scan touches every byte (~10 ms).
    """
    find = data.find
    return any(find(b"\n", start, start + _NEWLINE_WINDOW) < 0
               for start in range(0, end - _NEWLINE_WINDOW + 1, _NEWLINE_WINDOW))  # fmt: skip


def _parse_arrow(data: bytes, start: int, stop: int, max_bytes: int) -> _Batch | None:
    """Fast columnar parse of the lines in ``data[start:stop]``, or None when any line needs the exact parser
    (``max_bytes``: the record limit, which the exact parser applies).

    pyarrow's reader is more lenient than the record rules (it takes ``NaN``, invalid UTF-8,
    blank lines, two objects on one line, times in other shapes, integers as doubles): its answer
    is used only when every check below shows it equals what ``metrics_core.records`` gives line
    by line; otherwise the block is parsed exactly, so one file gives one answer whichever path
    reads it.
    """
    import pyarrow as pa

    try:
        return _arrow_batch(data, start, stop, max_bytes)
    except (pa.ArrowException, ValueError, OverflowError, UnicodeDecodeError):
        return None


_SCAN_BYTES = 256 << 10  # bytes compared at a time: the masks stay in cache and are reused


def _one_object_per_line(view: np.ndarray, max_bytes: int) -> int | None:
    """The number of lines of ``view`` (bytes ending in ``\\n``) when every line starts with ``{``,
    holds no other ``{`` and is at most ``max_bytes`` long; else None.

    Then pyarrow, which reads any number of objects per line and skips blank lines, returns one
    row per line exactly when its row count equals this count, and no value is a nested object
    (pyarrow takes seconds over one deeply nested line, and crashes on deeper ones; orjson
    refuses them at once).  One pass finds every newline and brace: they must alternate, each
    brace right after the previous newline.  It compares ``_SCAN_BYTES`` at a time into two
    reused masks: fresh 8 MB masks per block cost ~6x as much, mostly in page faults.
    """
    newlines = np.empty(min(_SCAN_BYTES, len(view)), dtype=bool)
    braces = np.empty_like(newlines)
    found = []
    for start in range(0, len(view), _SCAN_BYTES):
        part = view[start : start + _SCAN_BYTES]
        hits, other = newlines[: len(part)], braces[: len(part)]
        np.equal(part, 10, out=hits)
        np.equal(part, 123, out=other)
        hits |= other
        found.append(np.flatnonzero(hits) + start)
    marks = np.concatenate(found)
    opens, ends = marks[0::2], marks[1::2]
    if not len(ends) or len(opens) != len(ends) or opens[0] != 0:
        return None
    if (view[opens] != 123).any() or (view[ends] != 10).any() or (opens[1:] != ends[:-1] + 1).any():
        return None
    if max_bytes < ARROW_MAX_LINE and (ends - opens).max() > max_bytes:
        return None  # a line over a record limit set below ARROW_MAX_LINE: a bad line, found by length
    return len(ends)


def _arrow_batch(data: bytes, start: int, stop: int, max_bytes: int) -> _Batch | None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if data.find(b"[", start, stop) >= 0:
        return None  # lists: pyarrow is slow on deep nesting, and keeps no list exactly
    lines = _one_object_per_line(np.frombuffer(data, dtype=np.uint8, count=stop - start, offset=start), max_bytes)
    if lines is None:
        return None
    schema = pa.schema([(name, pa.string() if name in _STRING_FIELDS else pa.int64()) for name in _BASE_ORDER])
    table = pj.read_json(  # on a _BulkParses thread: one block, parsed by this thread alone
        pa.BufferReader(pa.py_buffer(data).slice(start, stop - start)),
        read_options=pj.ReadOptions(use_threads=False, block_size=max(stop - start, 1 << 20)),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"),
    )
    if table.num_rows != lines or table.num_columns > MAX_FIELDS:
        return None  # two objects on a line and a blank one, or too many fields: the exact parser decides
    if any(table[name].null_count for name in _BASE_ORDER):
        return None
    accepted = (pa.int64(), pa.float64(), pa.string(), pa.bool_(), pa.null())
    if any(field.type not in accepted for field in table.schema):
        return None  # nested values or unsigned integers: kept exactly by the per-line parser
    for column in table.columns:
        if column.type == pa.string():
            column.validate(full=True)  # invalid UTF-8 raises: orjson refuses such a line
        elif column.type == pa.float64() and pc.any(pc.invert(pc.is_finite(column))).as_py():
            return None  # NaN / Infinity literals, which JSON does not have
    if not _writer_times(table["time"]) and not pc.all(pc.match_substring_regex(table["time"], _ARROW_TIME)).as_py():
        return None
    # Python's ISO parser keeps microseconds (it drops further digits): so does this.
    times = pc.cast(table["time"], pa.timestamp("ns", tz="UTC")).cast(pa.int64()).to_numpy(zero_copy_only=False)
    times = times // 1000 * 1000
    if len(times) and (times.min() < TIME_MIN_NS or times.max() > TIME_MAX_NS):
        return None
    events = table["event"].combine_chunks().dictionary_encode()
    sessions = table["session_id"].combine_chunks().dictionary_encode()
    event_codes = events.indices.to_numpy().astype(np.int32)
    event_names = events.dictionary.to_pylist()
    table = table.set_column(table.schema.get_field_index("time"), "time", pa.array(times))
    chunks: dict[str, tuple[dict[str, Chunk], int]] = {}
    parts = [table.filter(pa.array(event_codes == code)) for code in range(len(event_names))]
    if len(parts) > 1 and _ints_typed_by_another_event(parts, table.schema):
        return None
    for event, part in zip(event_names, parts, strict=True):
        chunks[event] = (
            {
                name: _arrow_chunk(part[name].combine_chunks())
                for name in part.column_names
                if name != "event" and part[name].null_count < part.num_rows
            },
            part.num_rows,
        )
    marker_codes = [code for code, event in enumerate(event_names) if event in _MARKER_EVENTS]
    markers = table.take(np.flatnonzero(np.isin(event_codes, marker_codes))).to_pylist()
    version_counts = pc.value_counts(table["schema_version"]).to_pylist()
    return _Batch(
        count=table.num_rows,
        lines=lines,
        bad=[],
        session_codes=sessions.indices.to_numpy().astype(np.int32),
        session_ids=sessions.dictionary.to_pylist(),
        event_codes=event_codes,
        event_names=event_names,
        steps=table["step"].to_numpy(),
        times=times,
        tokens_seen=table["tokens_seen"].to_numpy(),
        skipped=table["skipped_updates"].to_numpy(),
        schema_versions={item["values"]: item["counts"] for item in version_counts},
        markers=markers,
        chunks=chunks,
    )


def _ints_typed_by_another_event(parts: list[Any], schema: Any) -> bool:
    """True when a float column has values in several events and, in one of them, only integral
    ones: pyarrow types a column per block, the exact parser per event, so those may be integer
    literals (``0`` in ``validation`` next to ``0.5`` in ``train``) that the exact parser keeps as
    ints.  Rare (a value name shared by events), and then the exact parser reads the block."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for field in schema:
        if field.type != pa.float64():
            continue
        held = [part[field.name] for part in parts if part[field.name].null_count < part.num_rows]
        if len(held) > 1 and any(pc.all(pc.equal(pc.floor(column), column)).as_py() for column in held):
            return True
    return False


_WRITER_TIME = b"0000-00-00T00:00:00.000000+00:00"  # MetricsWriter's time: digits where the zeros are
_TIME_DIGITS = np.array([i for i, c in enumerate(_WRITER_TIME[:26]) if c == ord("0")])
_TIME_LITERALS = np.array([i for i, c in enumerate(_WRITER_TIME) if i not in _TIME_DIGITS])
_TIME_LITERAL_BYTES = np.frombuffer(_WRITER_TIME, dtype=np.uint8)[_TIME_LITERALS]


def _writer_times(times: Any) -> bool:
    """True when every time has the writer's exact shape, ``YYYY-MM-DDTHH:MM:SS.ffffff+00:00``,
    with an hour up to 23 and minutes and seconds up to 59: a subset of what ``_ARROW_TIME``
    accepts, checked on the strings' bytes as a 32-column matrix (~0.5 ms per 8 MB block where
    the regex takes ~1.5 ms).  False sends the column to the regex, which decides exactly.
    """
    for chunk in times.chunks:
        if not len(chunk):
            continue
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[chunk.offset : chunk.offset + len(chunk) + 1]
        if (np.diff(offsets) != 32).any():
            return False
        chars = np.frombuffer(chunk.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]].reshape(-1, 32)
        digits = chars[:, _TIME_DIGITS] - np.uint8(ord("0"))  # uint8: anything below "0" wraps above 9
        if (digits > 9).any() or (chars[:, _TIME_LITERALS] != _TIME_LITERAL_BYTES).any():
            return False
        hours, minute_tens, second_tens = digits[:, 8] * 10 + digits[:, 9], digits[:, 10], digits[:, 12]
        if (hours > 23).any() or (minute_tens > 5).any() or (second_tens > 5).any():
            return False
    return True


def _arrow_chunk(array: Any) -> Chunk:
    import pyarrow as pa

    kind = array.type
    if pa.types.is_integer(kind) and array.null_count == 0:
        return Chunk("int", array.to_numpy())
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return Chunk("float", array.cast(pa.float64()).to_numpy(zero_copy_only=False))
    if pa.types.is_boolean(kind):
        values = array.cast(pa.int8()).fill_null(-1)
        return Chunk("bool", values.to_numpy())
    encoded = array.dictionary_encode()
    return Chunk("cat", encoded.indices.fill_null(-1).to_numpy().astype(np.int32), encoded.dictionary.to_pylist())


class _BulkParses:
    """Blocks of one ``refresh`` in file order, each parsed by pyarrow on a worker thread.

    A cold load is parse-bound, and pyarrow's parse, the byte checks before it and the split by
    event after it release the GIL: each block is cut and parsed on its own thread while the
    reader reads the next ones and stores the earlier ones, in order, on its own thread.  Blocks
    for the exact parser wait in line with the rest (it numbers lines, so it needs every earlier
    block stored).  The pool starts with the first bulk block: a refresh of a few records starts
    no thread.
    """

    def __init__(self, bulk_threshold: int, max_bytes: int) -> None:
        self.bulk_threshold, self.max_bytes = bulk_threshold, max_bytes
        self._pool: ThreadPoolExecutor | None = None
        self.queue: deque[tuple[bytes, int, Future[list[tuple[int, int, _Batch | None]]] | None]] = deque()

    def add(self, data: bytes, end: int) -> None:
        """Queue the complete lines of ``data[:end]``; a block large enough goes to pyarrow now."""
        future = None
        if end >= self.bulk_threshold:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="metrics-parse")
            future = self._pool.submit(_parse_block, data, end, self.bulk_threshold, self.max_bytes)
        self.queue.append((data, end, future))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _parse_block(data: bytes, end: int, bulk_threshold: int, max_bytes: int) -> list[tuple[int, int, _Batch | None]]:
    """``data[:end]`` as ``(start, stop, batch)`` in order: pyarrow's batch, or None where the exact
    parser must read the lines (wide lines, a short run between them, a line pyarrow's answer
    cannot be trusted on)."""
    return [
        (start, stop, None if wide or stop - start < bulk_threshold else _parse_arrow(data, start, stop, max_bytes))
        for start, stop, wide in _segments(data, end)
    ]


def file_identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    """What changes when a file is appended to or replaced: inode, size, mtime and ctime (``cp -p``
    over a run keeps size and mtime, but no write keeps ctime)."""
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


class RunReader:
    """Tails one run's ``metrics.jsonl``; see the module docstring for what it promises."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        bulk_threshold: int = ARROW_MIN_BLOCK,
        max_record_bytes: int = MAX_RECORD_BYTES,
        cache: CachePolicy | None = None,
    ) -> None:
        """``bulk_threshold``: new bytes from which pyarrow parses instead of the per-line loop.
        ``max_record_bytes``: longer lines are bad lines, found by their length, never parsed.
        ``cache``: where and when to keep a columnar copy of the parsed run (``metrics_core.cache``),
        so that a reader opened later, in this process or another, parses only appended bytes."""
        self._fd: int | None = None
        self._cache = cache
        self._cache_saved_at: float | None = None  # clock of the last save or load, None: never
        self._cache_lines = 0  # lines the cache file holds
        path = Path(path)
        if path.is_dir():
            path = path / METRICS_FILENAME
        elif not path.exists():
            raise RunNotFoundError(
                f"{path}: no such run directory or metrics file (expected a directory holding {METRICS_FILENAME})"
            )
        self.path = path
        self.bulk_threshold = bulk_threshold
        self.max_record_bytes = max_record_bytes
        self.resets = 0
        self.reset_reasons: list[str] = []
        self._clear()

    def _clear(self) -> None:
        self._offset = 0
        self._lines = 0
        self._stat_key: tuple[int, int, int, int] | None = None
        self._scanned = 0  # bytes after _offset known to hold no newline: never scanned again
        self._pending_head = b""  # their first bytes, to notice when they are cut and rewritten
        self._head = b""  # the file's first bytes, and where the last consumed line starts and its
        self._last_line: tuple[int, bytes] = (0, b"")  # first bytes: a rewrite changes one of them
        self.pending_bytes = 0
        self.records = 0
        self.bad_lines = 0
        self.bad_line_samples: list[BadLine] = []
        self.schema_versions: dict[int, int] = {}
        self.last_event: str | None = None
        self._tables: dict[str, Table] = {}
        self._sessions: list[_SessionAcc] = []
        self._session_index: dict[str, int] = {}
        self._recent_times: deque[int] = deque(maxlen=_RECENT_TIMES)
        self._replay_cache: dict[int, tuple[tuple[int, int], tuple[int, int, int]]] = {}
        self._first_step_in_event: dict[str, dict[int, int]] = {}
        self._pending: dict[str, list[dict[str, Any]]] = {}
        self._pending_rows = 0

    @property
    def read_identity(self) -> tuple[int, int, int, int] | None:
        """``file_identity`` of the file as the last ``refresh()`` found it, before reading (a write
        after that changes it); None before the first."""
        return self._stat_key

    def close(self) -> None:
        """Save the cache if it is behind, and release the file descriptor (the parsed data stays)."""
        cached = self._cache is not None and self._cache_saved_at is not None
        if self._fd is not None and cached and self._lines != self._cache_lines:
            self._save_cache()
        self._release()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self._release()  # no cache write from a finaliser: the interpreter may be shutting down

    # -- reading ---------------------------------------------------------------------------

    def refresh(self) -> int:
        """Parse whatever complete lines were appended since the last call; return how many records.

        Never raises for what the file holds: bad lines are counted, not thrown.
        """
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return 0
        key = file_identity(stat)
        if key == self._stat_key:
            return 0
        if self._fd is not None and self._changed_under_us(stat):
            self._release()
            self._clear()
            self._cache_saved_at = None
        size = stat.st_size  # the file the descriptor reads: _changed_under_us compared inodes
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
            opened = os.fstat(self._fd)
            self._inode, size = opened.st_ino, opened.st_size
            if self._cache is not None and self._load_cache():
                size = max(size, self._offset)  # the cache was checked against this very file
        self._stat_key = key
        before, lines = self.records, self._lines
        if self._scanned and (
            size < self._offset + self._scanned
            or self._read(self._offset, len(self._pending_head)) != self._pending_head
        ):
            self._scanned = 0  # the incomplete tail was cut (a writer resumed): scan it anew
        if self._read_to(size):
            _return_memory_to_os()
        self.pending_bytes = size - self._offset
        if self._cache is not None and self._lines != lines:
            self._maybe_save_cache(self._lines - lines)
        return self.records - before

    # -- columnar cache (metrics_core.cache holds the format and the rules) ------------------

    def _load_cache(self) -> bool:
        from metrics_core import cache

        if not cache.load(self, self._cache):
            return False
        self._cache_saved_at, self._cache_lines = self._cache.clock(), self._lines
        return True

    def _maybe_save_cache(self, parsed_lines: int) -> None:
        """Save after a parse of ``min_records`` lines, else at most every ``interval_s`` once cached."""
        policy = self._cache
        if parsed_lines >= policy.min_records or (
            self._cache_saved_at is not None and policy.clock() - self._cache_saved_at >= policy.interval_s
        ):
            self._save_cache()

    def _save_cache(self) -> None:
        from metrics_core import cache

        if cache.save(self, self._cache):
            self._cache_saved_at, self._cache_lines = self._cache.clock(), self._lines

    def _cache_state(self) -> tuple[dict[str, Any], dict[str, Table]]:
        """Everything a cold parse up to ``_offset`` leaves, as JSON values and the tables."""
        self._flush()
        stat = os.fstat(self._fd)
        position, last = self._last_line
        state = {
            "format": _CACHE_FORMAT,
            "max_record_bytes": self.max_record_bytes,
            "dev": stat.st_dev,
            "ino": stat.st_ino,
            "size": stat.st_size,
            "offset": self._offset,
            "lines": self._lines,
            "head": self._head.hex(),
            "last_line": [position, last.hex()],
            "records": self.records,
            "bad_lines": self.bad_lines,
            "bad_line_samples": [[bad.line, bad.reason, bad.excerpt] for bad in self.bad_line_samples],
            "schema_versions": list(self.schema_versions.items()),
            "last_event": self.last_event,
            "sessions": [[getattr(acc, name) for name in _SessionAcc.__slots__] for acc in self._sessions],
            "first_steps": [[event, list(firsts.items())] for event, firsts in self._first_step_in_event.items()],
            "recent_times": list(self._recent_times),
        }
        return state, self._tables

    def _restore_cache_state(self, state: dict[str, Any], tables: dict[str, Table]) -> None:
        self._offset, self._lines = int(state["offset"]), int(state["lines"])
        self._head = bytes.fromhex(state["head"])
        self._last_line = (int(state["last_line"][0]), bytes.fromhex(state["last_line"][1]))
        self.records, self.bad_lines = int(state["records"]), int(state["bad_lines"])
        self.bad_line_samples = [BadLine(int(line), str(reason), str(text)) for line, reason, text in
                                 state["bad_line_samples"]]  # fmt: skip
        self.schema_versions = {int(version): int(count) for version, count in state["schema_versions"]}
        self.last_event = state["last_event"]
        for values in state["sessions"]:
            acc = _SessionAcc("")
            for name, value in zip(_SessionAcc.__slots__, values, strict=True):
                setattr(acc, name, value)
            self._session_index[acc.session_id] = len(self._sessions)
            self._sessions.append(acc)
        self._first_step_in_event = {
            event: {int(session): int(step) for session, step in firsts} for event, firsts in state["first_steps"]
        }
        self._recent_times.extend(int(value) for value in state["recent_times"])
        self._tables = tables

    def _read(self, position: int, count: int) -> bytes:
        return os.pread(self._fd, count, position)

    def _read_to(self, size: int) -> bool:
        """Consume every complete line before ``size``; True if pyarrow parsed any of them.

        Each byte is scanned for a newline once: bytes of an incomplete line are remembered as
        scanned, and a line longer than ``max_record_bytes`` is skipped by its length alone.
        """
        chunk = max(READ_CHUNK, self.max_record_bytes + 1)  # holds any line short enough to parse
        parses = _BulkParses(self.bulk_threshold, self.max_record_bytes)
        bulk = False
        try:
            while self._offset + self._scanned < size:
                # A short incomplete line (the tail of the last block) is read again with the
                # next block, not scanned again; a long one is skipped over, then re-read whole.
                resume = rereads(self._scanned, chunk)
                start = self._offset if resume else self._offset + self._scanned
                data = self._read(start, min(chunk, size - start))
                if not data:
                    break  # the file shrank under us: the next refresh notices
                first = data.find(b"\n", self._scanned if resume else 0)
                if first < 0:
                    self._scanned = start + len(data) - self._offset
                    self._pending_head = self._read(self._offset, EXCERPT_BYTES)
                    continue
                if not resume:  # the line that began at _offset ends at start + first
                    if self._scanned + first > self.max_record_bytes:
                        bulk |= self._store(parses, keep=0)  # the lines before it are numbered first
                        self._skip_long_line(self._scanned + first)
                    self._scanned = 0  # a short line is re-read whole from its start, next turn
                    continue
                cut = data.rfind(b"\n") + 1
                self._ingest_block(data, cut, parses)
                if start == 0:
                    self._head = data[: min(first + 1, _FINGERPRINT)]
                last = data.rfind(b"\n", 0, cut - 1) + 1
                self._last_line = (start + last, data[last : min(cut, last + _FINGERPRINT)])
                self._offset = start + cut
                self._scanned = len(data) - cut
                if self._scanned:
                    self._pending_head = data[cut : cut + EXCERPT_BYTES]
                bulk |= self._store(parses, keep=PARSE_DEPTH)
            bulk |= self._store(parses, keep=0)
        finally:
            parses.close()
        return bulk

    def _store(self, parses: _BulkParses, *, keep: int) -> bool:
        """Store queued blocks, oldest first, until ``keep`` remain; True if pyarrow parsed any."""
        bulk = False
        while len(parses.queue) > keep:
            data, end, future = parses.queue.popleft()
            for start, stop, batch in [(0, end, None)] if future is None else future.result():
                if batch is None:
                    self._ingest_rows(*_parse_lines(data[start:stop], self._lines + 1, self.max_record_bytes))
                else:
                    self._ingest(batch)
                    bulk = True
        return bulk

    def _skip_long_line(self, length: int) -> None:
        """Count the line at ``_offset`` (``length`` bytes, newline excluded) as bad, unparsed."""
        head = self._read(self._offset, _FINGERPRINT)
        if self._offset == 0:
            self._head = head
        self._last_line = (self._offset, head)
        self._lines += 1
        self._note_bad([BadLine(self._lines, f"line of {length:,} bytes is longer than the "
                                             f"{self.max_record_bytes:,}-byte record limit",
                                excerpt(head[: EXCERPT_BYTES + 1]))])  # fmt: skip
        self._offset += length + 1

    def _changed_under_us(self, stat: os.stat_result) -> bool:
        """Record and report a replacement, shrink or rewrite; True if the reader must restart.

        A rewrite in place (``cp`` over the file, truncate and rewrite) keeps the inode and may
        keep the size; it changes the first line or the last line read, which hold the times and
        session id of their records: both are compared, two small reads per change.
        """
        position, last = self._last_line
        if stat.st_ino != self._inode:
            reason = "file was replaced (new inode)"
        elif stat.st_size < self._offset:
            reason = f"file shrank from {self._offset} to {stat.st_size} bytes"
        elif self._read(0, len(self._head)) != self._head or self._read(position, len(last)) != last:
            reason = "file was rewritten before the read offset"
        else:
            return False
        self.resets += 1
        self.reset_reasons.append(reason)
        return True

    def _ingest_block(self, data: bytes, end: int, parses: _BulkParses) -> None:
        """Queue the complete lines of ``data[:end]`` for parsing: by pyarrow where the block is large enough."""
        parses.add(data, end)

    def _ingest_rows(self, rows: list[dict[str, Any]], bad: list[BadLine], lines: int) -> None:
        """Store what the per-line parser found, in one pass of plain Python over the rows.

        Same accounting as ``_ingest`` of a pyarrow batch, without numpy: for a refresh of a few
        records, creating the ~10 small arrays that the vectorised form needs cost more than
        parsing the lines.  The rows themselves stay dicts until ``_flush``.
        """
        self._lines += lines
        self._note_bad(bad)
        if not rows:
            return
        versions, pending, firsts = self.schema_versions, self._pending, self._first_step_in_event
        session_id, acc, index, last = None, None, -1, None
        for row in rows:
            if row["session_id"] != session_id:
                if last is not None:
                    _note_last(acc, last)
                session_id = row["session_id"]
                index = self._session(session_id)
                acc = self._sessions[index]
                if acc.records == 0:
                    acc.first_step, acc.start_ns, acc.first_tokens = row["step"], row["time"], row["tokens_seen"]
            acc.records += 1
            last = row
            event = row["event"]
            version = row["schema_version"]
            versions[version] = versions.get(version, 0) + 1
            per_event = pending.get(event)
            if per_event is None:
                per_event = pending[event] = []
            per_event.append(row)
            by_session = firsts.get(event)
            if by_session is None:
                by_session = firsts[event] = {}
            if index not in by_session:
                by_session[index] = row["step"]
            if event in _MARKER_EVENTS:
                self._note_marker(row)
        _note_last(acc, last)
        self._pending_rows += len(rows)
        if self._pending_rows >= FLUSH_ROWS:
            self._flush()
        self.records += len(rows)
        self.last_event = last["event"]
        self._recent_times.extend([row["time"] for row in rows[-_RECENT_TIMES:]])

    def _ingest(self, batch: _Batch) -> None:
        """Store one parsed batch: counts, sessions, markers, columns."""
        self._lines += batch.lines
        self._note_bad(batch.bad)
        if not batch.count:
            return
        for version, count in batch.schema_versions.items():
            self.schema_versions[version] = self.schema_versions.get(version, 0) + count
        to_global = np.array([self._session(sid) for sid in batch.session_ids], dtype=np.int32)
        sessions = to_global[batch.session_codes]
        self._update_sessions(batch, sessions)
        self._note_first_steps(batch, sessions)
        for marker in batch.markers:
            self._note_marker(marker)
        if batch.chunks:
            self._flush()  # rows parsed earlier come first in every table
            for event, (chunks, count) in batch.chunks.items():
                self._tables.setdefault(event, Table()).extend(chunks, count)
        self.records += batch.count
        self.last_event = batch.event_names[batch.event_codes[-1]]
        self._recent_times.extend(batch.times[-_RECENT_TIMES:].tolist())

    def _note_bad(self, bad: list[BadLine]) -> None:
        self.bad_lines += len(bad)
        room = MAX_BAD_LINE_SAMPLES - len(self.bad_line_samples)
        self.bad_line_samples.extend(bad[: max(room, 0)])

    def _flush(self) -> None:
        """Columnarise rows the per-line parser left as dicts (called before any query)."""
        for event, rows in self._pending.items():
            self._tables.setdefault(event, Table()).extend(_columnarize(rows), len(rows))
        self._pending.clear()
        self._pending_rows = 0

    def _update_sessions(self, batch: _Batch, sessions: np.ndarray) -> None:
        runs = np.flatnonzero(np.diff(sessions)) + 1  # sessions are contiguous: a few runs per block
        for index in dict.fromkeys(sessions[np.concatenate(([0], runs))].tolist()):
            rows = np.flatnonzero(sessions == index)
            first, last = rows[0], rows[-1]
            acc = self._sessions[index]
            if acc.records == 0:
                acc.first_step, acc.start_ns = int(batch.steps[first]), int(batch.times[first])
                acc.first_tokens = int(batch.tokens_seen[first])
            acc.records += len(rows)
            acc.last_step, acc.end_ns = int(batch.steps[last]), int(batch.times[last])
            acc.last_tokens, acc.last_skipped = int(batch.tokens_seen[last]), int(batch.skipped[last])

    def _note_first_steps(self, batch: _Batch, sessions: np.ndarray) -> None:
        """Remember each session's first step per event (decides supersession at the resume step)."""
        pairs = batch.event_codes.astype(np.int64) * len(self._sessions) + sessions
        unique, first_rows = np.unique(pairs, return_index=True)
        for pair, row in zip(unique.tolist(), first_rows.tolist(), strict=True):
            event, session = batch.event_names[pair // len(self._sessions)], pair % len(self._sessions)
            self._first_step_in_event.setdefault(event, {}).setdefault(session, int(batch.steps[row]))

    def _note_marker(self, record: dict[str, Any]) -> None:
        """Keep what session_start / session_end say about their session."""
        acc = self._sessions[self._session_index[record["session_id"]]]
        if record["event"] == "session_end":
            status = record.get("status")
            acc.end_status = status if isinstance(status, str) else None
        elif acc.discarded_bytes is None and acc.resumed_from_step is None:
            acc.discarded_bytes = int_or_none(record.get("discarded_bytes"))
            acc.resumed_from_step = int_or_none(record.get("resumed_from_step"))

    def _session(self, session_id: str) -> int:
        index = self._session_index.get(session_id)
        if index is None:
            index = self._session_index[session_id] = len(self._sessions)
            self._sessions.append(_SessionAcc(session_id))
        return index

    # -- queries ---------------------------------------------------------------------------

    @property
    def events(self) -> list[str]:
        """Event names seen so far."""
        self._flush()
        return list(self._tables)

    @property
    def last_record_time(self) -> datetime | None:
        """Time of the last complete record, or None before any."""
        if not self._recent_times:
            return None
        return _EPOCH + timedelta(microseconds=self._recent_times[-1] // 1000)

    def typical_gap_s(self) -> float | None:
        """Median gap between the last few records (the run's usual logging cadence)."""
        times = np.array(self._recent_times, dtype=np.int64)
        if len(times) < 2:
            return None
        return float(np.median(np.diff(times))) / 1e9

    def ingest_health(self) -> IngestHealth:
        """A snapshot of what reading the file ran into so far."""
        return IngestHealth(
            bad_lines=self.bad_lines,
            bad_line_samples=tuple(self.bad_line_samples),
            pending_bytes=self.pending_bytes,
            schema_versions=dict(self.schema_versions),
            resets=self.resets,
            reset_reasons=tuple(self.reset_reasons),
        )

    @property
    def last_end_status(self) -> str | None:
        """The ``status`` of the last record when it is a ``session_end``, else None."""
        if self.last_event != "session_end" or not self._sessions:
            return None
        return self._sessions[-1].end_status

    def writer_alive(self) -> bool | None:
        """Whether a MetricsWriter currently holds this run's file (None: cannot tell)."""
        return None if self._fd is None else lock_is_held(self._fd)

    def frame(self, event: str) -> pd.DataFrame:
        """All records of ``event`` in file order, one column per field seen in any of them.

        A new frame per call, costing O(columns + rows appended since the last call): numbers
        are views of the reader's columns, and times, categories and booleans are converted once
        per row and kept (``columns.Derived``).  Rows are never modified once handed out, so an
        earlier frame stays as it was; do not modify a frame in place.
        """
        self._flush()
        table = self._tables.get(event)
        if table is None:
            return pd.DataFrame({name: pd.Series(dtype=object) for name in _BASE_ORDER})
        data: dict[str, Any] = {}
        for name in _BASE_ORDER:
            if name == "event":  # zeros from calloc: pages are mapped when read, not per call
                codes = np.zeros(table.size, np.int8)
                data[name] = pd.Categorical.from_codes(codes, categories=[event], validate=False)
            elif name == "time":
                data[name] = table.columns["time"].times()
            elif name == "session_id":
                data[name] = pd.Categorical.from_codes(self._global_sessions(table), categories=self._session_ids(),
                                                       validate=False)  # fmt: skip
            else:
                data[name] = table.columns[name].series()
        for name, column in table.columns.items():
            if name not in data:
                data[name] = column.series()
        return pd.DataFrame(data, copy=False)

    def effective(self, event: str) -> pd.DataFrame:
        """Records of ``event`` that no later session redid: the run as if it had never crashed."""
        return self.frame(event)[~self.superseded(event)].reset_index(drop=True)

    def superseded(self, event: str) -> np.ndarray:
        """Per row of ``frame(event)``, whether a later session redid that work.

        A later session that starts at step S (its first record) supersedes an earlier session's
        records with step > S, and those at exactly S when it logged the same event at S itself.
        A record's step is the update count *after* its work, so a session resuming from the
        checkpoint of step S did not redo the window that ended at S unless it logged it again.
        """
        self._flush()
        table = self._tables.get(event)
        if table is None:
            return np.zeros(0, dtype=bool)
        thresholds = self._thresholds(event)
        later_min = np.minimum.accumulate(thresholds[::-1])[::-1]  # min over sessions >= i
        cutoffs = np.append(later_min[1:], math.inf)  # min over sessions > i
        return table.columns["step"].view() >= cutoffs[self._global_sessions(table)]

    def _session_ids(self) -> list[str]:
        return [acc.session_id for acc in self._sessions]

    def _global_sessions(self, table: Table) -> np.ndarray:
        """Per row of ``table``, the index of its session in ``self._sessions``, in the integer
        type a ``Categorical`` of the sessions keeps (O(sessions + new rows): kept per column)."""
        column = table.columns["session_id"]
        mapping = np.array([self._session_index[sid] for sid in column.categories], dtype=np.int64)
        return column.codes(mapping, len(self._sessions))

    def _thresholds(self, event: str) -> np.ndarray:
        """Per session, the lowest step of ``event`` records it supersedes in earlier sessions."""
        firsts = [acc.first_step for acc in self._sessions]
        return np.array(supersede_thresholds(firsts, self._first_step_in_event.get(event, {})), dtype=np.float64)

    @property
    def sessions(self) -> list[Session]:
        """Sessions in order of first appearance, with downtime and replay accounting.

        O(sessions x events) when no session started and none logged an event for the first
        time since the last call; the replay accounting is recomputed (O(rows)) only then.
        """
        result = []
        previous_end: int | None = None
        earlier = 0  # records of the sessions before this one
        firsts = Counter(index for by_session in self._first_step_in_event.values() for index in by_session)
        for index, acc in enumerate(self._sessions):
            steps, tokens, superseded = self._replay(index, key=(earlier, firsts[index]))
            earlier += acc.records
            result.append(
                Session(
                    session_id=acc.session_id,
                    index=index,
                    first_step=acc.first_step,
                    last_step=acc.last_step,
                    start_time=_EPOCH + timedelta(microseconds=acc.start_ns // 1000),
                    end_time=_EPOCH + timedelta(microseconds=acc.end_ns // 1000),
                    records=acc.records,
                    first_tokens_seen=acc.first_tokens,
                    last_tokens_seen=acc.last_tokens,
                    skipped_updates=acc.last_skipped,
                    downtime_s=None if previous_end is None else (acc.start_ns - previous_end) / 1e9,
                    steps_replayed=steps,
                    tokens_replayed=tokens,
                    records_superseded=superseded,
                    discarded_bytes=acc.discarded_bytes,
                    resumed_from_step=acc.resumed_from_step,
                    end_status=acc.end_status,
                )
            )
            previous_end = acc.end_ns
        return result

    def replaced_by(self, index: int, event: str) -> np.ndarray:
        """Per row of ``frame(event)``, whether session ``index`` is the one that redid it.

        Rows of earlier sessions that were still effective when session ``index`` began and
        that it superseded: together with its own records at the same steps, its replay window.
        """
        self._flush()
        table = self._tables.get(event)
        if table is None or index == 0:
            return np.zeros(0 if table is None else table.size, dtype=bool)
        thresholds = self._thresholds(event)[: index + 1]
        # upper[i]: records of session i at or above it were superseded before session `index` began.
        upper = np.append(np.minimum.accumulate(thresholds[index - 1 : 0 : -1])[::-1], math.inf)
        sessions = self._global_sessions(table)
        steps = table.columns["step"].view()
        earlier = sessions < index
        return earlier & (steps >= thresholds[index]) & (steps < upper[np.minimum(sessions, index - 1)])

    def _replay(self, index: int, *, key: tuple[int, int]) -> tuple[int, int, int]:
        """(steps, tokens, records) of earlier sessions' work that session ``index`` redid.

        Reads the earlier sessions' records and first steps per event, and this session's first
        step and first step per event: it changes only when an earlier session gains records
        or this one logs an event for the first time.  ``key``, (records of earlier sessions,
        events this session logged), tells whether the cached answer still holds.  Once a later
        session exists it is final (one writer at a time), but the key costs nothing to check.
        """
        if index == 0:
            return 0, 0, 0
        cached = self._replay_cache.get(index)
        if cached is not None and cached[0] == key:
            return cached[1]
        self._flush()
        start = self._sessions[index].first_step
        frontier, tokens, superseded = start, 0, 0
        for event, table in self._tables.items():
            mask = self.replaced_by(index, event)
            count = int(mask.sum())
            if not count:
                continue
            steps = table.columns["step"].view()
            superseded += count
            frontier = max(frontier, int(steps[mask].max()))
            if event == "train" and "tokens" in table.columns:
                replayed = np.nansum(table.columns["tokens"].numbers()[mask])
                tokens += int(replayed) if math.isfinite(replayed) else 0  # a garbage count is not work
        result = (frontier - start, tokens, superseded)
        self._replay_cache[index] = (key, result)
        return result

    def column(self, event: str, name: str) -> Column | None:
        """Field ``name`` of ``event`` as the reader holds it, or None.

        O(1): the latest values of a field without building the run's frame (``frame()`` is
        O(records)).  Rows are only ever appended, so a view of it stays valid; do not modify it.
        """
        self._flush()
        table = self._tables.get(event)
        return None if table is None else table.columns.get(name)

    def progress(self) -> Progress:
        """Session count, start, last step and tokens, from the running session accumulators."""
        if not self._sessions:
            return Progress(0, None, None, None)
        first, last = self._sessions[0], self._sessions[-1]
        started = _EPOCH + timedelta(microseconds=first.start_ns // 1000)
        return Progress(len(self._sessions), started, last.last_step, last.last_tokens)

    def resident_bytes(self) -> int:
        """Bytes held by the parsed columns (the data a dashboard keeps per run)."""
        self._flush()
        return sum(table.nbytes() for table in self._tables.values())


def _return_memory_to_os() -> None:
    """Give back the parse buffers of a bulk load: pyarrow's pool and glibc both keep freed
    memory for reuse, which after a cold load of a large run is several times the data kept."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    with contextlib.suppress(AttributeError, OSError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


def _note_last(acc: _SessionAcc, row: dict[str, Any]) -> None:
    acc.last_step, acc.end_ns = row["step"], row["time"]
    acc.last_tokens, acc.last_skipped = row["tokens_seen"], row["skipped_updates"]
