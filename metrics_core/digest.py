"""A light read of one run for the terminal tools: orjson and the standard library, no numpy or pandas.

Training nodes install ``metrics_core`` alone (README), so ``python -m metrics_core tail|summary``
must work there.  ``RunReader`` needs numpy, pandas and pyarrow; this module reads the same file
with the same record rules (``metrics_core.records.check_record`` decides every line) and the same
session, supersession and replay rules as ``RunReader`` (docs/FORMAT.md), checked against it by
``tests/test_digest.py`` on a realistic resumed run.

What it promises
----------------
* ``LineFollower`` hands out only new, complete records, by byte offset; bytes after the last
  ``\\n`` are never parsed (a writer is mid-line, or was killed there) and are ``pending_bytes``.
  A complete line that is not a record is a ``Skipped`` (never fatal), a line longer than the
  record limit is skipped by its length without being held in memory.  A file that was replaced
  (new inode), shrank below the offset or was rewritten before it (its first line or the last
  line read changed) is read again from the start, and the batch says why.
* ``last_records`` answers ``tail -n N`` by reading backwards from the last ``\\n`` in bounded
  chunks: its cost depends on N and line length, not on the file's size.
* ``RunDigest`` keeps what ``summary`` prints in running per-record state (no record kept as a
  dict): sessions, replay accounting, the run status inputs ``metrics_core.runs.run_status``
  reads (the same attribute names as ``RunReader``), and pandas-free health checks.

Untrusted text: every string read from the file passes through ``clean`` before it is printed,
so a hostile session id cannot move the cursor, recolour the terminal or reorder the line.
"""

from __future__ import annotations

import bisect
import math
import os
import re
import statistics
import unicodedata
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

from metrics_core.errors import RunNotFoundError
from metrics_core.records import EXCERPT_BYTES, MAX_RECORD_BYTES, check_record, excerpt
from metrics_core.writer import METRICS_FILENAME, lock_is_held, tail_start

READ_CHUNK = 4 << 20  # forward reads: bounds memory per batch, holds any line short enough to parse
BACK_CHUNK = 64 << 10  # backward reads for tail -n: a few records of a typical run per read
RATE_CONTEXT_LINES = 10_000  # tail -n: lines read past the last one printed to find a rate's predecessor
_FINGERPRINT = 256  # first bytes of a line compared to notice a rewrite (time and session id)
_REREAD_BYTES = 64 << 10  # an incomplete line up to this long is read again rather than skipped over
_RECENT_TIMES = 64  # as RunReader: the usual gap between records comes from the last few
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# -- untrusted text ------------------------------------------------------------------------

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-byte escapes, and the C1 CSI.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]|\x9b[0-?]*[ -/]*[@-~]")
# Bidi embeddings, overrides and isolates reorder what follows on the line ("Trojan Source").
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def clean(text: str) -> str:
    """``text`` safe to print: escape sequences, control characters and bidi controls removed.

    Line and paragraph separators and tabs go too: one record stays one line whatever it holds.
    """
    if text.isascii() and text.isprintable():
        return text  # the common case, ~100 ns
    text = _ESCAPES.sub("", text)
    return "".join(
        char
        for char in text
        if char not in _BIDI and unicodedata.category(char) not in ("Cc", "Zl", "Zp", "Cs", "Co", "Cn")
    )


def width(text: str) -> int:
    """Terminal columns ``text`` takes: wide (CJK, emoji) characters 2, combining marks 0."""
    if text.isascii():
        return len(text)
    return sum(_char_width(char) for char in text)


def _char_width(char: str) -> int:
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def fit(text: str, columns: int) -> str:
    """``text`` cut to at most ``columns`` terminal columns, ending in "…" when cut."""
    if width(text) <= columns:
        return text
    used, kept = 1, []  # the ellipsis takes one column
    for char in text:
        used += _char_width(char)
        if used > columns:
            break
        kept.append(char)
    return "".join(kept) + "…"


def shorten(text: str, columns: int) -> str:
    """``text`` in at most ``columns`` columns, keeping its start and end around a "…".

    For ids and paths, whose ends tell them apart (``…-pid40001``, ``…/my-run``).
    """
    if width(text) <= columns:
        return text
    tail_columns = (columns - 1) // 2
    tail: list[str] = []
    used = 0
    for char in reversed(text):
        used += _char_width(char)
        if used > tail_columns:
            break
        tail.append(char)
    end = "".join(reversed(tail))
    return fit(text[: len(text) - len(end)], columns - width(end)) + end


