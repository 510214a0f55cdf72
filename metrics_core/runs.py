"""Run discovery under a runs root, safe resolution of run names, and run health from the log.

Discovery promises: every directory under ``root`` (down to ``max_depth``) that holds a
``metrics.jsonl`` is a run, named by its path relative to ``root`` with ``/`` separators.  One
that is no regular file (a FIFO, a directory) is listed too: its readers refuse it naming the
path and why (``storage.open_regular``), so it shows as a run in error, not as no run.
Hidden directories (``.git``, ``.cache`` ...) are skipped; a symlink is followed only when its
target stays inside ``root``, and a directory reached twice (through a link) is listed once.
An entry that cannot be looked into (a directory the OS refuses to list, a symlink loop, a link
through a file) never hides the others: ``discover_runs`` lists every other run and names each such
entry, relative to ``root``, with the reason (``UnreadableEntry``).  A link to nothing hides no run
(nothing is there) and is skipped, like an entry removed during the walk.

Status comes from the run directory alone (the log, its lock and the writer's failure note),
never from a heartbeat thread:

* ``finished`` / ``failed`` / ``interrupted`` — the last record is a ``session_end`` with that status;
* ``failed``   — also when the writer noted a failed write (disk full, file-size limit) and nothing
  was written after it: the session could not even log its ``session_end``, but it did not crash.
  ``write_failure`` gives the reason (the note's contract is in ``metrics_core.failure_note``);
* ``live``     — the last record is recent: younger than ``max(60 s, 5 × the usual gap)``;
* ``stalled``  — no recent record, but a writer still holds the file's lock (a hung job) or we
  cannot tell;
* ``crashed``  — no recent record and no writer holds the lock: the process ended without a
  ``session_end`` (SIGKILL, OOM, node loss); also a torn last line with no writer behind it; and
  at once, whatever the last record's age, when the reader has seen this file's lock held and
  finds it free (locks work there, so the writer is gone: the heartbeat rule is for the others);
* ``empty``    — the file holds no complete record yet.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from metrics_core.crash_safety import tail_start
from metrics_core.errors import RunNotFoundError, RunPathError
from metrics_core.failure_note import FAILURE_NOTE_FILENAME, NOTE_BYTES, parse_note
from metrics_core.storage import LocalFile, open_regular
from metrics_core.writer import METRICS_FILENAME

STALL_FLOOR_S = 60.0
STALL_GAPS = 5.0
END_STATUSES = ("finished", "failed", "interrupted")


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A discovered run: its name relative to the root and its directory."""

    name: str
    directory: Path

    @property
    def metrics_path(self) -> Path:
        return self.directory / METRICS_FILENAME


def _real_root(root: str | os.PathLike[str]) -> Path:
    path = Path(root)
    if not path.is_dir():
        raise RunNotFoundError(f"{path}: the runs root does not exist or is not a directory")
    return path.resolve()


@dataclass(frozen=True, slots=True)
class UnreadableEntry:
    """An entry under the runs root that discovery could not look into, so no run below it is
    listed: its path relative to the root (``.`` for the root itself) and why."""

    name: str
    reason: str  # "symlink loop", "permission denied", "not a directory", or the OS's words

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


@dataclass(frozen=True, slots=True)
class RunListing:
    """What one walk of the runs root found: the runs, and the entries it could not look into,
    each sorted by name."""

    runs: tuple[RunInfo, ...]
    unreadable: tuple[UnreadableEntry, ...]


_REASONS = {errno.ELOOP: "symlink loop", errno.EACCES: "permission denied", errno.EPERM: "permission denied",
            errno.ENOTDIR: "not a directory"}  # fmt: skip


def _reason(exc: OSError) -> str:
    return _REASONS.get(exc.errno) or exc.strerror or type(exc).__name__


