"""Supersession: the run as if it had never crashed.  The rule, and every use of it.

The rule (docs/FORMAT.md): a session whose first record is at step S supersedes earlier
sessions' records of an event with step > S, and those at exactly S when it logged that event at
S itself: its *threshold* for the event is S, or S + 1 when it did not (``thresholds``).  A
superseded record is *redone by* exactly one session: the first later one whose threshold is at
or below the record's step.  Superseded records are kept and shown (each session as its own
segment); the effective history leaves them out.

This module is the only place the rule is written; the readers, the store's snapshots, the
figures, the diagnostics and the SQL export all ask it:

* ``thresholds``: each session's threshold for one event (``SessionLog.thresholds`` keeps them).
* ``redone_ranges``: which later session redid which rows of each earlier session, as row ranges.
* ``redone_by``: per row of an event, the session that redid it (-1: none); ``superseded`` is
  ``redone_by >= 0``, ``RunReader.redone_by`` and the snapshots hold it.  ``redone_by_ranges``
  hands over its ranges too, which ``rows_by_session`` keeps for ``replay``: the reader sweeps
  the sessions once per event.
* ``replay``: what each resume cost (steps, tokens, records), and the training time that produced
  superseded train windows, from each session's ``EventRows`` (``rows_by_session`` makes them of
  the reader's columns; ``RunDigest`` keeps its own).
* ``redo_windows``: each resume's replay window, the earlier rows it redid against its own redo
  of the same steps, for the replay findings and the shaded ranges of the charts.
* ``only_appended_to_last``: the incremental check: rows appended to the last session change no
  decision about the rows before them.

Cost: the later sessions that can redo an earlier session's records are those whose threshold
is below every threshold between (their thresholds fall strictly); one sweep from the last session
to the first keeps them on a stack, so each session is pushed and popped once and each row (on
ordered steps, each range of rows) is placed by a bisection: O(sessions + rows × log sessions),
never per pair of sessions.  The functions that build per-row arrays import numpy when called;
the rest is plain Python for the terminal tools.

A train window logged at step W covers the updates since the previous train record, so a resume
step S inside it (previous < S < W) splits it: only its tokens after S were redone.  They are
counted exactly from ``tokens_seen``: the resumed session's first record holds the counter at S,
restored from the checkpoint, and the window's own record holds it at W.  When the resumed
counter does not lie within the window's (a trainer that does not restore ``tokens_seen``), the
records do not say where S fell, and the whole window is counted: the figure is then an upper
bound, and says so (``tokens_replayed_is_upper_bound``).

Assumed: one writer at a time (``MetricsWriter`` enforces it), so a session's records are
contiguous and an earlier session's records never change once a later one has begun.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np


def thresholds(first_steps: Sequence[int], first_steps_of_event: Mapping[int, int]) -> list[float]:
    """Per session, the lowest step of an event's records in earlier sessions that it superseded:
    its first step, or the next one when its first record of that event (``first_steps_of_event``,
    by session index; absent: it logged none) is not at its first step."""
    return [float(step + (first_steps_of_event.get(index) != step)) for index, step in enumerate(first_steps)]


class EventRows(NamedTuple):
    """What ``replay`` needs of one event's records of one session, in file order: items
    ``first:end`` of the sequences (all of them by default), which may hold other sessions' rows
    around them, so that one event's rows are not copied per session.

    ``tokens`` / ``window_s`` (train only): each window's tokens and the wall time since the
    session's previous train record (0 for its first; a missing value counts 0); ``tokens_seen``
    (train only) each record's counter.  Any sequence type: ``array`` for the terminal tools,
    lists for the reader.  ``ordered``: steps never go down, so the rows a later session redid are
    ranges, found by bisection.  A tuple: one is made per session and event, cheaply.
    """

    steps: Sequence[int]
    ordered: bool
    tokens: Sequence[float] | None = None
    window_s: Sequence[float] | None = None
    tokens_seen: Sequence[int] | None = None
    first: int = 0
    end: int | None = None  # None: to the end of the sequences

    @property
    def stop(self) -> int:
        """The index after the session's last row."""
        return len(self.steps) if self.end is None else self.end


Range = tuple[int, int, int, int]  # (session, redoer, start, stop): ``redone_ranges``


