"""Loss-sanity diagnostics of a run, incremental, so that a live page can check every append.

The checks themselves, over a whole train frame, are ``metrics_core.analysis.loss_checks`` (their module
docstring lists them) and ``health.ingest_findings``.  ``diagnose`` returns ``Findings``: the
findings and the running aggregates behind them (``Running``: per check and session the first
and last flagged step and a count; each session's last row, for the checks comparing a window
with the one before; each session's open straggler streak; sorted values for the medians).
Given the findings of an earlier snapshot of the same run (``since``; the new train frame must
start with its rows, i.e. no reader reset in between), only the new rows are checked: O(new
rows), plus a memmove per sorted array to insert the new values.  Two exceptions recompute one
part over every row: a median that moved far enough to change the verdict on an old row (a
value on the edge of the tokens-per-update band), and the redo of a replay window while it
grows.  A new session, a column that appears, a column that is not plain int64/float64, or a new
row that a later session replaced: everything from scratch.  ``loss_checks.diagnose_from_scratch``
is the definition: the incremental path is tested equal to it after random appends, and it runs
on whatever data the incremental path does not take.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

import numpy as np
import pandas as pd

from metrics_core.analysis.derived import ReplayWindow, loss_columns, replay_windows, weighted_mean
from metrics_core.analysis.loss_checks import (
    ADVANCE_CHECKS,
    ADVANCES,
    CHECKED_FIELDS,
    COUNTS,
    INCREASING,
    INCREASING_CHECKS,
    NO_UPDATE,
    STRAGGLER_COLUMNS,
    STRAGGLER_WINDOWS,
    TOKENS_FAR_OFF,
    TOKENS_PER_UPDATE,
    batch_change,
    diagnose_from_scratch,
    far_off,
    loss_jump,
    slowness,
    straggler_finding,
    tokens_per_attempt,
    tokens_what,
    with_ingest,
)
from metrics_core.read.health import ACCOUNTING, MISSING_LOSS, Finding, IngestHealth, session_finding
from metrics_core.read.run_reader import RunReader
from metrics_core.read.session_model import Session


class Findings(list):
    """A run's findings (a ``list[Finding]``) and the running aggregates they came from
    (``running``; None when the pandas checks ran), which ``diagnose(since=...)`` extends."""

    def __init__(self, findings: list[Finding], running: Running | None) -> None:
        super().__init__(findings)
        self.running = running


def diagnose(
    *,
    train: pd.DataFrame,
    sessions: Sequence[Session],
    redone: np.ndarray,
    ingest: IngestHealth,
    since: list[Finding] | None = None,
) -> Findings:
    """Every finding for a run, or one ``ok`` finding saying what a clean run passed.

    ``since``: what this returned for an earlier snapshot of the same run whose train rows
    ``train`` starts with (no reader reset in between): then only the new rows are checked
    (module docstring); anything else is checked from scratch.
    """
    previous = getattr(since, "running", None)
    running = previous.extended(train, sessions, redone) if previous is not None else None
    if running is None:
        running = Running.start(train, sessions, redone)
    if running is None:
        return Findings(diagnose_from_scratch(train=train, sessions=sessions, redone=redone, ingest=ingest), None)
    return Findings(with_ingest(running.findings(sessions), train, sessions, ingest), running)


# -- incremental ---------------------------------------------------------------------------------

_NUMERIC = CHECKED_FIELDS - {"session_id", "time"}
_NAT = np.iinfo(np.int64).min
_EMPTY = np.zeros(0)


def _eligible(train: pd.DataFrame) -> frozenset[str] | None:
    """The checked columns ``train`` has when each is plain int64/float64 (``time`` a datetime,
    ``session_id`` categorical), so numpy on them is pandas' own arithmetic; else None."""
    dtypes = dict(zip(train.columns, train.dtypes, strict=True))  # one pass: a column lookup per check costs more
    present = frozenset(column for column in (*_NUMERIC, "time", "session_id") if column in dtypes)
    if not {"step", "time", "session_id"} <= present or not isinstance(dtypes["session_id"], pd.CategoricalDtype):
        return None
    if dtypes["time"].kind != "M":
        return None
    if any(per_window in present and cumulative not in present for cumulative, per_window in ADVANCES):
        return None  # the pandas checks fail on it, and say so
    for column in present & _NUMERIC:
        dtype = dtypes[column]
        if not isinstance(dtype, np.dtype) or dtype.kind not in "if" or dtype.itemsize != 8:
            return None
    return present