def discover_runs(root: str | os.PathLike[str], *, max_depth: int = 6) -> RunListing:
    """Every run under ``root`` and every entry that could not be looked into; see the module
    docstring for the rules.  Raises ``RunNotFoundError`` only when ``root`` itself is no directory.

    Cost: one ``scandir`` per directory, plus one ``stat`` per symlink (to follow it) and one
    ``realpath`` per symlink to a directory; a plain entry costs no system call of its own.
    """
    real_root = _real_root(root)
    runs: list[RunInfo] = []
    unreadable: list[UnreadableEntry] = []
    seen: set[Path] = {real_root}

    def visit(directory: Path, real_directory: Path, relative: tuple[str, ...]) -> None:
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: (entry.is_symlink(), entry.name))
        except FileNotFoundError:
            return  # removed since its parent was listed
        except OSError as exc:
            unreadable.append(UnreadableEntry("/".join(relative) or ".", _reason(exc)))
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            link = entry.is_symlink()  # from the directory listing: no system call
            try:
                if link:
                    entry.stat()  # follows it (kept for is_dir/is_file): a loop or a file on the way raises here
                if entry.name == METRICS_FILENAME:
                    if not link or _inside(Path(entry.path), real_root):  # any type: readers name a FIFO
                        runs.append(RunInfo("/".join(relative) or ".", directory))
                    continue
                if len(relative) >= max_depth or not entry.is_dir():
                    continue
            except FileNotFoundError:
                continue  # a link to nothing, or removed since the listing
            except OSError as exc:
                unreadable.append(UnreadableEntry("/".join((*relative, entry.name)), _reason(exc)))
                continue
            # Only a link can lead elsewhere: anything else is its real parent's real path plus its
            # name, so the walk resolves (an lstat per path component) links alone, not 1,000 runs.
            real = Path(os.path.realpath(entry.path)) if link else real_directory / entry.name
            if real in seen or not real.is_relative_to(real_root):
                continue
            seen.add(real)
            visit(Path(entry.path), real, (*relative, entry.name))

    visit(Path(root), real_root, ())
    return RunListing(tuple(sorted(runs, key=lambda run: run.name)),
                      tuple(sorted(unreadable, key=lambda entry: entry.name)))  # fmt: skip


def find_runs(root: str | os.PathLike[str], *, max_depth: int = 6) -> list[RunInfo]:
    """Every run under ``root``, sorted by name; see the module docstring for the rules.  An entry
    that cannot be looked into is left out: ``discover_runs`` names them."""
    return list(discover_runs(root, max_depth=max_depth).runs)


def _inside(path: Path, real_root: Path) -> bool:
    """Whether ``path`` resolves inside ``real_root``; a symlink loop does not (resolving one raises
    RuntimeError on Python 3.11, OSError on later versions)."""
    try:
        return path.resolve().is_relative_to(real_root)
    except (RuntimeError, OSError):
        return False


def resolve_run(root: str | os.PathLike[str], name: str) -> RunInfo:
    """The run called ``name`` under ``root``, refusing anything that would read outside it."""
    real_root = _real_root(root)
    if not name or "\x00" in name:
        raise RunPathError(f"{name!r}: empty or invalid run name")
    candidate = Path(name)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise RunPathError(f"{name!r}: a run name is a path relative to the runs root, without '..'")
    directory = Path(root) / candidate
    if not _inside(directory, real_root):
        raise RunPathError(f"{name!r}: leads outside the runs root, or nowhere (a symlink escape or loop)")
    if not (directory / METRICS_FILENAME).exists():
        raise RunNotFoundError(f"{name!r}: no run there (no {METRICS_FILENAME} under {directory})")
    if not _inside(directory / METRICS_FILENAME, real_root):
        raise RunPathError(f"{name!r}: its {METRICS_FILENAME} links outside the runs root")
    return RunInfo(candidate.as_posix(), directory)


class StatusSource(Protocol):
    """What ``run_status`` reads of a run: ``RunReader``, ``digest.RunDigest`` and the dashboard
    store's record of a released run all provide it."""

    path: Path  # the run's metrics file (its failure note lies beside it when ``on_disk``)
    on_disk: bool  # a local file: its lock and failure note can be looked at; not so in a bucket

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
    file's identity when that reader last read it (``storage.FileStat``), so a later write shows."""

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

    @classmethod
    def of(cls, source: StatusSource, *, identity: tuple[int, ...] | None) -> StatusRecord:
        return cls(source.path, source.on_disk, identity, source.last_event, source.last_end_status,
                   source.last_end_error, source.last_record_time, source.pending_bytes, source.typical_gap_s(),
                   source.lock_seen)  # fmt: skip

    def typical_gap_s(self) -> float | None:
        return self.gap_s

    def writer_alive(self) -> bool | None:
        """As a reader's: the lock is probed on a descriptor opened for the probe."""
        if not self.on_disk:
            return None
        file = LocalFile(self.path)
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
    or unreadable note is no note, and so is anything but a regular file, never waited on.
    Cost: one small read and a ``stat``, plus a backwards scan of the torn tail when the sizes
    match.  A run not ``on_disk`` (in a bucket) has no note: its path names no local file.
    """
    if not reader.on_disk:
        return None
    try:
        with open(open_regular(reader.path.parent / FAILURE_NOTE_FILENAME), "rb") as file:
            note = parse_note(file.read(NOTE_BYTES))
    except OSError:
        return None
    if note is None:
        return None
    try:
        fd = open_regular(reader.path)
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
    if alive is False and (reader.pending_bytes or reader.lock_seen):
        return "crashed"  # at once, not after the heartbeat: this file's writer held its lock and let go
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
