"""Run health from the log: the status of a run, read from its directory alone.

Status comes from the run directory alone (the log, its lock and the writer's failure note),
never from a heartbeat thread:

* ``finished`` / ``failed`` / ``interrupted`` — the last record is a ``session_end`` with that status;
* ``failed``   — also when the writer noted a failed write (disk full, file-size limit) and nothing
  was written after it: the session could not even log its ``session_end``, but it did not crash.
  ``write_failure`` gives the reason (the note's contract is in ``metrics_core.write.failure_note``);
* ``live``     — the last record is recent: younger than ``max(60 s, 5 × the usual gap)``;
* ``stalled``  — no recent record, but a writer still holds the file's lock (a hung job) or we
  cannot tell;
* ``crashed``  — no writer holds the lock and the run did not end: the process ended without a
  ``session_end`` (SIGKILL, OOM, node loss).  At once, whatever the last record's age, where a
  free lock is certain to mean a dead writer: on a file system local to this host
  (``file_systems.locks_are_certain``), on a file whose lock this reader has seen held (locks work
  there), or behind a torn last line.  Elsewhere (NFS and the like, before the lock is seen held)
  only once no record is recent: the heartbeat rule;
* ``empty``    — the file holds no complete record yet.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from metrics_core.read.file_systems import locks_are_certain
from metrics_core.read.run_file import LocalFile, open_regular
from metrics_core.write.crash_safety import tail_start
from metrics_core.write.failure_note import FAILURE_NOTE_FILENAME, NOTE_BYTES, parse_note

STALL_FLOOR_S = 60.0
STALL_GAPS = 5.0
END_STATUSES = ("finished", "failed", "interrupted")
SETTLED = (*END_STATUSES, "crashed")  # statuses only a write to the run's file can change


class StatusSource(Protocol):
    """What ``run_status`` reads of a run: ``RunReader``, ``run_digest.RunDigest`` and the dashboard
    store's record of a released run all provide it."""

    path: Path  # the run's metrics file (its failure note lies beside it when ``on_disk``)
    on_disk: bool  # a local file: its lock and failure note can be looked at; not so in a bucket
    within: Path | None  # the directory (its runs root) every file of the run must lie inside, if any

    @property
    def last_event(self) -> str | None: ...

    @property
    def last_end_status(self) -> str | None: ...

    @property
    def last_end_error(self) -> str | None: ...

    @property
    def last_record_time(self) -> datetime | None: ...

    @property
    def pending_bytes(self) -> int: ...

    def typical_gap_s(self) -> float | None: ...

    def writer_alive(self) -> bool | None: ...

    # Whether ``writer_alive`` has found the lock held on this file before: then locks work where
    # it lives (a local disk; NFS and Lustre carry them too) and a free lock is a dead writer.
    lock_seen: bool


@dataclass(frozen=True, slots=True)
class StatusRecord:
    """What ``run_status`` reads of a run, kept when its reader is closed and its records dropped:
    with it, the run's status still follows the clock and its writer's lock.  ``identity``: the
    file's identity when that reader last read it (``run_file.FileStat``), so a later write shows."""

    path: Path
    on_disk: bool
    identity: tuple[int, ...] | None
    last_event: str | None
    last_end_status: str | None
    last_end_error: str | None
    last_record_time: datetime | None
    pending_bytes: int
    gap_s: float | None
    lock_seen: bool
    within: Path | None = None

    @classmethod
    def of(cls, source: StatusSource, *, identity: tuple[int, ...] | None) -> StatusRecord:
        return cls(
            source.path,
            source.on_disk,
            identity,
            source.last_event,
            source.last_end_status,
            source.last_end_error,
            source.last_record_time,
            source.pending_bytes,
            source.typical_gap_s(),
            source.lock_seen,
            source.within,
        )

    def typical_gap_s(self) -> float | None:
        return self.gap_s

    def writer_alive(self) -> bool | None:
        """As a reader's: the lock is probed on a descriptor opened for the probe."""
        if not self.on_disk:
            return None
        file = LocalFile(self.path, within=self.within)
        try:
            file.open()
        except OSError:
            return None
        try:
            return file.writer_alive()
        finally:
            file.close()


@dataclass(frozen=True, slots=True)
class WriteFailure:
    """A write the writer could not make, as its failure note tells it."""

    session_id: str
    time: datetime
    error: str  # "No space left on device (ENOSPC)"


def write_failure(reader: StatusSource) -> WriteFailure | None:
    """The failed write that is the last thing to have happened to the run, if there is one.

    The note counts only while ``metrics.jsonl`` still ends exactly where the failed write left
    it (same offset after the last complete record, same size), so a record written later, by
    the same or a resumed session, makes it stale.  A blank, torn (being rewritten right now)
    or unreadable note is no note, and so is anything but a regular file, never waited on, or a
    file outside the run's ``within`` (a link out of the runs root).
    Cost: one small read and a ``stat``, plus a backwards scan of the torn tail when the sizes
    match.  A run not ``on_disk`` (in a bucket) has no note: its path names no local file.
    """
    if not reader.on_disk:
        return None
    try:
        with open(open_regular(reader.path.parent / FAILURE_NOTE_FILENAME, within=reader.within), "rb") as file:
            note = parse_note(file.read(NOTE_BYTES))
    except OSError:
        return None
    if note is None:
        return None
    try:
        fd = open_regular(reader.path, within=reader.within)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size != note["size"] or tail_start(fd, size) != note["end"]:
            return None
    finally:
        os.close(fd)
    try:
        when = datetime.fromisoformat(note["time"])
    except ValueError:
        return None
    return WriteFailure(note["session_id"], when, note["error"])


def run_status(reader: StatusSource, *, now: datetime) -> str:
    """The run's health from its log, its writer lock and its failure note; see the module docstring."""
    if reader.last_event == "session_end":
        status = reader.last_end_status
        return status if status in END_STATUSES else "finished"
    if write_failure(reader) is not None:
        return "failed"
    last = reader.last_record_time
    if last is None:
        return "empty"
    alive = reader.writer_alive()
    if alive is False and (reader.pending_bytes or reader.lock_seen or locks_are_certain(reader.path)):
        return "crashed"  # at once, not after the heartbeat: no writer holds a lock that would be seen
    gap = reader.typical_gap_s() or 0.0
    if (now - last).total_seconds() <= max(STALL_FLOOR_S, STALL_GAPS * gap):
        return "live"
    return "crashed" if alive is False else "stalled"


CRASH_REASON = "ended without a session_end: killed (SIGKILL, out of memory) or its node was lost"


def stop_reason(source: StatusSource, status: str) -> str | None:
    """Why a run with ``status`` (``run_status``'s answer) stopped, in one line: its
    ``session_end``'s error (the exception, the signal, the failing rank), the write that failed
    (disk full), or what a crash means; None for a run that did not stop or finished."""
    if status in ("failed", "interrupted"):
        if source.last_event == "session_end":
            return source.last_end_error
        failure = write_failure(source)
        return None if failure is None else f"write failed: {failure.error}"
    return CRASH_REASON if status == "crashed" else None