def _later(thresholds: Sequence[float]) -> Iterator[tuple[int, list[float], list[int], int]]:
    """For each session, from the last to the first: ``(index, limits, ids, top)``, where
    ``ids[:top]`` are the later sessions that can redo its records (each one's threshold below
    every threshold between), farthest first, and ``limits[:top]`` their thresholds, rising.

    The lists are this sweep's stack, changed after the next step: read them before it.
    """
    count = len(thresholds)
    limits, ids, top = [0.0] * count, [0] * count, 0
    for index in range(count - 1, -1, -1):
        yield index, limits, ids, top
        limit = thresholds[index]
        top = bisect_left(limits, limit, 0, top)  # those at or above it can no longer be first
        limits[top], ids[top] = limit, index
        top += 1


def _shares(held: EventRows, limits: list[float], ids: list[int], top: int) -> Iterator[tuple[int, int, int]]:
    """``(redoer, start, stop)``: the rows of ``held`` each session of the stack redid.  A row's
    redoer is the nearest one whose threshold is at or below its step: the last limit <= step."""
    if not top:
        return
    steps, end = held.steps, held.stop
    if not held.ordered:
        for row in range(held.first, end):
            position = bisect_right(limits, steps[row], 0, top) - 1
            if position >= 0:
                yield ids[position], row, row + 1
        return
    start = bisect_left(steps, limits[0], held.first, end)
    while start < end:  # one bisection per range: a range per redoer, never per row
        position = bisect_right(limits, steps[start], 0, top) - 1
        stop = end if position + 1 == top else bisect_left(steps, limits[position + 1], start, end)
        yield ids[position], start, stop
        start = stop


def redone_ranges(thresholds: Sequence[float], rows: Mapping[int, EventRows]) -> Iterator[Range]:
    """``(session, redoer, start, stop)``: items ``start:stop`` of ``rows[session]``'s sequences
    (one event's rows per session; ``EventRows.first`` to ``stop``) were redone by session
    ``redoer``.  O(sessions + ranges × log sessions); O(ranges) when ``rows`` holds them already
    (``rows_by_session``'s ``ranges``)."""
    if isinstance(rows, _SessionRows) and rows.ranges is not None:
        yield from rows.ranges
        return
    for index, limits, ids, top in _later(thresholds):
        held = rows.get(index) if top else None
        if held is not None:
            for redoer, start, stop in _shares(held, limits, ids, top):
                yield index, redoer, start, stop


@dataclass(frozen=True, slots=True)
class Replay:
    """Per session: earlier work it redid (steps, tokens, records); and the training time of all
    superseded train windows."""

    steps: list[int]
    tokens: list[int]
    tokens_bound: list[bool]  # per session: its tokens are an upper bound (module docstring)
    records: list[int]
    superseded_time_s: float


def replay(
    first_steps: Sequence[int],
    thresholds: Mapping[str, Sequence[float]],
    rows: Mapping[str, Mapping[int, EventRows]],
    *,
    first_tokens: Sequence[int],
) -> Replay:
    """What each session's resume redid, from every earlier session's ``EventRows`` per event.

    ``first_tokens``: each session's ``tokens_seen`` at its first record, where it resumed.
    O(sessions × events + ranges × log sessions), plus a bisection per row on unordered steps.
    """
    count = len(first_steps)
    frontier = list(first_steps)
    tokens = [0.0] * count
    bound = [False] * count
    records = [0] * count
    wasted = 0.0
    for event, by_session in rows.items():
        for index, redoer, start, stop in redone_ranges(thresholds[event], by_session):
            held = by_session[index]
            records[redoer] += stop - start
            frontier[redoer] = max(frontier[redoer], int(held.steps[stop - 1]))  # the range's highest step
            if held.tokens is not None:
                before = _before_resume(held, start, first_steps[index], first_steps[redoer], first_tokens[redoer])
                bound[redoer] = bound[redoer] or before is None
                # fsum: exact, so the reader's numpy rows and the terminal tools' arrays agree
                tokens[redoer] += math.fsum(held.tokens[start:stop]) - (before or 0.0)
                wasted += math.fsum(held.window_s[start:stop])
    return Replay(
        steps=[frontier[index] - first_steps[index] for index in range(count)],
        tokens=[int(total) if math.isfinite(total) else 0 for total in tokens],  # a garbage count is not work
        tokens_bound=bound,
        records=records,
        superseded_time_s=wasted,
    )


