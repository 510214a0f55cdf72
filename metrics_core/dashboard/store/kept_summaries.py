"""The runs table's facts of settled runs, kept across restarts in the cache directory, so that a
restarted server lists a root of ten thousand finished runs without reading them again.

Contract:

* What is kept: for a run whose status only a write can change (``run_status.SETTLED``), what its
  row and its released state hold (``RunSummary``, the metric tails, the data key, the
  ``StatusRecord``), written when the store releases its reader (``RunEntry.release_if_idle``):
  one line appended per release, O(1) memory here, nothing rewritten while the server runs.
* When it is trusted: only for the file it was read from.  A kept run is restored when its file's
  identity (inode, size, mtime and ctime: ``run_file.FileStat``) is the one its reader read, and
  the fingerprints the reader itself checks to notice a rewrite (``line_follower.Position``: the
  first bytes, the bytes where the last line read starts) still hash the same: the file is
  opened once for that, inside the root (``run_file.open_regular``).  Anything else is read again.
* Private (``metrics_core.read.private_files``): the file is 0600 in the 0700 cache directory,
  created anew, never through a link; one another user owns or can write to is refused with one
  warning, as a cache file is.  Each line carries a CRC-32 and the format: a corrupt, torn or
  older line is skipped (one warning per file), never trusted, never an exception.
* Bounded: one file per root (named by the root's resolved path), last line per run wins; read
  once, at the store's first cold read, only up to ``MAX_FILE_BYTES`` (a bigger one is removed),
  and rewritten then with the last line of each run when stale lines outnumber them
  (``COMPACT_RATIO``).  Restoring follows the cold read's order and pace (``take``): what a page
  reads within its budget first, the loader the rest; each run's line is let go as it is taken.
  Two servers on one root and one cache directory both append; a rewrite by one may drop lines
  the other appends meanwhile: those runs are read again at the next start, no worse.
* Only a local root keeps summaries (a bucket's file is no ``LocalFile``: checking a
  fingerprint would cost a request per run).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat as stat_mode
import threading
import zlib
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from metrics_core.dashboard.store.rows import Tails
from metrics_core.read.columns import return_memory_to_os
from metrics_core.read.line_follower import Position
from metrics_core.read.private_files import create_private, directory_refusal, private_directory, refuse, untrusted
from metrics_core.read.run_file import LocalFile
from metrics_core.read.run_status import SETTLED, StatusRecord
from metrics_core.read.run_summary import LastValue, RunSummary
from metrics_core.roots.discovery import RunInfo
from metrics_core.roots.runs_root import RunsRoot

FORMAT = 1  # bump when a kept line's fields, or what a row is made of, change
MAX_FILE_BYTES = 256 << 20  # ~150,000 runs' lines: a bigger file is not read (one warning)
COMPACT_RATIO = 2  # rewritten when read if it holds more lines than this many per run kept
_log = logging.getLogger(__name__)
_Metrics = Mapping[str, tuple[float, float, float]]


@dataclass(frozen=True, slots=True)
class Kept:
    """One settled run as a previous server left it: what a store's entry takes back (``RunEntry.update``)."""

    summary: RunSummary
    metrics: _Metrics
    data_key: tuple[int, ...]
    status: StatusRecord


