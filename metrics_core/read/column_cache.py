"""A columnar cache of parsed runs, so that reopening a big run after a restart parses only new bytes.

Contract
--------
* The cache lives in a directory its owner passes in (the dashboard's own cache directory),
  never in the runs root, which may be read-only.  One file per run file, named by the run
  file's identity (``RunFile.cache_key``: device and inode for a local file): ``<dev>-<ino>.mcc``.
* A cache file holds everything ``RunReader`` knows after a parse up to a line boundary: the
  columns of each event (as Arrow IPC streams, typed as ``metrics_core.read.columns`` holds them), the
  sessions' accumulators, counters, bad-line samples, the byte offset and line count, and the
  fingerprints the reader itself uses to notice a rewrite (the file's first bytes and the first
  bytes of the last line read).
* It is only used when it matches the file: same device and inode, the file at least as long as
  the cached offset, the same first bytes and the same bytes where the last cached line starts,
  the same cache format and the same record limit.  Otherwise it is ignored, and overwritten at
  the next save.  A rewrite that keeps inode, size, first line and the last line read would also
  fool the live reader's own check: the cache promises no more, and no less, than a reader that
  stayed open.  The size at save is not required: a resumed writer legitimately cuts a torn tail
  after the offset.
* Restoring, the reader continues from the cached offset with ``refresh()``, so only appended
  bytes are parsed, and the result equals a cold parse exactly (tests compare full snapshots).
* Writes are atomic (a unique temporary file in the cache directory, then ``os.replace``), so a
  second dashboard process sees the old file or the new one, never half of one; the last writer
  wins and both wrote a valid cache.  Every byte is covered by a CRC-32: a corrupt, truncated or
  foreign file is ignored, never an exception, and so is anything but a regular file at the cache
  path (a FIFO, a device), which is never waited on (``run_file.open_regular``).  A cache directory
  that cannot be written means no cache, not an error.
* Private (``metrics_core.read.private_files``): the directory is made 0700 and each file 0600.
  A cache directory or file that another user owns or can write to is never read nor written
  (it could hold anyone's numbers under a valid checksum): one warning, and runs are read
  without the cache.
* Bounded: a run whose cache would exceed ``max_file_bytes`` is not cached, and after each save
  the oldest files beyond ``max_total_bytes`` are removed.

When the reader saves (``CachePolicy``): after a refresh that parsed at least ``min_records``
records from a cold start (a parse worth skipping next time), then after later refreshes at most
once per ``interval_s`` seconds while the run grows (so a restart replays at most that much of a
live run), and on ``close()`` when anything was parsed since the last save.  With ``save_inline``
off, a refresh only says a save is due, and the reader's owner writes it on a thread of its own
(the dashboard's store: a page's refresh never pays for a save): ``PendingSave`` is what a save
writes, taken in O(columns + sessions) as views of the rows (rows are never changed once written),
so the write runs while the reader keeps reading.

Cost: a save writes about the resident column bytes; a load reads them once, into buffers that
become the columns' rows, and checks the CRC over them (``benchmarks/bench_reader.py`` measures both).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from metrics_core.read.column_table import SparseColumn, Table
from metrics_core.read.columns import Column
from metrics_core.read.line_follower import Position
from metrics_core.read.private_files import directory_refusal, private_directory, refuse, untrusted
from metrics_core.read.records import BadLine
from metrics_core.read.run_file import open_regular
from metrics_core.read.session_accounting import SessionLog

FORMAT = 4  # bump when the record rules (records.py) or the column typing (columns.py) change
_MAGIC = b"MCCACHE1"
_PREFIX = struct.Struct("<8sQQI")  # magic, header bytes, payload bytes, crc32 of header + payload
_NUMERIC = {"int": "int64", "float": "float64", "bool": "int8"}


def default_directory(environ: Mapping[str, str]) -> Path:
    """``$METRICS_CACHE_DIR``, else ``$XDG_CACHE_HOME/metrics_core``, else ``~/.cache/metrics_core``:
    a directory the tools own, never the runs root (which may be read-only or shared)."""
    if environ.get("METRICS_CACHE_DIR"):
        return Path(environ["METRICS_CACHE_DIR"])
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "metrics_core"


@dataclass(frozen=True)
class CachePolicy:
    """Where the cache lives and when a reader writes it (see the module docstring)."""

    directory: Path
    min_records: int = 50_000
    interval_s: float = 300.0
    max_file_bytes: int = 2 << 30
    max_total_bytes: int = 16 << 30
    save_inline: bool = True  # False: a refresh only marks a save due (``RunReader.cache_due``), its owner writes it
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    def path_for(self, key: str) -> Path:
        """The cache file of the run file named ``key`` (``RunFile.cache_key``)."""
        return Path(self.directory) / f"{key}.mcc"


@dataclass(frozen=True, slots=True)
class CachedParse:
    """What a reader knows after parsing a run file up to a line boundary: where it stands, the
    sessions, what it skipped, and the columns of each event."""

    position: Position
    max_record_bytes: int
    log: SessionLog
    bad_lines: int
    bad_line_samples: tuple[BadLine, ...]
    schema_versions: dict[int, int]
    tables: dict[str, Table]


@dataclass(frozen=True, slots=True)
class PendingSave:
    """A save taken from a reader (``RunReader.capture_cache``), to be written by any thread."""

    policy: CachePolicy
    key: str
    parse: CachedParse

    def write(self) -> bool:
        """``save`` it; False (no exception) if it cannot be written."""
        return save(self.policy, self.key, self.parse)


def frozen_tables(tables: Mapping[str, Table]) -> dict[str, Table]:
    """``tables`` as they stand, sharing their rows: O(columns).  The reader may append to the
    originals meanwhile (into the same buffers past these rows, or grown copies), never change a
    row, so what this returns stays as it was."""
    frozen = {}
    for event, table in tables.items():
        copy = frozen[event] = Table()
        copy.size = table.size
        for name, column in table.columns.items():
            if isinstance(column, SparseColumn):
                values = Column.restore(column.kind, column.values(), list(column.categories))
                copy.columns[name] = SparseColumn(column.size, values, column.rows())
            elif column.kind == "null":
                copy.columns[name] = Column("null", column.size)
            else:
                copy.columns[name] = Column.restore(column.kind, column.view(), list(column.categories))
    return frozen


def save(policy: CachePolicy, key: str, parse: CachedParse) -> bool:
    """Write ``parse`` as the cache file of the run file named ``key``; False (and no exception) if
    it cannot."""
    tables = parse.tables
    try:
        batches = {event: _table_batches(table) for event, table in tables.items()}  # views of the rows
        sizes = {event: [_stream_size(batch) for batch in pair] for event, pair in batches.items()}
        payload_size = sum(map(sum, sizes.values()))
        position = parse.position
        header_state = {
            "format": FORMAT,
            "key": key,
            "max_record_bytes": parse.max_record_bytes,
            "offset": position.offset,
            "lines": position.lines,
            "head": position.head.hex(),
            "last_line": [position.last_line[0], position.last_line[1].hex()],
            "bad_lines": parse.bad_lines,
            "bad_line_samples": [[bad.line, bad.reason, bad.excerpt] for bad in parse.bad_line_samples],
            "schema_versions": list(parse.schema_versions.items()),
            "log": parse.log.state(),
        }
        header_state["tables"] = [
            [
                event,
                table.size,
                sizes[event],
                [
                    [name, column.kind, list(column.categories), isinstance(column, SparseColumn)]
                    for name, column in table.columns.items()
                ],
            ]
            for event, table in tables.items()
        ]
        header = json.dumps(header_state).encode()
        if len(header) + payload_size > policy.max_file_bytes:
            return False
        directory = Path(policy.directory)
        refused = directory_refusal(directory)
        if refused is not None:
            refuse(directory, directory, refused)
            return False
        private_directory(directory)
        target = policy.path_for(key)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".mcc")  # 0600, O_EXCL
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(_PREFIX.pack(_MAGIC, len(header), payload_size, 0))  # its CRC once the payload is out
                out.write(header)
                sink = _Checksummed(out, zlib.crc32(header))
                for pair in batches.values():
                    for batch in pair:
                        _write_stream(sink, batch)
                if sink.written != payload_size:
                    raise ValueError("the streams differ from their measured sizes")
                out.seek(0)
                out.write(_PREFIX.pack(_MAGIC, len(header), payload_size, sink.crc))
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        _prune(directory, policy.max_total_bytes, keep=target)
        return True
    except (OSError, ValueError, TypeError):
        return False  # unwritable directory, full disk, a value JSON cannot hold: no cache
    finally:
        _release_streams()


def _release_streams() -> None:
    """Give back what a save's Arrow arrays took (the text of object columns): pyarrow's pool keeps
    freed memory for reuse, and nothing needs it again until the next save, minutes later."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def load(policy: CachePolicy, key: str, *, max_record_bytes: int) -> CachedParse | None:
    """The parse cached for the run file named ``key`` with this record limit, or None: no file, a
    failed read, a corrupt, foreign or older-format file (never the caller's problem).  Whether
    the run file still holds what was parsed is the caller's to check (``LineFollower.matches``
    on the position).  A directory or file that is not this user's alone is refused (module
    docstring): one ``stat`` of the directory, one ``fstat`` of the file."""
    directory = Path(policy.directory)
    refused = directory_refusal(directory)
    if refused is not None:
        refuse(directory, directory, refused)
        return None
    try:
        with open(open_regular(policy.path_for(key)), "rb", buffering=0) as handle:
            refused = untrusted(os.fstat(handle.fileno()))
            if refused is not None:
                refuse(directory, policy.path_for(key), refused)
                return None
            state, streams = _read(handle)
        if state.get("format") != FORMAT or state["key"] != key or state["max_record_bytes"] != max_record_bytes:
            return None
        position = Position(
            int(state["offset"]),
            int(state["lines"]),
            bytes.fromhex(state["head"]),
            (int(state["last_line"][0]), bytes.fromhex(state["last_line"][1])),
        )
        return CachedParse(
            position=position,
            max_record_bytes=max_record_bytes,
            log=SessionLog.restore(state["log"]),
            bad_lines=int(state["bad_lines"]),
            bad_line_samples=tuple(
                BadLine(line, str(reason), str(text)) for line, reason, text in state["bad_line_samples"]
            ),
            schema_versions={int(version): int(count) for version, count in state["schema_versions"]},
            tables=_decode(state, streams),
        )
    except Exception:
        return None


