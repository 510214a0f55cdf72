"""The columnar cold path: large blocks of complete lines parsed by pyarrow into typed columns.

A cold load is parse-bound; pyarrow's JSON reader parses a block of lines many times faster than
a per-line loop.  It is also more lenient than the record rules of ``metrics_core.read.records`` (it
takes ``NaN``, invalid UTF-8, blank lines, two objects on one line, times in other shapes,
integers as doubles): its answer is used only where every check here shows it equals what
``records.check_lines`` gives line by line.  Any other block, or part of one, comes back as
``None`` and is parsed by ``check_lines``, so one file gives one answer whichever path reads it
(``tests/heavy/test_hostile_lines.py`` compares both, line class by line class, and a differential fuzz
test on random files).

``BulkParses`` runs the parses of one refresh on worker threads (pyarrow and numpy release the
GIL) while the reader reads on and stores finished blocks in file order.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from metrics_core.read.columns import Chunk
from metrics_core.read.line_follower import Lines
from metrics_core.read.records import MAX_FIELDS, STRING_FIELDS, TIME_MAX_NS, TIME_MIN_NS, BadLine
from metrics_core.read.session_model import MARKER_EVENTS, MARKER_FIELDS
from metrics_core.write.writer import BASE_FIELD_ORDER

PARSE_THREADS = min(4, os.cpu_count() or 1)  # blocks pyarrow parses at once during a cold load
PARSE_DEPTH = PARSE_THREADS + 1  # blocks read ahead of the one being stored
ARROW_MIN_BLOCK = 1 << 20  # below this the per-line loop is faster than pyarrow's start-up
ARROW_MAX_LINE = 16 << 10  # longer lines go to the exact parser: no real record is this wide


@dataclass(slots=True)
class Batch:
    """What pyarrow parsed: base fields as arrays in file order, values as typed chunks per event."""

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
    """False when no line of ``data[:end]`` can be longer than ``ARROW_MAX_LINE``.

    Every aligned window of ``_NEWLINE_WINDOW`` bytes holding a newline bounds the distance
    between newlines by two windows, ``ARROW_MAX_LINE + 1``.  A ``find`` per window stops at the
    first newline (a few hundred bytes in), where an exact scan touches every byte.
    """
    find = data.find
    return any(
        find(b"\n", start, start + _NEWLINE_WINDOW) < 0
        for start in range(0, end - _NEWLINE_WINDOW + 1, _NEWLINE_WINDOW)
    )


def parse_arrow(data: bytes, start: int, stop: int, max_bytes: int) -> Batch | None:
    """Fast columnar parse of the lines in ``data[start:stop]``, or None when any line needs the exact parser
    (``max_bytes``: the record limit, which the exact parser applies).

    pyarrow's reader is more lenient than the record rules (it takes ``NaN``, invalid UTF-8,
    blank lines, two objects on one line, times in other shapes, integers as doubles): its answer
    is used only when every check below shows it equals what ``metrics_core.read.records`` gives line
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
    reused masks: fresh masks per block cost several times as much, mostly in page faults.
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


def _arrow_batch(data: bytes, start: int, stop: int, max_bytes: int) -> Batch | None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if data.find(b"[", start, stop) >= 0:
        return None  # lists: pyarrow is slow on deep nesting, and keeps no list exactly
    lines = _one_object_per_line(np.frombuffer(data, dtype=np.uint8, count=stop - start, offset=start), max_bytes)
    if lines is None:
        return None
    schema = pa.schema([(name, pa.string() if name in STRING_FIELDS else pa.int64()) for name in BASE_FIELD_ORDER])
    table = pj.read_json(  # on a BulkParses thread: one block, parsed by this thread alone
        pa.BufferReader(pa.py_buffer(data).slice(start, stop - start)),
        read_options=pj.ReadOptions(use_threads=False, block_size=max(stop - start, 1 << 20)),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"),
    )
    if table.num_rows != lines or table.num_columns > MAX_FIELDS:
        return None  # two objects on a line and a blank one, or too many fields: the exact parser decides
    if any(table[name].null_count for name in BASE_FIELD_ORDER):
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
    marker_codes = [code for code, event in enumerate(event_names) if event in MARKER_EVENTS]
    held = [name for name in MARKER_FIELDS if name in table.column_names]  # a dict per marker: no more than read
    markers = table.select(held).take(np.flatnonzero(np.isin(event_codes, marker_codes))).to_pylist()
    version_counts = pc.value_counts(table["schema_version"]).to_pylist()
    return Batch(
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
    accepts, checked on the strings' bytes as a 32-column matrix, a fraction of the regex's cost.
    False sends the column to the regex, which decides exactly.
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


class BulkParses:
    """Blocks of one refresh in file order, each parsed by pyarrow on a worker thread.

    A cold load is parse-bound, and pyarrow's parse, the byte checks before it and the split by
    event after it release the GIL: each block is cut and parsed on its own thread while the
    reader reads the next ones and stores the earlier ones, in order, on its own thread.  Blocks
    for the exact parser wait in line with the rest.  The pool starts with the first bulk block:
    a refresh of a few records starts no thread.
    """

    def __init__(self, bulk_threshold: int, max_bytes: int) -> None:
        self.bulk_threshold, self.max_bytes = bulk_threshold, max_bytes
        self._pool: ThreadPoolExecutor | None = None
        self.queue: deque[tuple[Lines, Future[list[Part]] | None]] = deque()

    def add(self, block: Lines) -> None:
        """Queue a block of complete lines; one large enough goes to pyarrow now."""
        future = None
        if block.end >= self.bulk_threshold:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="metrics-parse")
            future = self._pool.submit(_parse_block, block.data, block.end, self.bulk_threshold, self.max_bytes)
        self.queue.append((block, future))

    def take(self) -> tuple[Lines, list[Part]]:
        """The oldest block and its parts in order: ``(start, stop, batch)``, where a batch of None
        means that ``data[start:stop]`` is for the exact parser."""
        block, future = self.queue.popleft()
        return block, [(0, block.end, None)] if future is None else future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


Part = tuple[int, int, "Batch | None"]


def _parse_block(data: bytes, end: int, bulk_threshold: int, max_bytes: int) -> list[Part]:
    """``data[:end]`` as parts in order: pyarrow's batch, or None where the exact parser must read
    the lines (wide lines, a short run between them, a line pyarrow's answer cannot be trusted on)."""
    return [
        (start, stop, None if wide or stop - start < bulk_threshold else parse_arrow(data, start, stop, max_bytes))
        for start, stop, wide in _segments(data, end)
    ]
