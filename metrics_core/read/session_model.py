"""The one session model of the read side: what a session is, as every reader hands it out.

A *session* is one process lifetime writing a run: one ``session_id``, opened by a
``session_start`` record and closed by a ``session_end`` (``MARKER_EVENTS``).  ``Session`` is one
session with what its resume cost, ``Progress`` where the run stands, ``LostWork`` what its
crashes cost over all sessions: frozen values that ``RunReader`` (the dashboard, notebooks) and
``RunDigest`` (the terminal tools, no numpy) hand out alike, and that figures, checks and pages
read.  Beside them, the two record-value rules every reader shares: a record's time as a
datetime (``as_datetime``) and what counts as a number (``number``).

How records become these values is decided in ``session_accounting`` (the running state per
session) and ``supersession`` (which records a later session redid, and what each resume cost),
and nowhere else; this module holds the values only, so that what reads sessions does not import
the accounting.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MARKER_EVENTS = ("session_start", "session_end")
# what ``session_accounting.SessionLog.note_marker`` reads of a marker: a parser hands it no more
MARKER_FIELDS = ("session_id", "event", "status", "error", "discarded_bytes", "resumed_from_step")


def session_name(index: int) -> str:
    """The name of a run's session ``index`` (from 0) on every page and in the terminal tools: S1,
    S2… in file order (an id is long and says nothing of the order)."""
    return f"S{index + 1}"


def as_datetime(time_ns: int) -> datetime:
    """A record's time (int ns since the epoch, as the parsers give it) as a UTC datetime (µs)."""
    return EPOCH + timedelta(0, 0, time_ns // 1000)  # (days, seconds, microseconds): positional is cheaper


def number(value: Any) -> float | None:
    """``value`` as a float when the reader's numeric columns would hold it as a number, else None
    (booleans and strings are not numbers: ``Column.numbers`` gives NaN for them)."""
    if type(value) is float:
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return None
    return None


@dataclass(frozen=True, slots=True)
class Session:
    """One process lifetime writing the run, with what its resume cost.

    ``steps_replayed`` / ``tokens_replayed`` / ``records_superseded`` describe the earlier
    sessions' records this session made obsolete by resuming from an older step (work redone);
    ``tokens_replayed`` is exact unless ``tokens_replayed_is_upper_bound`` (``supersession``).
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
    tokens_replayed_is_upper_bound: bool
    records_superseded: int
    discarded_bytes: int | None
    resumed_from_step: int | None
    end_status: str | None
    end_error: str | None  # its session_end's ``error``: "ValueError: …", "SIGTERM", "rank 2: …"

    @property
    def name(self) -> str:
        """What every page and terminal tool calls it (``session_name``)."""
        return session_name(self.index)

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
class LostWork:
    """What the run's crashes cost, over all sessions."""

    downtime_s: float
    steps_replayed: int
    tokens_replayed: int
    tokens_replayed_is_upper_bound: bool  # some resume fell inside a window the records cannot split
    superseded_time_s: float  # training time that produced train windows a later session redid
    training_time_s: float

    @property
    def superseded_share(self) -> float | None:
        """Share of training time spent producing train windows a later session redid."""
        return self.superseded_time_s / self.training_time_s if self.training_time_s > 0 else None