# -- lines -----------------------------------------------------------------------------------


def metrics_path(run: str | os.PathLike[str]) -> Path:
    """The ``metrics.jsonl`` of a run directory, or the file itself; RunNotFoundError if neither."""
    path = Path(run)
    if path.is_dir():
        path = path / METRICS_FILENAME
    if not path.is_file():
        raise RunNotFoundError(
            f"{path}: no such run directory or metrics file (expected a directory holding {METRICS_FILENAME})"
        )
    return path


@dataclass(frozen=True, slots=True)
class Skipped:
    """A complete line that is not a record: where (1-based line number when known), why, its first bytes."""

    offset: int
    line: int | None
    reason: str
    excerpt: str

    @property
    def where(self) -> str:
        return f"line {self.line:,}" if self.line is not None else f"byte {self.offset:,}"


@dataclass(frozen=True, slots=True)
class Batch:
    """Records from one read, in file order, the lines skipped, and why the read restarted (if it did)."""

    records: list[dict[str, Any]]
    skipped: list[Skipped]
    reset: str | None = None


def rereads(scanned: int, chunk: int) -> bool:
    """Whether a follower reads an incomplete line of ``scanned`` bytes again, from its start, with
    the next block of ``chunk`` bytes: when it is short (then each byte is read about once, not the
    whole next block twice, once to find the line's end and once from its start); a long one is
    skipped over, never scanned again.  Never more than half a block, so that a read from the
    line's start always reaches past what was scanned."""
    return scanned <= min(_REREAD_BYTES, chunk // 2)


class LineFollower:
    """Complete records appended to one file since the last call; see the module docstring.

    Started at ``offset`` (just after a ``\\n``, or 0); ``line`` is the number of the line there
    when known (1 at offset 0), else None and bad lines are located by byte offset.
    """

    def __init__(
        self, path: Path, *, offset: int = 0, line: int | None = 1, max_record_bytes: int = MAX_RECORD_BYTES
    ) -> None:
        self.path = path
        self.max_record_bytes = max_record_bytes
        self._fd: int | None = None
        self._start(offset, line)

    def _start(self, offset: int, line: int | None) -> None:
        self.close()
        self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        self._inode = os.fstat(self._fd).st_ino
        self.offset, self.line = offset, line
        self.pending_bytes = 0
        self._scanned = 0  # bytes after offset known to hold no newline: not scanned again
        self._pending_head = b""  # their first bytes, to notice a writer cutting and rewriting them
        self._head = os.pread(self._fd, _FINGERPRINT, 0)[:offset] if offset else b""
        self._last_line = (0, b"")  # where the last consumed line starts, and its first bytes
        self._stat_key: tuple[int, ...] | None = None

    @property
    def fd(self) -> int | None:
        """The open descriptor (for the writer-lock probe)."""
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()

    def batches(self) -> Iterator[Batch]:
        """Batches of the complete lines appended since the last call (each from ≤ READ_CHUNK bytes).

        Cost when nothing changed: one ``stat``.
        """
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return  # moved away for a moment (log rotation, a copy in progress): look again later
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        if key == self._stat_key:
            return
        reason = self._changed(stat)
        if reason is not None:
            self._start(0, 1)
            yield Batch([], [], reason)
        self._stat_key = key
        size = os.fstat(self._fd).st_size
        if self._scanned and (
            size < self.offset + self._scanned
            or os.pread(self._fd, len(self._pending_head), self.offset) != self._pending_head
        ):
            self._scanned = 0  # the incomplete tail was cut (a writer resumed): scan it anew
        chunk = max(READ_CHUNK, self.max_record_bytes + 1)
        while self.offset + self._scanned < size:
            resume = rereads(self._scanned, chunk)
            start = self.offset if resume else self.offset + self._scanned
            data = os.pread(self._fd, min(chunk, size - start), start)
            if not data:
                break  # shrank under us: the next call notices
            first = data.find(b"\n", self._scanned if resume else 0)
            if first < 0:
                self._scanned = start + len(data) - self.offset
                self._pending_head = os.pread(self._fd, EXCERPT_BYTES, self.offset)
                continue
            if not resume:  # the line that began at offset ends at start + first
                if self._scanned + first > self.max_record_bytes:
                    yield Batch([], [self._skip_long_line(self._scanned + first)])
                self._scanned = 0  # a short line is re-read whole from its start, next turn
                continue
            cut = data.rfind(b"\n") + 1
            if start == 0:
                self._head = data[: min(first + 1, _FINGERPRINT)]
            last = data.rfind(b"\n", 0, cut - 1) + 1
            self._last_line = (start + last, data[last : min(cut, last + _FINGERPRINT)])
            yield self._parse(data[:cut], start)
            self.offset = start + cut
            self._scanned = len(data) - cut
            if self._scanned:
                self._pending_head = data[cut : cut + EXCERPT_BYTES]
        self.pending_bytes = size - self.offset

    def _parse(self, block: bytes, start: int) -> Batch:
        records, skipped = [], []
        position = start
        for line in block.split(b"\n")[:-1]:
            if line.strip():
                checked = check_record(line, max_bytes=self.max_record_bytes)
                if isinstance(checked, str):
                    skipped.append(Skipped(position, self.line, checked, excerpt(line)))
                else:
                    records.append(checked)
            position += len(line) + 1
            if self.line is not None:
                self.line += 1
        return Batch(records, skipped)

    def _skip_long_line(self, length: int) -> Skipped:
        head = os.pread(self._fd, EXCERPT_BYTES + 1, self.offset)
        reason = f"line of {length:,} bytes is longer than the {self.max_record_bytes:,}-byte record limit"
        skipped = Skipped(self.offset, self.line, reason, excerpt(head))
        self._last_line = (self.offset, head[:_FINGERPRINT])
        self.offset += length + 1
        if self.line is not None:
            self.line += 1
        return skipped

    def _changed(self, stat: os.stat_result) -> str | None:
        """Why the file must be read again from its start (replaced, shrank, rewritten), or None."""
        if stat.st_ino != self._inode:
            return "the file was replaced (new inode)"
        if stat.st_size < self.offset:
            return f"the file shrank from {self.offset:,} to {stat.st_size:,} bytes"
        position, last = self._last_line
        if (self._head and os.pread(self._fd, len(self._head), 0) != self._head) or (
            last and os.pread(self._fd, len(last), position) != last
        ):
            return "the file was rewritten before the read offset"
        return None


@dataclass(frozen=True, slots=True)
class Tail:
    """The answer of ``last_records``: records in file order, the lines skipped among them, where the
    complete lines end (the torn tail starts there) and the number of the line there if known."""

    records: list[dict[str, Any]]
    context: list[dict[str, Any]]  # train records just before ``records``, for the first rates
    skipped: list[Skipped]
    end: int
    end_line: int | None


def last_records(
    path: Path,
    count: int,
    *,
    keep: Callable[[dict[str, Any]], bool],
    max_record_bytes: int = MAX_RECORD_BYTES,
    chunk: int = BACK_CHUNK,
) -> Tail:
    """The last ``count`` records that ``keep`` accepts, reading backwards from the last ``\\n``.

    Reads ``chunk`` bytes at a time and parses only lines it needs: ``tail -n 10`` of a
    5 GB file reads a few chunks.  After the ``count`` records it reads on (at most
    ``RATE_CONTEXT_LINES`` lines) until each session of a printed ``train`` record has an earlier
    ``train`` record or its ``session_start``, so that the first lines printed get their tokens/s.
    Bad lines are located by line number when the scan reached the file's start, else by offset.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        end = tail_start(fd, os.fstat(fd).st_size)
        found: list[dict[str, Any]] = []  # newest first
        context: list[dict[str, Any]] = []
        skipped: list[tuple[int, int, str, str]] = []  # (offset, lines from the end, reason, excerpt)
        need_rate: set[str] = set()  # sessions whose earliest printed train record lacks a predecessor
        lines_seen = extra_lines = 0
        position, buffer, long_end = end, b"", None  # buffer: bytes [position, boundary)

        def take(line: bytes, offset: int) -> bool:
            """Handle one line (newest first); False once enough is known."""
            nonlocal lines_seen, extra_lines
            lines_seen += 1
            collecting = len(found) < count
            if not collecting:
                extra_lines += 1
                if not need_rate or extra_lines > RATE_CONTEXT_LINES:
                    return False
            if not line.strip():
                return True
            checked = check_record(line, max_bytes=max_record_bytes)
            if isinstance(checked, str):
                if collecting:
                    skipped.append((offset, lines_seen, checked, excerpt(line)))
                return True
            event, session = checked["event"], checked["session_id"]
            kept = collecting and keep(checked)
            if kept:
                found.append(checked)
            if event == "train":
                if kept:
                    need_rate.add(session)  # its predecessor is older still
                elif session in need_rate:
                    context.append(checked)
                    need_rate.discard(session)
            elif event == "session_start":
                need_rate.discard(session)  # the session's first train record has no rate
            return len(found) < count or bool(need_rate)

        going, unread = count > 0, 0
        while going and position > 0:
            start = max(0, position - chunk)
            data = os.pread(fd, position - start, start)
            if long_end is not None:  # inside a line too long to parse: only look for its start
                newline = data.rfind(b"\n")
                if newline < 0 and start > 0:
                    position = start
                    continue
                line_start = start + newline + 1
                lines_seen += 1
                if len(found) < count:
                    length = long_end - line_start
                    reason = f"line of {length:,} bytes is longer than the {max_record_bytes:,}-byte record limit"
                    head = os.pread(fd, EXCERPT_BYTES + 1, line_start)
                    skipped.append((line_start, lines_seen, reason, excerpt(head)))
                long_end, buffer, position = None, data[: newline + 1], start
                continue
            buffer = data + buffer
            position = start
            first = buffer.find(b"\n") if start > 0 else -1
            lines = buffer[first + 1 :].split(b"\n")[:-1]
            offset = start + len(buffer)
            for taken, line in enumerate(reversed(lines), start=1):
                offset -= len(line) + 1
                if not take(line, offset):
                    going, unread = False, len(lines) - taken
                    break
            buffer = buffer[: first + 1]  # a line that began in an earlier chunk, up to its newline
            if going and len(buffer) > max_record_bytes + 1:
                long_end, buffer = start + len(buffer) - 1, b""  # too long to be a record: find its start
        total = lines_seen + unread if position == 0 and long_end is None else None
        return Tail(
            records=found[::-1],
            context=context[::-1],
            skipped=[
                Skipped(offset, None if total is None else total - back + 1, reason, text)
                for offset, back, reason, text in reversed(skipped)
            ],
            end=end,
            end_line=None if total is None else total + 1,
        )
    finally:
        os.close(fd)


# -- throughput -------------------------------------------------------------------------------


class Rates:
    """Tokens per second of each ``train`` record, as ``metrics_core.analysis.tokens_per_second``:
    tokens consumed since the previous ``train`` record of the same session over the wall time
    between them; None for a session's first one and where time did not advance."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}  # session -> (time ns, tokens_seen)

    def __call__(self, record: Mapping[str, Any]) -> float | None:
        """The rate at ``record`` (a train record, fed in file order)."""
        now = (record["time"], record["tokens_seen"])
        before = self._last.get(record["session_id"])
        self._last[record["session_id"]] = now
        if before is None or now[0] <= before[0]:
            return None
        rate = (float(now[1]) - float(before[1])) / ((now[0] - before[0]) / 1e9)
        return rate if math.isfinite(rate) else None


# -- the digest of a whole run -----------------------------------------------------------------


def number(value: Any) -> float | None:
    """``value`` as a float when the reader's numeric columns would hold it as a number, else None.

    Booleans and strings are not numbers (``Column.numbers`` gives NaN for them).
    """
    if type(value) is float:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return None
    return None


def int_or_none(value: Any) -> int | None:
    """A session_start's ``discarded_bytes`` / ``resumed_from_step`` as an int, or None if it is none."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None


def supersede_thresholds(first_steps: Sequence[int], first_step_in_event: Mapping[int, int]) -> list[float]:
    """Per session, the lowest step of one event's records it supersedes in earlier sessions.

    docs/FORMAT.md: a session whose first record is at step S supersedes earlier records with
    step > S, and those at exactly S when it logged the same event at S itself.
    """
    return [float(first + (first_step_in_event.get(index) != first)) for index, first in enumerate(first_steps)]


@dataclass(frozen=True, slots=True)
class SessionDigest:
    """One session as ``RunReader.sessions`` describes it (same field names, times in ns)."""

    session_id: str
    index: int
    first_step: int
    last_step: int
    start_ns: int
    end_ns: int
    records: int
    downtime_s: float | None
    steps_replayed: int
    tokens_replayed: int
    records_superseded: int
    discarded_bytes: int | None
    resumed_from_step: int | None
    end_status: str | None


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One health check: severity (``error``/``warning``/``info``/``ok``), its name, one message per finding."""

    severity: str
    check: str
    messages: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LostWork:
    """What the run's crashes cost, over all sessions (``RunDigest.lost_work`` and
    ``metrics_core.analysis.lost_work`` both give it, with and without pandas)."""

    downtime_s: float
    steps_replayed: int
    tokens_replayed: int
    superseded_time_s: float
    training_time_s: float

    @property
    def superseded_share(self) -> float | None:
        """Share of training time spent producing train windows a later session redid."""
        return self.superseded_time_s / self.training_time_s if self.training_time_s > 0 else None


@dataclass(frozen=True, slots=True)
class _Replay:
    steps: list[int]
    tokens: list[int]
    records: list[int]
    superseded_time_s: float


class _SessionState:
    __slots__ = (
        "discarded_bytes", "end_ns", "end_status", "first_step", "last_step", "records",
        "resumed_from_step", "session_id", "start_ns",
    )  # fmt: skip

    def __init__(self, session_id: str, step: int, time_ns: int) -> None:
        self.session_id = session_id
        self.records = 0
        self.first_step = self.last_step = step
        self.start_ns = self.end_ns = time_ns
        self.discarded_bytes: int | None = None
        self.resumed_from_step: int | None = None
        self.end_status: str | None = None


@dataclass(slots=True)
class _Rows:
    """The per-record facts replay accounting needs, for one (event, session): ~8–24 bytes a record."""

    steps: array = field(default_factory=lambda: array("q"))
    tokens: array = field(default_factory=lambda: array("d"))  # train only: NaN = not a number
    window_s: array = field(default_factory=lambda: array("d"))  # train only: NaN for the first


@dataclass(slots=True)
class _Flagged:
    """Train windows of one session a check flagged: how many and their step range."""

    count: int = 0
    first_step: int = 0
    last_step: int = 0

    def add(self, step: int) -> None:
        if not self.count:
            self.first_step = self.last_step = step
        self.first_step, self.last_step = min(self.first_step, step), max(self.last_step, step)
        self.count += 1


_ACCOUNTING = ("attempted_updates", "updates", "skipped_updates_in_window")


class RunDigest:
    """Everything ``summary`` prints about a run, kept as running state; see the module docstring.

    ``refresh()`` reads what was appended since the last call.  Exposes what
    ``metrics_core.runs.run_status`` reads from a ``RunReader`` under the same names.
    """

    def __init__(self, run: str | os.PathLike[str], *, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self.path = metrics_path(run)
        self._follower = LineFollower(self.path, max_record_bytes=max_record_bytes)
        self._clear()

    def _clear(self) -> None:
        self.records = 0
        self.bad_lines = 0
        self.bad_line_samples: list[Skipped] = []
        self.resets: list[str] = []
        self.last_event: str | None = None
        self.run_ids: dict[str, None] = {}
        self._sessions: list[_SessionState] = []
        self._session_index: dict[str, int] = {}
        self._first_step_in_event: dict[str, dict[int, int]] = {}
        self._rows: dict[str, dict[int, _Rows]] = {}
        self._last_train_time: dict[int, int] = {}
        self._recent_times: deque[int] = deque(maxlen=_RECENT_TIMES)
        self.last_loss: dict[str, tuple[float, int]] = {}  # "train_loss"/"val_loss" -> (value, step)
        self.train_windows = 0
        self._columns: set[str] = set()  # train fields that held a value in some record
        self._accounting: dict[int, _Flagged] = {}
        self._missing_loss: dict[int, _Flagged] = {}
        self._replay_cache: tuple[int, _Replay] | None = None

    def close(self) -> None:
        self._follower.close()

    @property
    def pending_bytes(self) -> int:
        """Bytes after the last ``\\n``: a record being written, or a crash's torn tail."""
        return self._follower.pending_bytes

    def writer_alive(self) -> bool | None:
        """Whether a MetricsWriter holds the file's lock now (None: cannot tell)."""
        fd = self._follower.fd
        return None if fd is None else lock_is_held(fd)

    def refresh(self) -> int:
        """Read the complete lines appended since the last call; return how many records."""
        before = self.records
        for batch in self._follower.batches():
            if batch.reset is not None:
                resets = [*self.resets, batch.reset]
                self._clear()
                self.resets = resets
                before = 0
            for record in batch.records:
                self._add(record)
            self.bad_lines += len(batch.skipped)
            self.bad_line_samples.extend(batch.skipped[: max(0, 20 - len(self.bad_line_samples))])
        return self.records - before

    def _add(self, record: dict[str, Any]) -> None:
        session_id, event, step, when = record["session_id"], record["event"], record["step"], record["time"]
        index = self._session_index.get(session_id)
        if index is None:
            index = self._session_index[session_id] = len(self._sessions)
            self._sessions.append(_SessionState(session_id, step, when))
        session = self._sessions[index]
        session.records += 1
        session.last_step, session.end_ns = step, when
        self.records += 1
        self.last_event = event
        self.run_ids.setdefault(record["run_id"])
        self._recent_times.append(when)
        self._first_step_in_event.setdefault(event, {}).setdefault(index, step)
        rows = self._rows.setdefault(event, {}).get(index)
        if rows is None:
            rows = self._rows[event][index] = _Rows()
        rows.steps.append(step)
        if event == "train":
            self._add_train(record, index, rows)
        elif event == "validation":
            self._note_loss(record, "val_loss")
        elif event == "session_end":
            status = record.get("status")
            session.end_status = status if isinstance(status, str) else None
        elif event == "session_start" and session.discarded_bytes is None and session.resumed_from_step is None:
            session.discarded_bytes = int_or_none(record.get("discarded_bytes"))
            session.resumed_from_step = int_or_none(record.get("resumed_from_step"))

    def _add_train(self, record: dict[str, Any], index: int, rows: _Rows) -> None:
        self.train_windows += 1
        step, when = record["step"], record["time"]
        tokens = number(record.get("tokens"))
        rows.tokens.append(math.nan if tokens is None else tokens)
        before = self._last_train_time.get(index)
        rows.window_s.append(math.nan if before is None else (when - before) / 1e9)
        self._last_train_time[index] = when
        self._columns.update(key for key in (*_ACCOUNTING, "train_loss") if record.get(key) is not None)
        attempted, updates, skips = (number(record.get(key)) for key in _ACCOUNTING)
        # As pandas compares the columns: a missing or non-numeric value never adds up.
        if attempted is None or updates is None or skips is None or attempted != updates + skips:
            self._accounting.setdefault(index, _Flagged()).add(step)
        if record.get("train_loss") is None:
            self._missing_loss.setdefault(index, _Flagged()).add(step)
        self._note_loss(record, "train_loss")

    def _note_loss(self, record: dict[str, Any], key: str) -> None:
        value = number(record.get(key))
        if value is not None and math.isfinite(value):
            self.last_loss[key] = (value, record["step"])

    # -- what run_status reads, as RunReader names it -------------------------------------

    @property
    def last_record_time(self) -> datetime | None:
        if not self._recent_times:
            return None
        return _EPOCH + timedelta(microseconds=self._recent_times[-1] // 1000)

    def typical_gap_s(self) -> float | None:
        """Median gap between the last few records (the run's usual logging cadence)."""
        times = list(self._recent_times)
        if len(times) < 2:
            return None
        return float(statistics.median(b - a for a, b in pairwise(times))) / 1e9

    @property
    def last_end_status(self) -> str | None:
        if self.last_event != "session_end" or not self._sessions:
            return None
        return self._sessions[-1].end_status

    # -- sessions and replay ------------------------------------------------------------------

    @property
    def sessions(self) -> list[SessionDigest]:
        """Sessions in order of first appearance, with downtime and replay accounting (as RunReader)."""
        replay = self._replay()
        result, previous_end = [], None
        for index, state in enumerate(self._sessions):
            result.append(
                SessionDigest(
                    session_id=state.session_id,
                    index=index,
                    first_step=state.first_step,
                    last_step=state.last_step,
                    start_ns=state.start_ns,
                    end_ns=state.end_ns,
                    records=state.records,
                    downtime_s=None if previous_end is None else (state.start_ns - previous_end) / 1e9,
                    steps_replayed=replay.steps[index],
                    tokens_replayed=replay.tokens[index],
                    records_superseded=replay.records[index],
                    discarded_bytes=state.discarded_bytes,
                    resumed_from_step=state.resumed_from_step,
                    end_status=state.end_status,
                )
            )
            previous_end = state.end_ns
        return result

    def lost_work(self) -> LostWork:
        """Downtime, replayed work and the training time that produced superseded train windows."""
        sessions = self.sessions
        return LostWork(
            downtime_s=sum(s.downtime_s or 0.0 for s in sessions),
            steps_replayed=sum(s.steps_replayed for s in sessions),
            tokens_replayed=sum(s.tokens_replayed for s in sessions),
            superseded_time_s=self._replay().superseded_time_s,
            training_time_s=sum((s.end_ns - s.start_ns) / 1e9 for s in sessions),
        )

    def _replay(self) -> _Replay:
        """Per session: the steps, tokens and records of earlier sessions' work it redid; and the
        training time of all superseded train windows.  Cached until the next record.

        Each earlier record is redone by at most one session: the first later one whose
        threshold is at or below its step (``RunReader.replaced_by``).  Per earlier session, the
        later sessions that can be that first one have strictly falling thresholds, so one
        bisection per record finds it: O(records × log sessions).
        """
        if self._replay_cache is not None and self._replay_cache[0] == self.records:
            return self._replay_cache[1]
        count = len(self._sessions)
        firsts = [state.first_step for state in self._sessions]
        frontier: list[int] = firsts.copy()
        tokens = [0.0] * count
        superseded = [0] * count
        superseded_time_s = 0.0
        for event, by_session in self._rows.items():
            thresholds = supersede_thresholds(firsts, self._first_step_in_event.get(event, {}))
            for index, rows in by_session.items():
                later, negated = [], []  # candidates after `index`, thresholds strictly falling
                for other in range(index + 1, count):
                    if not later or thresholds[other] < -negated[-1]:
                        later.append(other)
                        negated.append(-thresholds[other])
                if not later:
                    continue
                train = event == "train"
                for row, step in enumerate(rows.steps):
                    # First candidate with threshold <= step, i.e. -threshold >= -step.
                    position = bisect.bisect_left(negated, -step)
                    if position == len(later):
                        continue
                    redoer = later[position]
                    superseded[redoer] += 1
                    frontier[redoer] = max(frontier[redoer], step)
                    if train:
                        if not math.isnan(rows.tokens[row]):
                            tokens[redoer] += rows.tokens[row]
                        if not math.isnan(rows.window_s[row]):
                            superseded_time_s += rows.window_s[row]
        replay = _Replay(
            steps=[frontier[index] - firsts[index] for index in range(count)],
            tokens=[int(total) if math.isfinite(total) else 0 for total in tokens],  # a garbage count is not work
            records=superseded,
            superseded_time_s=superseded_time_s,
        )
        self._replay_cache = (self.records, replay)
        return replay

    # -- health checks --------------------------------------------------------------------------

    def checks(self) -> list[CheckResult]:
        """The pandas-free health checks: bad lines, torn tail, window accounting, missing loss.

        Each check appears once, ``ok`` when it passed, so the reader sees what was checked.
        """
        results = []
        if self.bad_lines:
            where = [f"{s.where}: {clean(s.reason)}" for s in self.bad_line_samples[:3]]
            results.append(CheckResult("warning", "bad lines", (f"{self.bad_lines:,} line(s) skipped", *where)))
        else:
            results.append(CheckResult("ok", "bad lines", ("none",)))
        if self.pending_bytes:
            message = f"{self.pending_bytes:,} byte(s) after the last newline: a record being written, or a torn tail"
            results.append(CheckResult("info", "torn tail", (message,)))
        else:
            results.append(CheckResult("ok", "torn tail", ("the file ends on a complete record",)))
        if set(_ACCOUNTING) <= self._columns:
            results.append(self._flagged("window accounting", "error", self._accounting,
                                         "where attempted_updates ≠ updates + skipped_updates_in_window"))  # fmt: skip
        if "train_loss" in self._columns:
            results.append(self._flagged("missing loss", "warning", self._missing_loss, "with no train_loss"))
        return results

    def _flagged(self, check: str, severity: str, flagged: dict[int, _Flagged], what: str) -> CheckResult:
        if not flagged:
            return CheckResult("ok", check, (f"all {self.train_windows:,} train window(s) pass",))
        messages = tuple(
            f"session {shorten(clean(self._sessions[index].session_id), 16)}, steps {f.first_step:,}–"
            f"{f.last_step:,}: {f.count:,} window(s) {what}"
            for index, f in sorted(flagged.items())
        )
        return CheckResult(severity, check, messages)