def _merged(values: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Sorted ``values`` with ``new`` inserted, as a new array (an earlier snapshot's may hold the old)."""
    if not len(new):
        return values
    new = np.sort(new)
    return np.insert(values, np.searchsorted(values, new), new)


def _median(values: np.ndarray) -> float | None:
    """np.median of sorted ``values`` in O(1) (the same two middle values, averaged the same way)."""
    if not len(values):
        return None
    middle = len(values) // 2
    return float(values[middle]) if len(values) % 2 else float(np.median(values[middle - 1 : middle + 1]))


def _outside(values: np.ndarray, median: float) -> tuple[int, int]:
    """How many of sorted ``values`` lie below and above the tokens-per-update band: O(log n)."""
    below = bisect.bisect_left(values, True, key=lambda value: not value / median < 1 / TOKENS_FAR_OFF)
    above = len(values) - bisect.bisect_left(values, True, key=lambda value: value / median > TOKENS_FAR_OFF)
    return below, above


def _tally(
    counts: dict[str, tuple[int, int, int]],
    bad: np.ndarray,
    codes: np.ndarray,
    categories: np.ndarray,
    steps: np.ndarray,
) -> dict[str, tuple[int, int, int]]:
    """``counts`` (session -> first and last flagged step, windows) with the rows flagged in ``bad``,
    each row's session ``categories[codes[row]]`` (integers compared, not names: a run's every row
    may be flagged); new sessions in the order of their first flagged row, as ``per_session`` lists them."""
    rows = np.flatnonzero(bad)
    if not len(rows):
        return counts
    counts = dict(counts)
    flagged_codes = codes[rows]
    flagged, at = np.unique(flagged_codes, return_index=True)
    for code in flagged[np.argsort(at)]:
        session = str(categories[code])
        steps_of = steps[rows[flagged_codes == code]]
        first, last, windows = counts.get(session, (int(steps_of[0]), int(steps_of[0]), 0))
        counts[session] = (min(first, int(steps_of.min())), max(last, int(steps_of.max())), windows + len(steps_of))
    return counts


@dataclass(frozen=True)
class _Replay:
    """One session's replay window: the earlier sessions' part, fixed when it starts; its redo grows."""

    last_step: int
    earlier_records: int
    earlier_loss: float | None
    redo_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    redo_loss: float | None = None


@dataclass(frozen=True)
class Running:
    """What the checks found in the first ``rows`` train windows of a run, kept to be extended.

    Never changed: ``extended`` returns a new one sharing what did not change.
    """

    rows: int
    columns: frozenset[str]
    session_ids: tuple[str, ...]
    seen: tuple[str, ...] = ()  # sessions in the order of their first window
    last: dict[str, dict[str, float]] = field(default_factory=dict)  # per session: its last window's values
    flagged: dict[str, dict[str, tuple[int, int, int]]] = field(default_factory=dict)  # check -> ``_tally`` counts
    per_update: np.ndarray = field(default_factory=lambda: _EMPTY)  # judged tokens per attempted update, sorted
    band: tuple[float, int, int] | None = None  # median, and how many of ``per_update`` lie below / above
    per_step: dict[str, np.ndarray] = field(default_factory=dict)  # per session: tokens per update, sorted
    streaks: dict[str, tuple[float, int, int, np.ndarray] | None] = field(default_factory=dict)
    stragglers: dict[str, dict[int, tuple[int, int, int, np.ndarray]]] = field(default_factory=dict)
    replays: dict[int, _Replay] = field(default_factory=dict)

    @classmethod
    def start(cls, train: pd.DataFrame, sessions: Sequence[Session], redone: np.ndarray) -> Running | None:
        """The checks over all of ``train``, or None when its columns need the pandas checks."""
        columns = _eligible(train)
        if columns is None:
            return None
        replays = {
            window.session: _Replay(window.last_step, window.earlier_records, window.earlier_loss)
            for window in replay_windows(train, sessions, redone)
        }
        empty = cls(0, columns, tuple(session.session_id for session in sessions), replays=replays)
        return empty._grown(train, sessions)

    def extended(self, train: pd.DataFrame, sessions: Sequence[Session], redone: np.ndarray) -> Running | None:
        """The checks over ``train``, whose first ``rows`` windows are the ones seen; None when only
        a start from scratch will do (a new session or column, a new window another session replaced)."""
        if (
            len(train) < self.rows
            or tuple(session.session_id for session in sessions) != self.session_ids
            or _eligible(train) != self.columns
        ):
            return None
        if (redone[self.rows :] >= 0).any():
            return None
        seen = redone[: self.rows]  # O(rows), in numpy: each window's earlier part still holds
        counts = np.bincount(seen[seen >= 0], minlength=len(sessions))
        if {index: int(counts[index]) for index in np.flatnonzero(counts).tolist()} != {
            index: replay.earlier_records for index, replay in self.replays.items()
        }:
            return None
        return self if len(train) == self.rows else self._grown(train, sessions)

    def _grown(self, train: pd.DataFrame, sessions: Sequence[Session]) -> Running | None:
        batch = train.iloc[self.rows :]
        codes = batch["session_id"].cat.codes.to_numpy()
        if (codes < 0).any():
            return None  # a window without a session: groupby leaves it out, the pandas checks know how
        categories = np.asarray(batch["session_id"].cat.categories, dtype=object)
        steps = batch["step"].to_numpy()
        column = {name: batch[name].to_numpy() for name in self.columns & _NUMERIC}
        times = batch["time"].to_numpy(dtype=batch["time"].dtype.base).view(np.int64)  # NaT: the int64 minimum
        order, at = np.unique(codes, return_index=True)
        groups = [(str(categories[order[k]]), np.flatnonzero(codes == order[k])) for k in np.argsort(at)]
        seen = dict.fromkeys(self.seen)
        last = dict(self.last)
        flagged = dict(self.flagged)

        def tally(check: str, bad: np.ndarray) -> None:
            flagged[check] = _tally(flagged.get(check, {}), bad, codes, categories, steps)

        if set(COUNTS) <= self.columns:
            attempted, updates, skipped = (column[name] for name in COUNTS)
            tally(
                ACCOUNTING[0], _known(attempted) & _known(updates) & _known(skipped) & (attempted != updates + skipped)
            )
        # Each window against the one before it in its session (pandas' groupby diff, in float64).
        advance = {name: np.full(len(batch), np.nan) for name, _ in ADVANCES}
        went_back = np.zeros(len(batch), dtype=bool)
        first_window = np.zeros(len(batch), dtype=bool)
        for session, rows in groups:
            before = last.get(session, {})
            for name, _ in ADVANCES:
                if name in column:
                    values = column[name][rows].astype(np.float64)
                    advance[name][rows] = values - np.concatenate([[before.get(name, np.nan)], values[:-1]])
            moments = times[rows]
            previous = np.concatenate([[before.get("time", _NAT)], moments[:-1]])
            went_back[rows] = (moments != _NAT) & (previous != _NAT) & (moments < previous)
            last[session] = {name: float(column[name][rows[-1]]) for name, _ in ADVANCES if name in column}
            last[session]["time"] = int(moments[-1])
            if session not in seen:
                first_window[rows[0]] = True
                seen[session] = None
        for name, per_window in ADVANCES:
            if per_window in self.columns:
                tally(ADVANCE_CHECKS[name][0], ~np.isnan(advance[name]) & (advance[name] != column[per_window]))
        tally(INCREASING_CHECKS["step"][0], advance["step"] < 0)
        tally(INCREASING_CHECKS["time"][0], went_back)
        if "train_loss" in self.columns:
            tally(MISSING_LOSS[0], ~_known(column["train_loss"]))
        if "updates" in self.columns:
            tally(NO_UPDATE[0], column["updates"] == 0)
        grown = replace(self, rows=len(train), seen=tuple(seen), last=last, flagged=flagged)
        if "tokens" in self.columns:
            grown = grown.tokens_per_update(train, batch, column, first_window, (codes, categories), steps)
        if {"tokens", "updates"} <= self.columns:
            per_step = dict(self.per_step)
            for session, rows in groups:
                tokens, updates = column["tokens"][rows], column["updates"][rows]
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = tokens[updates > 0] / updates[updates > 0]
                per_step[session] = _merged(per_step.get(session, _EMPTY), ratio[~np.isnan(ratio)])
            grown = replace(grown, per_step=per_step)
        if set(STRAGGLER_COLUMNS) <= self.columns:
            grown = grown._streaks(groups, column, steps)
        if self.replays:
            grown = replace(grown, replays=self._redone(train, sessions, groups, steps))
        return grown

    def tokens_per_update(
        self,
        train: pd.DataFrame,
        batch: pd.DataFrame,
        column: dict[str, np.ndarray],
        first_window: np.ndarray,
        session_codes: tuple[np.ndarray, np.ndarray],
        steps: np.ndarray,
    ) -> Running:
        attempts = column["attempted_updates"] if "attempted_updates" in column else np.ones(len(batch))
        with np.errstate(divide="ignore", invalid="ignore"):
            per_update = column["tokens"] / attempts
        judged = np.isfinite(per_update) & (attempts > 0) & ~first_window
        values = _merged(self.per_update, per_update[judged])
        median = _median(values)
        flagged = dict(self.flagged)
        if median is None or median <= 0:
            flagged.pop(TOKENS_PER_UPDATE, None)
            return replace(self, flagged=flagged, per_update=values, band=None)
        if self.band is not None and _outside(self.per_update, median) == self.band[1:]:
            # The moved median leaves every old window's verdict as it was: judge the new ones.
            bad = judged & far_off(per_update, median)
            counts = _tally(flagged.get(TOKENS_PER_UPDATE, {}), bad, *session_codes, steps)
        else:  # a window on the band's edge changed sides (or there was no band): all of them, O(rows)
            every, judged_every = tokens_per_attempt(train)
            every_code = train["session_id"].cat.codes.to_numpy()
            bad = judged_every & far_off(every, median)
            counts = _tally({}, bad, every_code, session_codes[1], train["step"].to_numpy())
        flagged[TOKENS_PER_UPDATE] = counts
        return replace(self, flagged=flagged, per_update=values, band=(median, *_outside(values, median)))

    def _streaks(
        self, groups: list[tuple[str, np.ndarray]], column: dict[str, np.ndarray], steps: np.ndarray
    ) -> Running:
        """Straggler streaks (``straggler_checks``) extended: each session's slow run at its end stays open."""
        streaks, stragglers = dict(self.streaks), dict(self.stragglers)
        for session, rows in groups:
            slowest, longest, shortest = (column[name][rows].astype(np.float64) for name in STRAGGLER_COLUMNS)
            ratio, slow = slowness(slowest, longest, shortest)
            at = np.flatnonzero(slow)
            if not len(at):
                streaks[session] = None
                continue
            runs = np.flatnonzero((np.diff(at) != 1) | (slowest[at][1:] != slowest[at][:-1])) + 1
            open_run = streaks.get(session)
            ranks = dict(stragglers.get(session, {}))
            for number, (begin, end) in enumerate(zip(np.r_[0, runs], np.r_[runs, len(at)], strict=True)):
                positions = at[begin:end]
                rank, first_step = slowest[positions[0]], int(steps[rows[positions[0]]])
                before, pending = 0, _EMPTY
                if number == 0 and open_run is not None and positions[0] == 0 and open_run[0] == rank:
                    rank, before, first_step, pending = open_run  # the run the last batch ended in goes on
                windows = before + len(positions)
                new = ratio[positions] if before >= STRAGGLER_WINDOWS else np.concatenate([pending, ratio[positions]])
                if windows >= STRAGGLER_WINDOWS:
                    last_step = int(steps[rows[positions[-1]]])
                    known = ranks.get(int(rank))
                    ranks[int(rank)] = (
                        (first_step if known is None else known[0]),
                        last_step,
                        max(windows, 0 if known is None else known[2]),
                        _merged(_EMPTY if known is None else known[3], new),
                    )
                    new = _EMPTY
                open_run = (rank, windows, first_step, new) if positions[-1] == len(rows) - 1 else None
            streaks[session] = open_run
            if ranks:
                stragglers[session] = ranks
        return replace(self, streaks=streaks, stragglers=stragglers)

    def _redone(
        self, train: pd.DataFrame, sessions: Sequence[Session], groups: list[tuple[str, np.ndarray]], steps: np.ndarray
    ) -> dict[int, _Replay]:
        """Replay windows whose session redid more of them in the new rows, with the redo's loss again."""
        replays = dict(self.replays)
        by_session = dict(groups)
        losses = None
        for index, replay in self.replays.items():
            session = sessions[index]
            rows = by_session.get(session.session_id)
            if rows is None:
                continue
            redone = rows[(steps[rows] >= session.first_step) & (steps[rows] <= replay.last_step)] + self.rows
            if len(redone):
                losses = losses or loss_columns(train)
                redo_rows = np.concatenate([replay.redo_rows, redone])
                loss = None if losses is None else weighted_mean(losses[0][redo_rows], losses[1][redo_rows])
                replays[index] = replace(replay, redo_rows=redo_rows, redo_loss=loss)
        return replays

    def findings(self, sessions: Sequence[Session]) -> list[Finding]:
        """The checks' findings in the order ``diagnose_from_scratch`` gives them (without ingest)."""
        findings: list[Finding] = []

        def listed(check: str, severity: str, what: str) -> None:
            for session, (first, last, windows) in self.flagged.get(check, {}).items():
                findings.append(session_finding(check, severity, session, first, last, windows, what))

        listed(*ACCOUNTING)
        if self.band is not None:
            listed(TOKENS_PER_UPDATE, "warning", tokens_what(self.band[0]))
        for name, per_window in ADVANCES:
            if per_window in self.columns:
                listed(*ADVANCE_CHECKS[name])
        for name, _ in INCREASING:
            listed(*INCREASING_CHECKS[name])
        listed(*MISSING_LOSS)
        listed(*NO_UPDATE)
        for session in self.seen:
            for rank, (first, last, longest, ratios) in self.stragglers.get(session, {}).items():
                findings.append(straggler_finding(session, rank, first, last, longest, ratios))
        per_step = {"tokens", "updates"} <= self.columns
        for previous, session in pairwise(sessions):
            before = _median(self.per_step.get(previous.session_id, _EMPTY)) if per_step else None
            after = _median(self.per_step.get(session.session_id, _EMPTY)) if per_step else None
            findings += batch_change(previous, session, before, after)
        for index, replay in self.replays.items():
            session = sessions[index]
            window = ReplayWindow(
                index,
                session.first_step,
                replay.last_step,
                replay.earlier_records,
                len(replay.redo_rows),
                replay.earlier_loss,
                replay.redo_loss,
            )
            findings += loss_jump(session, window)
        return findings


def _known(values: np.ndarray) -> np.ndarray:
    return ~np.isnan(values) if values.dtype.kind == "f" else np.ones(len(values), dtype=bool)


def diagnose_reader(reader: RunReader) -> list[Finding]:
    """``diagnose`` on everything a reader has read so far."""
    return diagnose(
        train=reader.frame("train"),
        sessions=reader.sessions,
        redone=reader.redone_by("train"),
        ingest=reader.ingest_health(),
    )