def _before_resume(held: EventRows, row: int, session_step: int, resume_step: int, resume_tokens: int) -> float | None:
    """Tokens of train window ``row`` that came before the resume step, so were not redone.

    0 unless the window straddles the step (it starts after the previous train record, or the
    session's first record); None when it does and the resumed counter does not lie within the
    window's, so the records cannot tell how many (module docstring).  Only a range's first row
    can straddle: every later one starts where the one before it ended.
    """
    window_start = int(held.steps[row - 1]) if row > held.first else session_step
    if not window_start < resume_step < int(held.steps[row]):
        return 0.0
    end = float(held.tokens_seen[row])
    start = end - float(held.tokens[row])
    return resume_tokens - start if start <= resume_tokens <= end else None


# -- per row (numpy, imported when called) --------------------------------------------------------


def grouped_rows(
    sessions: np.ndarray, steps: np.ndarray, count: int
) -> tuple[np.ndarray | None, list[int], np.ndarray]:
    """``(order, bounds, ordered)`` of one event's rows: ``order`` sorts them by session (None when
    they already are, as one writer at a time leaves them), the sorted rows of session i are
    ``bounds[i]:bounds[i + 1]``, and ``ordered[i]`` says their steps never go down.  O(rows),
    vectorised; no work per session."""
    import numpy as np

    order = None
    if len(sessions) > 1 and (np.diff(sessions) < 0).any():
        order = np.argsort(sessions, kind="stable")  # a second writer interleaved sessions
        sessions, steps = sessions[order], steps[order]
    starts = np.searchsorted(sessions, np.arange(count + 1))
    falls = np.flatnonzero(np.diff(steps) < 0)  # a fall between rows r and r + 1 is at r
    inside = np.searchsorted(falls, np.maximum(starts[1:] - 1, starts[:-1])) - np.searchsorted(falls, starts[:-1])
    return order, starts.tolist(), inside == 0


def rows_by_session(
    sessions: np.ndarray,
    steps: np.ndarray,
    count: int,
    *,
    thresholds: Sequence[float],
    train: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ranges: list[Range] | None = None,
) -> Mapping[int, EventRows]:
    """One event's ``EventRows`` of each session a later one may have redone (its highest step at
    or above a later session's ``thresholds``), from its rows' session indices and steps, and for
    train ``(tokens, times in ns, tokens_seen)``.  O(rows) vectorised; each ``EventRows`` is made
    when asked for (``_SessionRows``).  ``ranges``: ``redone_by_ranges``' of the same rows and
    thresholds, kept by the caller, so that ``redone_ranges`` of these rows is not worked out again."""
    rows = _by_session(sessions, steps, count, thresholds, train)[2]
    rows.ranges = ranges
    return rows


class _SessionRows(Mapping[int, EventRows]):
    """One event's ``EventRows`` per session, over lists that all of them share, each made when
    asked for and dropped after use: a run of thousands of sessions keeps no object per session
    and event (the collector's passes over them cost as much as making them)."""

    __slots__ = ("_bounds", "_ordered", "_reachable", "_steps", "_train", "ranges")

    def __init__(
        self,
        reachable: list[bool],
        bounds: list[int],
        steps: list[int],
        ordered: list[bool],
        train: tuple[list[float], list[float], list[int]] | tuple[None, None, None],
    ) -> None:
        self._reachable, self._bounds, self._steps, self._ordered, self._train = (
            reachable,
            bounds,
            steps,
            ordered,
            train,
        )
        self.ranges: list[Range] | None = None  # ``redone_ranges`` of these rows, when known

    def get(self, index: int, default: EventRows | None = None) -> EventRows | None:  # type: ignore[override]
        if not (0 <= index < len(self._reachable) and self._reachable[index]):
            return default
        bounds = self._bounds
        return EventRows(self._steps, self._ordered[index], *self._train, bounds[index], bounds[index + 1])

    def __getitem__(self, index: int) -> EventRows:
        found = self.get(index)
        if found is None:
            raise KeyError(index)
        return found

    def __iter__(self) -> Iterator[int]:
        return (index for index, reachable in enumerate(self._reachable) if reachable)

    def __len__(self) -> int:
        return sum(self._reachable)