def _read(handle: Any) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The header and each table's stream, read into a buffer of its own, checked against the CRC.

    Each stream's bytes become its columns' rows (``_decode`` takes views, no copy): one copy
    from the page cache in all.  The buffers are numpy's, which asks for huge pages: a read
    into a ``bytes`` of the same size costs several times as much, mostly in page faults.  A table's
    buffer is freed once its columns grew into buffers with room (at the first append to that
    event), so a live run does not keep the cached copy beside the grown one.
    """
    prefix = handle.read(_PREFIX.size)
    magic, header_size, payload_size, crc = _PREFIX.unpack(prefix)
    if magic != _MAGIC or os.fstat(handle.fileno()).st_size != _PREFIX.size + header_size + payload_size:
        raise ValueError("not a complete cache file")
    header = _read_into(handle, bytearray(header_size))
    state = json.loads(header)
    lengths = [length for _, _, pair, _ in state["tables"] for length in pair]
    if sum(lengths) != payload_size or min(lengths, default=0) < 0:
        raise ValueError("cache file tables do not add up to its payload")
    streams = [_read_into(handle, np.empty(length, dtype=np.uint8)) for length in lengths]
    running = zlib.crc32(header)
    for stream in streams:
        running = zlib.crc32(stream, running)
    if running != crc:
        raise ValueError("cache file checksum mismatch")
    return state, streams


def _read_into(handle: Any, buffer: Any) -> Any:
    """Fill ``buffer`` from ``handle`` (an unbuffered file: reads may come back short)."""
    view, filled = memoryview(buffer).cast("B"), 0
    while filled < len(view):
        got = handle.readinto(view[filled:])
        if not got:
            raise ValueError("cache file shorter than its header says")
        filled += got
    return buffer


def _decode(state: dict[str, Any], streams: list[np.ndarray]) -> dict[str, Table]:
    import pyarrow as pa

    tables: dict[str, Table] = {}
    for index, (event, size, _, columns) in enumerate(state["tables"]):
        stream, held = streams[2 * index], streams[2 * index + 1]
        batch, lists = (
            pa.ipc.open_stream(pa.py_buffer(part)).read_next_batch() if len(part) else None for part in (stream, held)
        )
        sparse = sum(bool(column[3]) for column in columns)
        if (batch.num_columns if batch is not None else 0) != len(columns) - sparse or (
            batch is not None and batch.num_rows != size
        ):
            raise ValueError("table does not match its description")
        if (lists.num_columns if lists is not None else 0) != 2 * sparse:
            raise ValueError("table does not match its description")
        table = tables[event] = Table()
        table.size = size
        dense = iter(range(len(columns) - sparse))
        kept = iter(range(sparse))
        for name, kind, categories, is_sparse in columns:
            if is_sparse:
                at = next(kept)
                rows = _rows_in(held, lists.column(2 * at).values.to_numpy(zero_copy_only=True))
                values = _column(kind, lists.column(2 * at + 1).values, categories, len(rows), held)
                if len(rows) and (rows.min() < 0 or rows.max() >= size or (np.diff(rows) <= 0).any()):
                    raise ValueError("sparse rows out of order or range")
                table.columns[name] = SparseColumn(size, values, rows)
            else:
                values = None if batch is None else batch.column(next(dense))
                table.columns[name] = _column(kind, values, categories, size, stream)
    return tables


def _table_batches(table: Table) -> tuple[Any, Any]:
    """The table as two Arrow record batches (None when it holds no such column), each written as one
    IPC stream: its dense columns in order, one row per record; and its sparse columns in order, in
    one row, each as two lists, its rows and its values.  Numeric columns are views of the rows."""
    import pyarrow as pa

    dense = [_arrow(column) for column in table.columns.values() if not isinstance(column, SparseColumn)]
    lists = []
    for column in table.columns.values():
        if isinstance(column, SparseColumn):
            held = Column.restore(column.kind, column.values(), column.categories)
            for values in (pa.array(column.rows()), _arrow(held)):
                lists.append(pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values))
    return _batch(dense), _batch(lists)


def _batch(arrays: list[Any]) -> Any:
    import pyarrow as pa

    return pa.record_batch(arrays, names=[f"c{i}" for i in range(len(arrays))]) if arrays else None


def _write_stream(sink: Any, batch: Any) -> None:
    """``batch`` as an Arrow IPC stream into ``sink``, buffer by buffer (nothing when None): a save
    never holds a serialized copy of the run's columns, only the file's writes."""
    import pyarrow as pa

    if batch is not None:
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)


def _stream_size(batch: Any) -> int:
    """The bytes ``_write_stream`` writes for ``batch``, counted without keeping them."""
    import pyarrow as pa

    counter = pa.MockOutputStream()
    _write_stream(counter, batch)
    return counter.size()


class _Checksummed:
    """A binary file's writes, passed on and counted into a CRC-32 (the cache file's checksum)."""

    def __init__(self, out: Any, crc: int) -> None:
        self.out, self.crc, self.written = out, crc, 0
        self.closed = False  # pyarrow asks before each write; it never closes a Python sink

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.crc = zlib.crc32(view, self.crc)
        self.written += view.nbytes
        return self.out.write(view)


def _arrow(column: Column) -> Any:
    import pyarrow as pa

    if column.kind == "null":
        return pa.nulls(column.size)
    values = column.view()
    if column.kind == "object":
        return pa.array([json.dumps(value) for value in values.tolist()], type=pa.string())
    return pa.array(values)  # int64, float64, int8 (bool, -1 missing) or int32 codes (cat, -1 missing)


def _column(kind: str, values: Any, categories: list[str], size: int, stream: np.ndarray) -> Column:
    if kind == "null":
        return Column("null", size)
    if kind == "object":
        array = np.empty(size, dtype=object)
        array[:] = [json.loads(value) for value in values.to_pylist()]
    else:
        array = _rows_in(stream, values.to_numpy(zero_copy_only=True))  # raises on nulls: never written
        expected = {"cat": "int32", **_NUMERIC}[kind]
        if array.dtype != np.dtype(expected) or len(array) != size:
            raise ValueError("column does not match its description")
        if kind == "cat" and len(array) and (array.max() >= len(categories) or array.min() < -1):
            raise ValueError("category code out of range")
    return Column.restore(kind, array, categories)


def _rows_in(stream: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows`` (pyarrow's read-only view into ``stream``) as a writable view of ``stream`` itself,
    or a copy where pyarrow did not read in place."""
    start = rows.__array_interface__["data"][0] - stream.__array_interface__["data"][0]
    if start >= 0 and start + rows.nbytes <= stream.nbytes and start % rows.itemsize == 0:
        return stream[start : start + rows.nbytes].view(rows.dtype)
    return rows.copy()


def _prune(directory: Path, budget: int, *, keep: Path) -> None:
    """Remove the least recently written cache files beyond ``budget`` bytes (never ``keep``)."""
    entries = []
    for path in directory.glob("*.mcc"):
        with contextlib.suppress(OSError):
            stat = path.stat()
            entries.append((stat.st_mtime_ns, stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= budget:
            break
        if path != keep:
            with contextlib.suppress(OSError):  # another process may have removed it
                path.unlink()
            total -= size