class KeptSummaries:
    """The kept summaries of one root in ``directory``; see the module docstring.  Thread-safe."""

    def __init__(self, directory: Path, source: RunsRoot) -> None:
        self.directory = directory
        self.source = source
        name = hashlib.sha256(os.fsencode(os.path.realpath(source.location))).hexdigest()[:24]
        self.path = directory / f"summaries-{name}.jsonl"
        self._lock = threading.Lock()
        self._fd: int | None = None  # appended to; opened by the first ``keep``
        self._found: dict[str, bytes] | None = None  # the file's valid lines by run not taken yet; None: not read
        self._off = False  # refused, or could not be written: nothing kept nor restored
        self.stats = {"restored": 0, "kept": 0, "skipped_lines": 0}

    # -- restoring ----------------------------------------------------------------------------

    def take(self, info: RunInfo) -> Kept | None:
        """Run ``info``'s kept facts if its file is still the one they were read from, else None;
        asked as the store first reads the run (``RunEntry.update``: the runs a page reads within
        its budget first, then the loader's, or the alerter's if it asks first), so a restart
        restores in the order and at the pace a cold root is read.  The file is read at the first
        call; each run's line is let go as it is asked for.  One ``stat`` and one open per kept run."""
        with self._lock:
            if self._found is None:
                self._found = self._read()
            line = self._found.pop(info.name, None)
            emptied = line is not None and not self._found
        if emptied:  # the file's lines, megabytes for a big root, all taken: given back to the OS
            return_memory_to_os()
        kept = None if line is None else self._checked(info, line)
        self.stats["restored"] += kept is not None
        return kept

    def _read(self) -> dict[str, bytes]:
        """The file's valid lines, the last one per run; empty when there is none, or it is refused."""
        if self._off or directory_refusal(self.directory) is not None:
            return {}
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError as exc:  # a link (ELOOP), or the OS refused
            self._refuse(f"cannot be read ({exc.strerror})")
            return {}
        with open(fd, "rb") as file:
            found = os.fstat(fd)
            reason = untrusted(found) or (None if stat_mode.S_ISREG(found.st_mode) else "is not a regular file")
            if reason is not None:
                self._refuse(reason)
                return {}
            if found.st_size > MAX_FILE_BYTES:  # ours, but more than a root's runs make: started again
                _log.warning("%s holds %d bytes, more than %d: removed", self.path, found.st_size, MAX_FILE_BYTES)
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
                return {}
            data = file.read(MAX_FILE_BYTES + 1)
        lines: dict[str, bytes] = {}
        skipped = 0
        for line in data.splitlines():
            name = _valid(line)
            if name is None:
                skipped += 1
            else:
                lines[name] = line
        self.stats["skipped_lines"] = skipped
        if skipped:
            _log.warning("%s: %d kept summary line(s) corrupt or of another format: ignored", self.path, skipped)
        if len(data.splitlines()) > COMPACT_RATIO * max(len(lines), 1):
            self._rewrite(lines.values())
        return lines

    def _checked(self, info: RunInfo, line: bytes) -> Kept | None:
        """The kept facts of ``line`` if the run's file is still the one they were read from."""
        file = self.source.peek_file(info)
        if not isinstance(file, LocalFile):
            return None
        try:
            record = orjson.loads(line[9:])
            now = file.stat()
            if now is None or list(now.identity) != record["id"]:
                return None
            offset, head, where, last, digest = record["p"]
            file.open()
            try:
                if file.size() < offset or _digest(file.read(0, head), file.read(where, last)) != digest:
                    return None
            finally:
                file.close()
            return _decode(record, file)
        except Exception:  # a line this code cannot take, or a file gone meanwhile: the run is read
            return None

    def _rewrite(self, lines: Iterable[bytes]) -> None:
        """Replace the file with ``lines`` (the last of each run), atomically.  Caller holds the lock."""
        temporary = self.directory / f".{self.path.name}.{os.getpid()}.{threading.get_ident()}"
        try:
            fd = create_private(temporary)
            with open(fd, "wb") as file:
                file.writelines(line + b"\n" for line in lines)
            os.replace(temporary, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            return
        if self._fd is not None:  # appends go to the new file (the caller holds the lock)
            os.close(self._fd)
            self._fd = None

    # -- keeping ------------------------------------------------------------------------------

    def keep(
        self,
        name: str,
        summary: RunSummary,
        metrics: _Metrics,
        data_key: tuple[int, ...] | None,
        released: StatusRecord,
        position: Position,
    ) -> None:
        """Append run ``name``'s facts as its reader is released; nothing for a run that may still
        change without a write, or whose file is not on this machine's disk."""
        if summary.status not in SETTLED or data_key is None or released.identity is None or not released.on_disk:
            return
        where, last = position.last_line
        record = {
            "f": FORMAT,
            "n": name,
            "id": list(released.identity),
            "p": [position.offset, len(position.head), where, len(last), _digest(position.head, last)],
            "k": list(data_key),
            "s": _encoded_summary(summary),
            "m": dict(metrics),
            "r": [
                released.last_event,
                released.last_end_status,
                released.last_end_error,
                _time(released.last_record_time),
                released.pending_bytes,
                released.gap_s,
                released.lock_seen,
            ],
        }
        payload = orjson.dumps(record)
        line = b"%08x %s\n" % (zlib.crc32(payload), payload)
        with self._lock:
            fd = self._append_fd()
            if fd is None:
                return
            try:
                os.write(fd, line)  # one write of one line, O_APPEND: whole with another process's
                self.stats["kept"] += 1
            except OSError:
                self._off = True

    def _append_fd(self) -> int | None:
        """The file opened for appending (made 0600 if absent); None when refused.  Caller holds the lock."""
        if self._fd is not None or self._off:
            return self._fd
        try:
            if directory_refusal(self.directory) is not None:
                raise PermissionError("cache directory refused")
            private_directory(self.directory)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                fd = create_private(self.path, os.O_WRONLY | os.O_APPEND)
            found = os.fstat(fd)
            reason = untrusted(found) or (None if stat_mode.S_ISREG(found.st_mode) else "is not a regular file")
            if reason is not None:
                os.close(fd)
                self._refuse(reason)
                return None
        except OSError:
            self._off = True
            return None
        self._fd = fd
        return fd

    def _refuse(self, reason: str) -> None:
        self._off = True
        refuse(self.directory, self.path, reason)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _digest(head: bytes, last: bytes) -> str:
    return hashlib.blake2b(head + b"\0" + last, digest_size=16).hexdigest()


def _valid(line: bytes) -> str | None:
    """The run a kept line is of, if its CRC holds and its format is this code's; only the name is
    parsed here (a restart reads every line, and decodes a run's whole line when it is taken)."""
    try:
        if line[8:9] != b" " or int(line[:8], 16) != zlib.crc32(line[9:]):
            return None
        text = line[9:].decode()
        if not text.startswith(_PREFIX):  # ``keep`` writes the format, then the name, first
            return None
        return json.decoder.scanstring(text, len(_PREFIX))[0]
    except ValueError:  # not hex, not UTF-8, not a JSON string
        return None


_PREFIX = f'{{"f":{FORMAT},"n":"'


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _when(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _encoded_summary(summary: RunSummary) -> list[Any]:
    loss = lambda last: None if last is None else [last.value, last.step]  # noqa: E731
    return [
        summary.status,
        summary.records,
        summary.sessions,
        _time(summary.started),
        _time(summary.last_record_time),
        summary.last_step,
        summary.tokens_seen,
        summary.skipped_updates,
        loss(summary.train_loss),
        loss(summary.val_loss),
        summary.bad_lines,
        summary.pending_bytes,
        summary.reason,
        summary.config,
        list(summary.loss_trend),
    ]


def _decode(record: dict[str, Any], file: LocalFile) -> Kept:
    """A kept line's facts, its run's file ``file`` (where its status record points)."""
    (
        status,
        records,
        sessions,
        started,
        last_time,
        last_step,
        tokens,
        skipped,
        train,
        val,
        bad,
        pending,
        reason,
        config,
        trend,
    ) = record["s"]
    loss = lambda last: None if last is None else LastValue(float(last[0]), int(last[1]))  # noqa: E731
    summary = RunSummary(
        status=str(status),
        records=int(records),
        sessions=int(sessions),
        started=_when(started),
        last_record_time=_when(last_time),
        last_step=last_step,
        tokens_seen=tokens,
        skipped_updates=skipped,
        train_loss=loss(train),
        val_loss=loss(val),
        bad_lines=int(bad),
        pending_bytes=int(pending),
        reason=reason,
        config=None if config is None else dict(config),
        loss_trend=array("d", [float(value) for value in trend]) if trend else (),
    )
    metrics = Tails(
        {str(key): (float(last), float(low), float(high)) for key, (last, low, high) in record["m"].items()}
    )
    event, end_status, end_error, record_time, pending_bytes, gap, lock_seen = record["r"]
    released = StatusRecord(
        file.path,
        True,
        tuple(record["id"]),
        event,
        end_status,
        end_error,
        _when(record_time),
        int(pending_bytes),
        gap,
        bool(lock_seen),
        file.within,
    )
    return Kept(summary, metrics, tuple(int(value) for value in record["k"]), released)
