"""Records to sessions: ``SessionLog``, the running state the session model is computed from.

``SessionLog`` keeps, per session, what its records say (first and last step, time, tokens, the
markers of its ``session_start`` and ``session_end``) as running state that each new record or
block of records extends, and the run-level facts the status rule reads (last event, recent
cadence); it answers with the values of ``sessions`` (``Session``, ``Progress``, ``LostWork``).
``RunReader`` (columns, for the dashboard) and ``RunDigest`` (the terminal tools, no numpy) both
feed it, so both tell the same story.

Which records a later session superseded, and what each resume redid, is the rule of
``metrics_core.read.supersession``: ``SessionLog`` keeps what it reads (each session's first step,
and its first step of each event) and asks it (``thresholds``, ``replayed``).

Assumed: one writer at a time (``MetricsWriter`` enforces it), so a session's records are
contiguous and an earlier session's records never change once a later one has begun.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from itertools import pairwise
from typing import Any

from metrics_core.read.session_model import MARKER_EVENTS, LostWork, Progress, Session, as_datetime
from metrics_core.read.supersession import EventRows, Replay, replay, thresholds

RECENT_TIMES = 64  # the usual gap between records comes from the last few


def int_or_none(value: Any) -> int | None:
    """A marker's ``discarded_bytes`` / ``resumed_from_step`` as an int, or None if it is none."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None


class _SessionAcc:
    """Running aggregates of one session."""

    __slots__ = (
        "discarded_bytes",
        "end_error",
        "end_ns",
        "end_status",
        "first_step",
        "first_tokens",
        "last_skipped",
        "last_step",
        "last_tokens",
        "records",
        "resumed_from_step",
        "session_id",
        "start_ns",
    )

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.records = 0
        self.first_step = self.last_step = 0
        self.first_tokens = self.last_tokens = self.last_skipped = 0
        self.start_ns = self.end_ns = 0
        self.discarded_bytes: int | None = None
        self.resumed_from_step: int | None = None
        self.end_status: str | None = None
        self.end_error: str | None = None


