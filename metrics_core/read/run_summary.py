"""A run at a glance: the one summary the runs table, the dashboard's store and ``summary`` print.

``summarise`` reads it from any ``SummarySource``: ``RunReader`` answers from the tails of its
columns and ``run_digest.RunDigest`` from its running state, both in O(1) per call, so a summary after
an append costs what reading the append cost.  No numpy or pandas here: the terminal tools use it
on training nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from metrics_core.read.health import IngestHealth
from metrics_core.read.line_follower import LineFollower, Position
from metrics_core.read.records import BadLine
from metrics_core.read.run_file import LocalFile, RunFile
from metrics_core.read.run_status import StatusSource, run_status, stop_reason
from metrics_core.read.session_accounting import SessionLog
from metrics_core.read.session_model import Progress

MAX_BAD_LINE_SAMPLES = 20  # bad lines kept with their line number and reason, for the report


@dataclass(frozen=True, slots=True)
class LastValue:
    """The last finite number logged under a key, and the step of its record."""

    value: float
    step: int


class SummarySource(StatusSource, Protocol):
    """What ``summarise`` reads of a run, beyond what ``run_status`` reads."""

    @property
    def records(self) -> int: ...

    @property
    def bad_lines(self) -> int: ...

    def progress(self) -> Progress: ...

    def last_number(self, event: str, name: str) -> LastValue | None: ...


class FollowedLog:
    """The ``SummarySource`` answers of a reader built on the read layers: a ``SessionLog`` in
    ``log``, the ``LineFollower`` that feeds it in ``_follower``, its ``RunFile`` in ``file``.
    ``RunReader`` and ``run_digest.RunDigest`` both are; each adds ``last_number``, feeds ``log``,
    ``_note_bad`` and ``schema_versions``, and extends ``_clear`` with what it holds besides."""

    log: SessionLog
    file: RunFile
    _follower: LineFollower
    bad_lines: int
    bad_line_samples: list[BadLine]
    schema_versions: dict[int, int]
    lock_seen: bool = False  # set by ``writer_alive`` the first time it finds the lock held

    def _clear(self) -> None:
        """Forget what was read: a new reader, or a file read again from the start."""
        self.log = SessionLog()
        self.bad_lines = 0
        self.bad_line_samples = []
        self.schema_versions = {}

    @property
    def records(self) -> int:
        return self.log.records

    @property
    def last_event(self) -> str | None:
        return self.log.last_event

    @property
    def last_end_status(self) -> str | None:
        """The ``status`` of the last record when it is a ``session_end``, else None."""
        return self.log.last_end_status

    @property
    def last_end_error(self) -> str | None:
        """The ``error`` of the last record when it is a ``session_end``, else None."""
        return self.log.last_end_error

    @property
    def last_record_time(self) -> datetime | None:
        """Time of the last complete record, or None before any."""
        return self.log.last_record_time

    def typical_gap_s(self) -> float | None:
        """Median gap between the last few records (the run's usual logging cadence)."""
        return self.log.typical_gap_s()

    def progress(self) -> Progress:
        """Session count, start, last step and tokens, in O(1)."""
        return self.log.progress()

    def position(self) -> Position:
        """Where the reader stands in its file, with the fingerprints it checks the file against
        (``line_follower.Position``): what a copy of its results kept elsewhere is checked with."""
        return self._follower.position()

    @property
    def pending_bytes(self) -> int:
        """Bytes after the last ``\\n``: a record being written, or a crash's torn tail."""
        return self._follower.pending_bytes

    @property
    def resets(self) -> int:
        """How many times the file was read again from the start (it shrank, or was replaced or
        rewritten); ``reset_reasons`` says why, each time."""
        return len(self._follower.restarts)

    @property
    def reset_reasons(self) -> list[str]:
        return self._follower.restarts

    def ingest_health(self) -> IngestHealth:
        """A snapshot of what reading the file ran into so far."""
        return IngestHealth(
            self.bad_lines,
            tuple(self.bad_line_samples),
            self.pending_bytes,
            dict(self.schema_versions),
            self.resets,
            tuple(self.reset_reasons),
        )

    def _note_bad(self, bad: list[BadLine]) -> None:
        """Count lines skipped as no record, keeping the first ``MAX_BAD_LINE_SAMPLES``."""
        self.bad_lines += len(bad)
        room = MAX_BAD_LINE_SAMPLES - len(self.bad_line_samples)
        self.bad_line_samples.extend(bad[: max(room, 0)])

    @property
    def on_disk(self) -> bool:
        """Whether the run's bytes are a file on this machine's disk, with the writer's lock and
        failure note beside it (a bucket's objects have neither)."""
        return isinstance(self.file, LocalFile)

    @property
    def within(self) -> Path | None:
        """The directory every file of the run read must lie inside (``LocalFile``), or None."""
        return self.file.within if isinstance(self.file, LocalFile) else None

    def writer_alive(self) -> bool | None:
        """Whether a MetricsWriter holds the file's lock now (None: cannot tell).  Once it has
        been found held, ``lock_seen``: locks work where this file lives, so a free lock later
        means its writer is gone."""
        alive = self.file.writer_alive()
        if alive:
            self.lock_seen = True
        return alive


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What a run is at one read: its status, where it stands, its last losses and health counts.

    ``config`` and ``loss_trend`` are the dashboard's additions (its flattened config and a
    sparkline of the effective train loss); ``summarise`` leaves them empty.
    """

    status: str
    records: int
    sessions: int
    started: datetime | None  # the first session's first record
    last_record_time: datetime | None
    last_step: int | None
    tokens_seen: int | None
    skipped_updates: int | None  # of the last train record
    train_loss: LastValue | None
    val_loss: LastValue | None
    bad_lines: int
    pending_bytes: int
    reason: str | None = None  # why it stopped (``run_status.stop_reason``)
    config: dict[str, str] | None = None
    loss_trend: Sequence[float] = ()  # the dashboard's: an array of doubles (``dashboard.store.rows.LossTrend``)


def summarise(source: SummarySource, *, now: datetime) -> RunSummary:
    """The summary of ``source`` as read so far, its status as of ``now``."""
    progress = source.progress()
    skipped = source.last_number("train", "skipped_updates")
    status = run_status(source, now=now)
    return RunSummary(
        status=status,
        reason=stop_reason(source, status),
        records=source.records,
        sessions=progress.sessions,
        started=progress.started,
        last_record_time=source.last_record_time,
        last_step=progress.last_step,
        tokens_seen=progress.tokens_seen,
        skipped_updates=None if skipped is None else int(skipped.value),
        train_loss=source.last_number("train", "train_loss"),
        val_loss=source.last_number("validation", "val_loss"),
        bad_lines=source.bad_lines,
        pending_bytes=source.pending_bytes,
    )
