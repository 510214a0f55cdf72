"""How lines reach ``metrics.jsonl`` so that a crash never leaves a half record behind.

``LineAppender`` is the one process appending to a file; ``MetricsWriter`` writes every record
through it.  The read side uses ``tail_start`` (where the complete lines end) and
``lock_is_held`` (whether a writer is still alive) from here too.

What a crash leaves behind
--------------------------
* The newline is the commit point: bytes after the last ``\\n`` are not a line, and every
  reader ignores them.  A process killed mid-write (SIGKILL, OOM killer, node loss) leaves at
  most one incomplete last line, the torn tail.  The next appender to open the file finds it
  (``tail_start`` scans back in bounded ``TAIL_CHUNK`` pieces, so a huge file costs nothing to
  open) and reports its length (``size - end``).  Complete lines are never read, validated or
  rewritten.
* The cut and its report cannot be separated by a crash: the tail is not cut at open but by the
  first ``append``, which writes its line over the tail and then truncates what is left of it.
  A process killed before its first append leaves the tail in place for the next appender to
  report; one killed between the overwrite and the truncation leaves its complete first line
  followed by the rest of the tail, which the next appender cuts and reports as its own cut.
  The tail holds no ``\\n`` and the new line's only ``\\n`` is its last byte, so no reader ever
  sees a mix of the two as a line.  (The descriptor is not ``O_APPEND``: Linux ``pwrite`` would
  append there.)
* An append that fails half-way (disk full, file-size limit, an interrupt) is undone before the
  error propagates: the file again ends where this append found it, on a complete line (plus a
  not yet cut torn tail of the same length), so a later append never glues itself onto a torn
  line.  An error raised after the newline landed leaves the line counted: it is in the file.
* Durability: a line is handed to the OS before ``append`` returns, which survives the death of
  the process, the common failure.  ``fsync=True`` also flushes it to stable storage, which
  survives power loss at the cost of a disk flush per line (slow on network storage).

One appender per file
---------------------
The lock is an open-file-description lock (``F_OFD_SETLK``, Linux ≥ 3.15), an ``fcntl``
byte-range lock: unlike ``flock`` it is carried by NFS (NLM for v3, native in v4) and Lustre, and
unlike classic POSIX ``lockf`` locks it belongs to this open file, so a reader in the same process
closing its own descriptor of the file cannot silently drop it, and a second appender in the same
process is refused too.  Where OFD locks do not exist (non-Linux) it falls back to ``lockf``.
Closing the appender's descriptor, or the end of its process, releases it.
"""

from __future__ import annotations

import fcntl
import io
import os
import struct
from pathlib import Path

from metrics_core.errors import WriterLockedError

TAIL_CHUNK = 4096
_FLOCK = "hhqqixxxx"  # struct flock {short l_type; short l_whence; off_t l_start; off_t l_len; pid_t l_pid;}


def tail_start(fd: int, size: int) -> int:
    """Offset just after the last ``\\n`` in the first ``size`` bytes of ``fd`` (0 if none).

    Reads backwards in ``TAIL_CHUNK`` pieces, so only the torn tail itself is ever read.
    """
    end = size
    while end > 0:
        start = max(0, end - TAIL_CHUNK)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def lock_is_held(fd: int) -> bool | None:
    """Whether some appender holds the file open on ``fd`` (any mode); None if unknowable.

    Lets a reader tell a hung trainer (lock held, no records) from a dead one (lock gone) from
    the file alone, on the same host or over NFS.
    """
    if not hasattr(fcntl, "F_OFD_GETLK"):  # pragma: no cover - non-Linux
        return None
    try:
        reply = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    except OSError:
        return None
    return struct.unpack(_FLOCK, reply)[0] != fcntl.F_UNLCK


def lock_exclusive(fd: int) -> None:
    """Take a non-blocking exclusive lock on the whole file; BlockingIOError if held."""
    if hasattr(fcntl, "F_OFD_SETLK"):
        # l_len = 0 locks to end of file whatever it grows to; OFD locks need l_pid = 0.
        request = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
        except OSError as exc:
            if exc.errno in (11, 13):  # EAGAIN / EACCES: somebody else holds it
                raise BlockingIOError(exc.errno, exc.strerror) from None
            raise
    else:  # pragma: no cover - non-Linux
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


class LineAppender:
    """Appends complete lines to ``path``, which it creates and holds locked until ``close``.

    ``end`` is the offset after the last complete line, where the next line goes; ``size`` is the
    file's size, larger than ``end`` while the torn tail found at open awaits its cut.  Raises
    ``WriterLockedError`` when another appender holds the file.
    """

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        # A FileIO object (not a bare descriptor) so an appender dropped without close() still closes;
        # its descriptor is kept as an int too, for the hot path of ``append``.
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._file = io.FileIO(self._fd, "r+")
        try:
            try:
                lock_exclusive(self._fd)
            except BlockingIOError:
                raise WriterLockedError(
                    f"{path}: another writer holds this file; only one process may write a "
                    "run's metrics.jsonl at a time (give each concurrent job its own run directory)"
                ) from None
            self.size = os.fstat(self._fd).st_size
            self.end = tail_start(self._fd, self.size)
        except BaseException:
            self._file.close()
            raise

    def append(self, line: bytes) -> None:
        """Write ``line`` (whose one ``\\n`` is its last byte) at ``end``, then cut what is left of
        a torn tail after it; on any exception the line is wholly in the file or wholly undone."""
        fd = self._fd
        start, end = self.end, self.end + len(line)
        landed = False
        try:
            written = os.pwrite(fd, line, start)
            while written < len(line):  # a short write to a regular file is rare but legal
                written += os.pwrite(fd, line[written:], start + written)
            landed = True
        finally:
            # An interrupt may land after the last byte: the newline, not a counter, decides.
            # A pending tail holds no newline, so it cannot fake one at that offset.
            if landed or os.pread(fd, 1, end - 1) == b"\n":
                self.end = end
                if self.size > end:  # the rest of the torn tail after the line that overwrote it
                    os.ftruncate(fd, end)
                self.size = end
            elif os.fstat(fd).st_size > self.size:  # undo what part of the line was written
                os.ftruncate(fd, self.size)
        if self.fsync:
            os.fsync(fd)

    def close(self) -> None:
        """Close the file, which releases the lock (idempotent); a torn tail not yet cut stays."""
        self._fd = -1  # an append after close fails (EBADF), never writes to a reused descriptor
        self._file.close()
