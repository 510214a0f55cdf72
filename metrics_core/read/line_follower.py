"""Bytes to complete lines: the first layer of every reader of ``metrics.jsonl``.

``LineFollower`` tails one ``RunFile`` (``metrics_core.read.run_file``) and hands out what was appended
since its last call, as blocks of complete lines; parsing them is the next layer's job.

Promises
--------
* Only **complete** lines: it remembers the offset after the last ``\\n`` it handed out, and the
  bytes after it are ``pending_bytes`` until their newline arrives (a writer is mid-line, or was
  killed there and the next writer will cut them).  Each byte is scanned for a newline once.
* A line longer than ``max_record_bytes`` is a ``LongLine``: skipped by its length, never held in
  memory or parsed.
* A file that was replaced (another version at the path), shrank below the offset, or was
  rewritten before it (its first bytes or the first bytes of the last line handed out changed)
  is followed again from its start, after a ``Restart`` saying why.
* Lines are numbered from 1 when the follower started at offset 0.
* A read shorter than asked is where the file ends for this call (it shrank under us, or a run
  in a bucket ends at a torn part), never a reason to read the same bytes again.

Cost: a call that finds nothing new is one ``stat``; otherwise reads of at most
``max(READ_CHUNK, max_record_bytes + 1)`` bytes, each handed out as one ``Lines`` block without
being copied.  A live append costs three system calls: the ``stat``, the first bytes, and one
read from the start of the last line handed out through the new bytes (its fingerprint checked
on the way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from metrics_core.read.records import EXCERPT_BYTES, BadLine, excerpt
from metrics_core.read.run_file import FileStat, RunFile

READ_CHUNK = 8 << 20  # bytes per read: bounds memory per block, holds any line short enough to parse
_FINGERPRINT = 256  # first bytes of a line compared to notice a rewrite (its time and session id)
_REREAD_BYTES = 64 << 10  # an incomplete line up to this long is read again rather than skipped over
_SPLIT_BYTES = 64 << 10  # a block up to this long is handed out split into its lines
_AHEAD_BYTES = 64 << 10  # a last line and new bytes up to this long each are read in one call (then copied)


class Lines(NamedTuple):  # a tuple: built per append without a frozen dataclass's setattr per field
    """Complete lines: ``data[:end]``, which starts at byte ``offset`` of the file and at line
    number ``first_line`` (None when the follower did not start at the file's start).  ``lines``:
    those lines without their newlines when the block is short (a live append): split once, where
    they are counted, for the parser; None for a long block, which a parser may not split."""

    data: bytes
    end: int
    offset: int
    first_line: int | None
    lines: list[bytes] | None = None


@dataclass(frozen=True, slots=True)
class LongLine:
    """A line over the record limit, skipped unread."""

    bad: BadLine


@dataclass(frozen=True, slots=True)
class Restart:
    """The file must be read again from its start; everything handed out before is void."""

    reason: str


@dataclass(frozen=True, slots=True)
class Position:
    """Where a follower stands, and the fingerprints that tell whether a file still matches it."""

    offset: int
    lines: int
    head: bytes  # the file's first bytes
    last_line: tuple[int, bytes]  # where the last line handed out starts, and its first bytes


def rereads(scanned: int, chunk: int) -> bool:
    """Whether an incomplete line of ``scanned`` bytes is read again, from its start, with the next
    block of ``chunk`` bytes: when it is short (each byte is then read about once, not the whole
    next block twice); a long one is skipped over, never scanned again.  Never more than half a
    block, so that a read from the line's start always reaches past what was scanned."""
    return scanned <= min(_REREAD_BYTES, chunk // 2)


class LineFollower:
    """The complete lines appended to one file since the last call; see the module docstring.

    ``offset``: where to start (just after a ``\\n``, or 0); ``line``: the number of the line
    there when known (1 at offset 0), else None.
    """

    def __init__(
        self,
        file: RunFile,
        *,
        max_record_bytes: int,
        offset: int = 0,
        line: int | None = 1,
        chunk: int | None = None,
        on_open: Callable[[], None] | None = None,
    ) -> None:
        self.file = file
        self.on_open = on_open
        self.max_record_bytes = max_record_bytes
        self.chunk = max(chunk or READ_CHUNK, max_record_bytes + 1)  # holds any line short enough to parse
        self.restarts: list[str] = []
        self._opened = False
        self._reset(offset, line)

    def _reset(self, offset: int, line: int | None) -> None:
        self.offset, self.line = offset, line
        self.target = offset  # the file's size as the current (or last) ``follow`` found it: what it reads up to
        self.pending_bytes = 0
        self._stat: FileStat | None = None
        self._scanned = 0  # bytes after offset known to hold no newline: not scanned again
        self._pending_head = b""  # their first bytes, to notice a writer cutting and rewriting them
        self._head = b""
        self._last_line: tuple[int, bytes] = (0, b"")
        self._ahead: bytes | None = None  # the bytes from the offset on, read with the last line's check

    @property
    def read_identity(self) -> tuple[int, ...] | None:
        """The file's identity as the last ``follow()`` found it, before reading (any later write
        changes it); None before the first."""
        return None if self._stat is None else self._stat.identity

    @property
    def opened(self) -> bool:
        return self._opened

    def open(self) -> None:
        """Pin the file the path names now (``follow`` does it on its first call; a follower that
        starts mid-file opens at once, so that a change before its first call is noticed), then
        call ``on_open``, which may ``resume`` from a saved position."""
        self.file.open()
        self._opened = True
        if self.offset and not self._head:  # started mid-file: the first bytes before the offset
            self._head = self.file.read(0, _FINGERPRINT)[: self.offset]
        if self.on_open is not None:
            self.on_open()

    @property
    def lines_read(self) -> int:
        """Lines handed out since the file's start (``position().lines``, without building one)."""
        return (self.line or 1) - 1

    def position(self) -> Position:
        return Position(self.offset, self.lines_read, self._head, self._last_line)

    def matches(self, position: Position) -> bool:
        """Whether the opened file holds what ``position`` was taken from (its fingerprints)."""
        where, last = position.last_line
        return (
            self.file.size() >= position.offset
            and self.file.read(0, len(position.head)) == position.head
            and self.file.read(where, len(last)) == last
        )

    def resume(self, position: Position) -> None:
        """Continue from ``position`` (checked with ``matches``) instead of the start."""
        self.offset, self.line = position.offset, position.lines + 1
        self._head, self._last_line = position.head, position.last_line

    def follow(self) -> Iterator[Lines | LongLine | Restart]:
        """What was appended since the last call, in file order; see the module docstring."""
        stat = self.file.stat()
        if stat is None or (self._stat is not None and stat.identity == self._stat.identity):
            return  # gone for a moment (rotation, a copy in progress), or unchanged: one stat
        if self._opened:
            reason = self._changed(stat)
            if reason is not None:
                self.restarts.append(reason)
                self.close()
                self._reset(0, 1)
                yield Restart(reason)  # before the new start's on_open: what it restores stays
        if self._opened:  # the path still names the opened file: the stat's size is its size
            size = stat.size
        else:
            self.open()
            size = self.file.size()  # the file opened now, which may be newer than the stat
        self._stat, self.target = stat, size
        if self._scanned and (
            size < self.offset + self._scanned
            or self.file.read(self.offset, len(self._pending_head)) != self._pending_head
        ):
            self._scanned = 0  # the incomplete tail was cut (a writer resumed): scan it anew
        while self.offset + self._scanned < size:
            resume = not self._scanned or rereads(self._scanned, self.chunk)
            start = self.offset if resume else self.offset + self._scanned
            wanted = min(self.chunk, size - start)
            data = self._ahead if self._ahead is not None else self.file.read(start, wanted)
            self._ahead = None
            if len(data) < wanted:  # it ends there now: shrank under us, or a run in parts ends at a torn part
                size = start + len(data)  # the next call looks again
            if not data:
                break
            first = data.find(b"\n", self._scanned if resume else 0)
            if first < 0:
                self._scanned = start + len(data) - self.offset
                self._pending_head = self.file.read(self.offset, EXCERPT_BYTES)
                continue
            if not resume:  # the line that began at offset ends at start + first
                if self._scanned + first > self.max_record_bytes:
                    yield self._skip_long_line(self._scanned + first)
                self._scanned = 0  # a short line is re-read whole from its start, next turn
                continue
            cut = data.rfind(b"\n") + 1
            if start == 0:
                self._head = data[: min(first + 1, _FINGERPRINT)]
            last = data.rfind(b"\n", 0, cut - 1) + 1
            self._last_line = (start + last, data[last : min(cut, last + _FINGERPRINT)])
            lines = data[:cut].split(b"\n") if cut <= _SPLIT_BYTES else None
            if lines is not None:
                lines.pop()  # what follows the last newline: nothing
            block = Lines(data, cut, start, self.line, lines)
            self.offset = start + cut
            if self.line is not None:
                self.line += data.count(b"\n", 0, cut) if lines is None else len(lines)
            self._scanned = len(data) - cut
            if self._scanned:
                self._pending_head = data[cut : cut + EXCERPT_BYTES]
            yield block
        self.pending_bytes = max(size - self.offset, 0)

    def _skip_long_line(self, length: int) -> LongLine:
        head = self.file.read(self.offset, _FINGERPRINT)
        if self.offset == 0:
            self._head = head
        self._last_line = (self.offset, head)
        reason = f"line of {length:,} bytes is longer than the {self.max_record_bytes:,}-byte record limit"
        bad = BadLine(self.line, reason, excerpt(head[: EXCERPT_BYTES + 1]), self.offset)
        self.offset += length + 1
        if self.line is not None:
            self.line += 1
        return LongLine(bad)

    def _changed(self, stat: FileStat) -> str | None:
        """Why the file must be read again from its start (replaced, shrank, rewritten), or None.

        A rewrite in place (``cp`` over the file, truncate and rewrite) keeps the version and may
        keep the size; it changes the first line or the last line handed out, which hold the
        times and session id of their records: both are compared, two small reads per change.
        """
        if stat.version != self.file.opened_version:
            return "the file was replaced (new inode)"
        if stat.size < self.offset:
            return f"the file shrank from {self.offset:,} to {stat.size:,} bytes"
        where, last = self._last_line
        if self.file.read(0, len(self._head)) != self._head or self._read_last_line(where, stat.size) != last:
            return "the file was rewritten before the read offset"
        return None

    def _read_last_line(self, where: int, size: int) -> bytes:
        """The fingerprint's bytes of the last line handed out, at ``where``.  When that line and
        the new bytes are short and no incomplete line waits, the same read takes the bytes
        ``follow`` reads next (from the offset to ``size``), kept in ``_ahead``: one system call less
        (a live append), for a copy of at most ``_AHEAD_BYTES``."""
        length, skip = len(self._last_line[1]), self.offset - where
        if self._scanned or not 0 < skip <= _AHEAD_BYTES or not 0 < size - self.offset <= _AHEAD_BYTES:
            return self.file.read(where, length)
        data = self.file.read(where, size - where)
        self._ahead = data[skip:]
        return data[:length]

    def close(self) -> None:
        self.file.close()
        self._opened = False