class SessionLog:
    """Sessions of one run as running state; see the module docstring.

    Fed in file order, by records (``add``) or, by a columnar parser, by contiguous runs of one
    session's records (``add_run``, ``note_first_step``, ``note_marker``, ``note_times``).
    """

    def __init__(self) -> None:
        self.records = 0
        self.last_event: str | None = None
        self._sessions: list[_SessionAcc] = []
        self._index: dict[str, int] = {}
        self._first_step_in_event: dict[str, dict[int, int]] = {}
        self._recent_times: deque[int] = deque(maxlen=RECENT_TIMES)
        self._replayed: tuple[tuple[int, int, int], Replay] | None = None
        self._built: tuple[Replay, list[Session], int] | None = None  # ``sessions``: for, built, at records
        self._thresholds: dict[str, tuple[tuple[int, int], list[float]]] = {}  # per event, and its key

    def __len__(self) -> int:
        return len(self._sessions)

    # -- feeding ---------------------------------------------------------------------------

    def session(self, session_id: str) -> int:
        """The index of ``session_id``, a new session's if it was not seen yet."""
        index = self._index.get(session_id)
        if index is None:
            index = self._index[session_id] = len(self._sessions)
            self._sessions.append(_SessionAcc(session_id))
        return index

    def add(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        """Records in file order (``time`` in ns); returns each one's session index."""
        firsts = self._first_step_in_event
        session_id, index, last = None, -1, None
        noted: set[str] = set()  # the events this call saw in session ``index``: their first step is kept
        indices = []
        for row in rows:
            if row["session_id"] != session_id:
                if last is not None:
                    self._ended_at(index, last)
                session_id = row["session_id"]
                index = self.session(session_id)
                acc = self._sessions[index]
                if acc.records == 0:
                    acc.first_step, acc.start_ns, acc.first_tokens = row["step"], row["time"], row["tokens_seen"]
                noted = set()
            last = row
            acc.records += 1
            event = row["event"]
            if event not in noted:
                noted.add(event)
                firsts.setdefault(event, {}).setdefault(index, row["step"])
            if event in MARKER_EVENTS:
                self.note_marker(row)
            indices.append(index)
        if last is not None:  # the last record of the last session: the rest had theirs at the switch
            self._ended_at(index, last)
            self.records += len(rows)
            self.last_event = last["event"]
            self._recent_times.extend([row["time"] for row in rows[-RECENT_TIMES:]])
        return indices

    def _ended_at(self, index: int, row: dict[str, Any]) -> None:
        """Session ``index``'s last record so far is ``row``."""
        acc = self._sessions[index]
        acc.last_step, acc.end_ns = row["step"], row["time"]
        acc.last_tokens, acc.last_skipped = row["tokens_seen"], row["skipped_updates"]

    def add_run(self, index: int, count: int, first: tuple[int, int, int], last: tuple[int, int, int, int]) -> None:
        """``count`` contiguous records of session ``index``: the first's (step, time, tokens_seen),
        the last's (step, time, tokens_seen, skipped_updates)."""
        acc = self._sessions[index]
        if acc.records == 0:
            acc.first_step, acc.start_ns, acc.first_tokens = first
        acc.records += count
        acc.last_step, acc.end_ns, acc.last_tokens, acc.last_skipped = last
        self.records += count

    def note_first_step(self, event: str, index: int, step: int) -> None:
        """Session ``index`` logged ``event`` at ``step`` (kept if it is its first ``event``)."""
        self._first_step_in_event.setdefault(event, {}).setdefault(index, step)

    def note_marker(self, record: Mapping[str, Any]) -> None:
        """Keep what a ``session_start`` / ``session_end`` says about its session."""
        acc = self._sessions[self._index[record["session_id"]]]
        if record["event"] == "session_end":
            status, error = record.get("status"), record.get("error")
            acc.end_status = status if isinstance(status, str) else None
            acc.end_error = error if isinstance(error, str) else None
        elif acc.discarded_bytes is None and acc.resumed_from_step is None:
            acc.discarded_bytes = int_or_none(record.get("discarded_bytes"))
            acc.resumed_from_step = int_or_none(record.get("resumed_from_step"))

    def note_times(self, last_event: str, times: Sequence[int]) -> None:
        """The last event and the times (ns) of the last records of a block fed by ``add_run``."""
        self.last_event = last_event
        self._recent_times.extend(times[-RECENT_TIMES:])

    # -- queries ---------------------------------------------------------------------------

    def session_ids(self) -> list[str]:
        return [acc.session_id for acc in self._sessions]

    def first_steps(self) -> list[int]:
        return [acc.first_step for acc in self._sessions]

    def first_tokens(self) -> list[int]:
        return [acc.first_tokens for acc in self._sessions]

    def thresholds(self, event: str) -> list[float]:
        """Per session, the lowest step of ``event`` records it supersedes in earlier sessions
        (``supersession.thresholds``); kept until a session begins or first logs an event."""
        key = (len(self._sessions), self.thresholds_version)
        found = self._thresholds.get(event)
        if found is None or found[0] != key:
            limits = thresholds(self.first_steps(), self._first_step_in_event.get(event, {}))
            found = self._thresholds[event] = (key, limits)
        return found[1]

    @property
    def thresholds_version(self) -> int:
        """Grows whenever a session's threshold for an event may have moved (its first record of
        that event): with the session count, what a result of the thresholds is kept by."""
        return sum(len(by_session) for by_session in self._first_step_in_event.values())

    def replayed(self, rows: Callable[[], Mapping[str, Mapping[int, EventRows]]]) -> Replay:
        """``replay`` of these sessions over ``rows()``, each event's ``EventRows`` per session.

        Kept until what it depends on changes: the sessions, the records of all but the last
        (the last one's records are nobody's earlier work), and the first step of each event in
        each session (the thresholds); only then is ``rows`` called again.
        """
        last = self._sessions[-1].records if self._sessions else 0
        key = (len(self._sessions), self.records - last, self.thresholds_version)
        if self._replayed is None or self._replayed[0] != key:
            held = rows()
            thresholds = {event: self.thresholds(event) for event in held}
            self._replayed = (key, replay(self.first_steps(), thresholds, held, first_tokens=self.first_tokens()))
        return self._replayed[1]

    @property
    def last_record_time(self) -> datetime | None:
        """Time of the last complete record, or None before any."""
        return as_datetime(self._recent_times[-1]) if self._recent_times else None

    def typical_gap_s(self) -> float | None:
        """Median gap between the last few records (the run's usual logging cadence)."""
        if len(self._recent_times) < 2:
            return None
        return float(statistics.median(b - a for a, b in pairwise(self._recent_times))) / 1e9

    @property
    def last_end_status(self) -> str | None:
        """The ``status`` of the last record when it is a ``session_end``, else None."""
        if self.last_event != "session_end" or not self._sessions:
            return None
        return self._sessions[-1].end_status

    @property
    def last_end_error(self) -> str | None:
        """The ``error`` of the last record when it is a ``session_end`` (the exception, the signal,
        the failing rank), else None."""
        if self.last_event != "session_end" or not self._sessions:
            return None
        return self._sessions[-1].end_error

    def progress(self) -> Progress:
        """Session count, start, last step and tokens, from the running accumulators."""
        if not self._sessions:
            return Progress(0, None, None, None)
        first, last = self._sessions[0], self._sessions[-1]
        return Progress(len(self._sessions), as_datetime(first.start_ns), last.last_step, last.last_tokens)

    def sessions(self, redone: Replay) -> list[Session]:
        """Sessions in order of first appearance, with downtime and ``redone``'s replay accounting.

        Kept: asked again with the same ``redone`` and sessions, only the last one, which an
        append changes, is built again (an earlier one's change is a new ``redone``).
        """
        count, built = len(self._sessions), self._built
        if built is not None and built[0] is redone and len(built[1]) == count:
            result = built[1] if built[2] == self.records else [*built[1][:-1], *self._made(count - 1, redone)]
        else:
            result = self._made(0, redone)
        self._built = (redone, result, self.records)
        return list(result)

    def _made(self, start: int, redone: Replay) -> list[Session]:
        """Sessions ``start`` to the last, in one pass: a run resumed thousands of times makes
        thousands of them on opening."""
        accs = self._sessions
        previous_end = accs[start - 1].end_ns if start else None
        made = []
        for index in range(start, len(accs)):
            acc = accs[index]
            made.append(
                Session(
                    session_id=acc.session_id,
                    index=index,
                    first_step=acc.first_step,
                    last_step=acc.last_step,
                    start_time=as_datetime(acc.start_ns),
                    end_time=as_datetime(acc.end_ns),
                    records=acc.records,
                    first_tokens_seen=acc.first_tokens,
                    last_tokens_seen=acc.last_tokens,
                    skipped_updates=acc.last_skipped,
                    downtime_s=None if previous_end is None else (acc.start_ns - previous_end) / 1e9,
                    steps_replayed=redone.steps[index],
                    tokens_replayed=redone.tokens[index],
                    tokens_replayed_is_upper_bound=redone.tokens_bound[index],
                    records_superseded=redone.records[index],
                    discarded_bytes=acc.discarded_bytes,
                    resumed_from_step=acc.resumed_from_step,
                    end_status=acc.end_status,
                    end_error=acc.end_error,
                )
            )
            previous_end = acc.end_ns
        return made

    def lost_work(self, redone: Replay) -> LostWork:
        """Downtime, replayed work and the training time that produced superseded train windows."""
        sessions = self.sessions(redone)
        return LostWork(
            downtime_s=sum(s.downtime_s or 0.0 for s in sessions),
            steps_replayed=sum(redone.steps),
            tokens_replayed=sum(redone.tokens),
            tokens_replayed_is_upper_bound=any(redone.tokens_bound),
            superseded_time_s=redone.superseded_time_s,
            training_time_s=sum((acc.end_ns - acc.start_ns) / 1e9 for acc in self._sessions),
        )

    # -- persistence (the columnar cache) ------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything this log holds, as JSON values."""
        return {
            "records": self.records,
            "last_event": self.last_event,
            "sessions": [[getattr(acc, name) for name in _SessionAcc.__slots__] for acc in self._sessions],
            "first_steps": [[event, list(firsts.items())] for event, firsts in self._first_step_in_event.items()],
            "recent_times": list(self._recent_times),
        }

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> SessionLog:
        log = cls()
        log.records, log.last_event = int(state["records"]), state["last_event"]
        for values in state["sessions"]:
            acc = _SessionAcc("")
            for name, value in zip(_SessionAcc.__slots__, values, strict=True):
                setattr(acc, name, value)
            log._index[acc.session_id] = len(log._sessions)
            log._sessions.append(acc)
        log._first_step_in_event = {
            event: {int(session): int(step) for session, step in firsts} for event, firsts in state["first_steps"]
        }
        log._recent_times.extend(int(value) for value in state["recent_times"])
        return log


class AccountedSessions:
    """``sessions`` and ``lost_work`` of a reader that feeds a ``SessionLog`` in ``log`` and lists
    each event's rows per session in ``_event_rows``: ``RunReader`` (from its columns) and
    ``RunDigest`` (from its running state) answer them here, so both tell the same story."""

    log: SessionLog

    def _event_rows(self) -> Mapping[str, Mapping[int, EventRows]]:
        """Each event's rows per session, as ``SessionLog.replayed`` reads them (called only when
        the replay accounting is out of date)."""
        raise NotImplementedError

    @property
    def sessions(self) -> list[Session]:
        """Sessions in order of first appearance, with downtime and replay accounting."""
        return self.log.sessions(self.log.replayed(self._event_rows))

    def lost_work(self) -> LostWork:
        """What the run's crashes cost: downtime, replayed work, and the training time that
        produced train windows a later session superseded."""
        return self.log.lost_work(self.log.replayed(self._event_rows))