def _by_session(
    sessions: np.ndarray,
    steps: np.ndarray,
    count: int,
    thresholds: Sequence[float],
    train: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
) -> tuple[np.ndarray | None, list[int], _SessionRows]:
    """``rows_by_session``, with ``grouped_rows``' order and bounds."""
    import numpy as np

    highest = np.full(count, -np.inf)
    np.maximum.at(highest, sessions, steps)
    lowest_later = np.append(np.minimum.accumulate(np.asarray(thresholds, dtype=np.float64)[::-1])[::-1][1:], np.inf)
    reachable = (highest >= lowest_later).tolist()
    order, bounds, ordered = grouped_rows(sessions, steps, count)
    if order is not None:
        steps = steps[order]
        train = None if train is None else tuple(values[order] for values in train)
    lists: tuple[list[float], list[float], list[int]] | tuple[None, None, None] = (None, None, None)
    if train is not None:
        tokens, times, seen = train
        tokens = np.where(np.isnan(tokens), 0.0, tokens)
        window = np.zeros(len(steps))
        window[1:] = np.diff(times) / 1e9
        starts = np.asarray(bounds[:-1])
        window[starts[starts < len(steps)]] = 0.0  # a session's first window
        lists = (tokens.tolist(), window.tolist(), seen.tolist())
    # lists: bisections and sums make no numpy scalars
    return order, bounds, _SessionRows(reachable, bounds, steps.tolist(), ordered.tolist(), lists)


def redone_by(thresholds: Sequence[float], sessions: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Per row of one event (its session's index, its step), the index of the session that redid
    it, -1 where none did; read-only.  O(rows + sessions + ranges × log sessions)."""
    return redone_by_ranges(thresholds, sessions, steps)[0]


def redone_by_ranges(
    thresholds: Sequence[float], sessions: np.ndarray, steps: np.ndarray
) -> tuple[np.ndarray, list[Range]]:
    """``redone_by``, and the ``redone_ranges`` it was made of, for ``rows_by_session`` of the
    same rows and thresholds to reuse: the sweep over the sessions is made once per event."""
    import numpy as np

    count = len(thresholds)
    result = np.full(len(steps), -1, dtype=np.int32)
    ranges: list[Range] = []
    if count >= 2 and len(steps):
        order, _, rows = _by_session(sessions, steps, count, thresholds, None)
        ranges = list(redone_ranges(thresholds, rows))
        for _, redoer, start, stop in ranges:
            result[start:stop] = redoer  # rows in session order: ``order`` puts them back
        if order is not None:
            result[order] = result.copy()
    result.flags.writeable = False
    return result, ranges


def redo_windows(
    redone: np.ndarray, sessions: np.ndarray, steps: np.ndarray, first_steps: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Each resume's replay window: ``(last, redo)``.

    ``last[j]``: the highest step of the earlier rows session j redid (-1: it redid none); its
    window runs from its first step to there.  ``redo``: per row, the session whose window holds
    it as the redo, its own row at a step of its window (-1: none).  The earlier side of session
    j's window is ``redone == j``.  O(rows + sessions), vectorised.
    """
    import numpy as np

    count = len(first_steps)
    last = np.full(count, -1, dtype=np.int64)
    if not len(redone):
        return last, np.full(0, -1, dtype=np.int32)
    earlier = redone >= 0
    np.maximum.at(last, redone[earlier], steps[earlier])
    mine = np.where(sessions >= 0, last[sessions], -1)  # -1: a row of no known session
    inside = (mine >= 0) & (steps >= np.asarray(first_steps, dtype=np.int64)[sessions]) & (steps <= mine)
    return last, np.where(inside, sessions, -1).astype(np.int32)


# -- the incremental check -------------------------------------------------------------------------


def only_appended_to_last(appended: Iterable[str | None], last: str) -> bool:
    """Whether rows of sessions ``appended`` (the sessions of an event's rows from its last
    previously seen row on; None: a row without one) leave every decision about the earlier rows
    as it was, so a caller may extend its masks with "not superseded" instead of recomputing them.

    So when they all belong to ``last``, the run's last session, that had already logged the event:
    a threshold moves only when a session begins or first logs an event, and no session follows
    the new rows.  The caller checks that no session began and that the reader did not reset.
    """
    found = False
    for session in appended:
        if session != last:
            return False
        found = True
    return found
