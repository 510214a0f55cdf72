"""A run's row of the runs table, kept as cheaply as what was read allows.

``RunStore`` owns the rows; this module computes them, from nothing but a reader or a file:

* ``runs_table_row``: a read run's row, from its ``summary.RunSummary`` (the tails of its reader's
  columns, O(1) per value), its loss trend (``LossTrend``) and the last, least and greatest value
  of each metric it logs (``MetricTails``), both O(appended rows) while only the last session
  grows, never from a frame of the whole run;
* ``peek_row``: a big run's row before it is read, from the last ``PEEK_BYTES`` of its file;
* ``error_row``: a run that cannot be shown; ``unreadable_row``: an entry of the root that cannot be
  looked into (``discovery.UnreadableEntry``).

``grown_in_last_session`` is the test both this module and the store's snapshots use to extend
what they computed instead of recomputing it: rows appended by the last session change nothing
decided about earlier rows.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.read.records import check_lines
from metrics_core.read.run_file import RunFile
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_summary import RunSummary
from metrics_core.read.supersession import only_appended_to_last
from metrics_core.roots.discovery import UnreadableEntry
from metrics_core.write.writer import BASE_FIELD_ORDER

TREND_POINTS = 40  # a sparkline's points: enough for a shape, a few hundred bytes a row
# The runs table's columns, in the order the runs page shows them (a row is ``runs_table_row``).
RUNS_TABLE_COLUMNS = (
    "run",
    "status",
    "progress",  # how far a run being read has come (``RunStore.runs_table``), else None
    "reason",
    "sessions",
    "last step",
    "tokens seen",
    "train loss",
    "val loss",
    "skipped updates",
    "last record age (s)",
    "bad lines",
    "error",
    "config",
    "started",
    "duration (s)",
    "loss trend",
    "metrics",
)
PEEK_BYTES = 64 << 10  # the tail a big cold run's first row is read from: ~150 records


class LossTrend:
    """``runs page.trend`` of a run's effective, finite train losses, kept from one summary to the
    next: the rows it picks from are remembered, so an append made by the last session (the live
    case) costs O(appended rows); anything else (a new session, a reset, a loss logged as a
    string) recomputes them, O(rows) in numpy."""

    def __init__(self) -> None:
        self._basis: tuple[int, int, int, str] | None = None  # (resets, sessions, train rows, last session id)
        self._kept = np.empty(0, dtype=np.int64)  # rows that count, in a buffer grown by doubling
        self._count = 0

    def update(self, reader: RunReader, sessions: int) -> tuple[float, ...]:
        column = reader.column("train", "train_loss")
        if column is None or column.size == 0:
            self._basis = None
            return ()
        if column.kind not in ("int", "float"):  # a writer that mixed types: rare, so the O(n) way
            self._basis = None
            values = pd.to_numeric(pd.Series(column.series(), dtype=object), errors="coerce").to_numpy(dtype=float)
            return _picked(values[~reader.superseded("train") & np.isfinite(values)])
        values, rows, basis = column.view(), column.size, self._basis
        if (
            basis is not None
            and basis[:2] == (reader.resets, sessions)  # same sessions: the last one is still basis[3]
            and grown_in_last_session(reader, "train", basis[2], basis[3])
        ):
            fresh = values[basis[2] : rows].astype(np.float64, copy=False)
            self._keep(basis[2] + np.flatnonzero(np.isfinite(fresh)))
            last = basis[3]
        else:
            self._count = 0
            self._keep(np.flatnonzero(~reader.superseded("train") & np.isfinite(values.astype(np.float64, copy=False))))
            last = reader.sessions[-1].session_id  # O(rows), like the line above
        self._basis = (reader.resets, sessions, rows, last)
        kept = self._kept[: self._count]
        if len(kept) > TREND_POINTS:
            kept = kept[_trend_positions(len(kept))]
        return _points(values[kept])

    def _keep(self, rows: np.ndarray) -> None:
        needed = self._count + len(rows)
        if needed > len(self._kept):
            grown = np.empty(max(needed, 2 * len(self._kept), 64), dtype=np.int64)
            grown[: self._count] = self._kept[: self._count]
            self._kept = grown
        self._kept[self._count : needed] = rows
        self._count = needed


TAIL_EVENTS = ("train", "validation")  # the events whose numbers are a run's metrics
MAX_TAIL_KEYS = 256  # metrics followed per event: a 2,000-key run's per-layer statistics are its own page's
FOLD_ROWS = 1024  # appended rows folded in as one (metrics × rows) array; more are folded metric by metric


class MetricTails:
    """Per metric of a run (a numeric field of its ``TAIL_EVENTS`` records, the writer's base fields
    aside), its last, least and greatest finite value in the effective history (no row a later
    session redid): what the runs table shows of a chosen metric and the sweep page plots, kept
    beside each run's row so that neither reads a run again.  Like ``LossTrend``, an append by the
    last session folds in the appended rows only; anything else recomputes, O(rows) in numpy.  The
    first ``MAX_TAIL_KEYS`` metrics of each event are followed (the writer's own, logged first,
    among them)."""

    def __init__(self) -> None:
        self._basis: dict[str, tuple[int, int, int, str]] = {}  # event -> (resets, sessions, rows, last session id)
        self._tails: dict[str, dict[str, tuple[float, float, float]]] = {}

    def update(self, reader: RunReader, sessions: int) -> Tails:
        """``{metric: (last, min, max)}``; a metric both events log is the train record's."""
        tails: dict[str, tuple[float, float, float]] = {}
        for event in TAIL_EVENTS:
            for key, tail in self._event(reader, event, sessions).items():
                tails.setdefault(key, tail)
        return Tails(tails)

    def _event(self, reader: RunReader, event: str, sessions: int) -> dict[str, tuple[float, float, float]]:
        rows = event_rows(reader, event)
        basis = self._basis.get(event)
        if rows == 0:
            self._basis.pop(event, None)
            return self._tails.pop(event, {})
        if basis is not None and basis[:3] == (reader.resets, sessions, rows):
            return self._tails[event]  # nothing appended to this event
        grown = (
            basis is not None
            and basis[:2] == (reader.resets, sessions)
            and grown_in_last_session(reader, event, basis[2], basis[3])
        )
        start, tails = (basis[2], dict(self._tails[event])) if grown else (0, {})
        kept = None if grown else ~reader.superseded(event)
        names, columns = [], []
        for name in [name for name in reader.fields(event) if name not in BASE_FIELD_ORDER][:MAX_TAIL_KEYS]:
            column = reader.column(event, name)
            if column is None or column.kind not in ("int", "float"):  # a string or a bool is no metric
                tails.pop(name, None)
            else:
                names.append(name)
                columns.append(column)
        if grown and rows - start <= FOLD_ROWS:  # one array for every metric: an append costs O(metrics) in numpy
            block = np.array([column.numbers(start, rows) for column in columns], dtype=np.float64)
            self._fold(tails, names, block.reshape(len(names), rows - start))
        else:  # one metric at a time: a sparse one's rows are made dense for its fold only
            for name, column in zip(names, columns, strict=True):
                values = column.numbers(start, rows)
                self._fold(tails, [name], (values if kept is None else values[kept]).reshape(1, -1))
        self._basis[event] = (reader.resets, sessions, rows, reader.sessions[-1].session_id)
        self._tails[event] = tails
        return tails

    @staticmethod
    def _fold(tails: dict[str, tuple[float, float, float]], names: list[str], block: np.ndarray) -> None:
        """Fold rows ``block`` (one row of values per metric of ``names``, in file order) into ``tails``."""
        finite = np.isfinite(block)
        if not finite.any():
            return
        has = finite.any(axis=1)
        last = block[np.arange(len(names)), block.shape[1] - 1 - np.argmax(finite[:, ::-1], axis=1)]
        low = np.where(finite, block, np.inf).min(axis=1)
        high = np.where(finite, block, -np.inf).max(axis=1)
        for index in np.flatnonzero(has).tolist():
            name, found = names[index], (float(last[index]), float(low[index]), float(high[index]))
            before = tails.get(name)
            tails[name] = found if before is None else (found[0], min(before[1], found[1]), max(before[2], found[2]))


def _trend_positions(count: int) -> np.ndarray:
    return np.round(np.arange(TREND_POINTS) * (count - 1) / (TREND_POINTS - 1)).astype(np.int64)


def _picked(values: np.ndarray) -> array[float]:
    if len(values) > TREND_POINTS:
        values = values[_trend_positions(len(values))]
    return _points(values)


def _points(values: np.ndarray) -> array[float]:
    """A sparkline's points as the row keeps them: one array of doubles (a few hundred bytes),
    not a tuple of float objects (three times that), as a root of thousands of settled runs
    holds one per run."""
    return array("d", np.ascontiguousarray(values, dtype=np.float64).tobytes())


class Tails(Mapping[str, tuple[float, float, float]]):
    """``{metric: (last, min, max)}`` as a run's row keeps it: the values one array, the names and
    their index shared by the runs that log the same metrics (``_SHARED``, at most
    ``MAX_SHARED_NAMES`` sets of names), a few hundred bytes a run where a dict of float tuples
    took kilobytes: a root of ten thousand settled runs holds one per run.  Immutable."""

    __slots__ = ("_index", "_values")

    def __init__(self, tails: Mapping[str, tuple[float, float, float]]) -> None:
        names = tuple(tails)
        index = _SHARED.get(names)
        if index is None:
            index = {name: number for number, name in enumerate(names)}
            if len(_SHARED) < MAX_SHARED_NAMES:
                index = _SHARED.setdefault(names, index)
        self._index = index
        self._values = array("d", [value for tail in tails.values() for value in tail])

    def __getitem__(self, key: str) -> tuple[float, float, float]:
        at = 3 * self._index[key]
        return self._values[at], self._values[at + 1], self._values[at + 2]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"Tails({dict(self)!r})"


MAX_SHARED_NAMES = 4096  # sets of metric names shared between rows (a sweep's runs log one set)
_SHARED: dict[tuple[str, ...], dict[str, int]] = {}


def grown_in_last_session(reader: RunReader, event: str, before: int, last: str) -> bool:
    """Whether ``event``'s rows from ``before - 1`` on all belong to session ``last``, the reader's
    last, so that no supersession decision about the first ``before`` rows changes
    (``supersession.only_appended_to_last``).  O(new rows)."""
    column = reader.column(event, "session_id")
    if before == 0 or column is None or column.kind != "cat" or column.size < before:
        return False
    codes = np.unique(column.view()[before - 1 :]).tolist()
    return only_appended_to_last((column.categories[code] if code >= 0 else None for code in codes), last)


def runs_table_row(
    name: str, summary: RunSummary, metrics: Mapping[str, tuple[float, float, float]] | None = None
) -> dict[str, Any]:
    """A run's row of the runs table (ages are filled in per call by ``RunStore.runs page``);
    ``metrics``: ``MetricTails.update``'s."""
    return {
        "run": name,
        "status": summary.status,
        "reason": summary.reason,
        "sessions": summary.sessions,
        "last step": summary.last_step,
        "tokens seen": summary.tokens_seen,
        "train loss": None if summary.train_loss is None else summary.train_loss.value,
        "val loss": None if summary.val_loss is None else summary.val_loss.value,
        "skipped updates": summary.skipped_updates,
        "last record age (s)": None,
        "bad lines": summary.bad_lines,
        "error": None,
        "config": summary.config,
        "started": summary.started,
        "duration (s)": (summary.last_record_time - summary.started).total_seconds()
        if summary.started and summary.last_record_time
        else None,
        "loss trend": summary.loss_trend,  # the summary's tuple, not a copy: each run's points held once
        "metrics": metrics or {},
    }


def peek_row(name: str, file: RunFile) -> tuple[dict[str, Any], datetime] | None:
    """A big run's row before it is read, and its last record time: status ``loading`` with the
    last step, tokens seen and losses found in the last ``PEEK_BYTES`` of its ``file`` (opened
    here, as its root opens it for a reader; valid records by ``records.check_lines``, the
    readers' own rule); the rest stays missing until the run is read.  One ``pread``, so a root of
    big runs shows where each one is within a second, while parsing them takes minutes.  None if
    the tail holds no record or cannot be read."""
    try:
        file.open()
        try:
            size = file.size()
            start = max(0, size - PEEK_BYTES)
            block = file.read(start, size - start)
        finally:
            file.close()
    except OSError:
        return None
    first = block.find(b"\n") + 1 if start else 0  # a cut first line is no record
    records, _, _ = check_lines(block[first : block.rfind(b"\n") + 1], 1)
    if not records:
        return None
    last = records[-1]
    row = {
        "run": name,
        "status": "loading",
        "last step": last["step"],
        "tokens seen": last["tokens_seen"],
        "train loss": _latest(records, "train", "train_loss"),
        "val loss": _latest(records, "validation", "val_loss"),
    }
    return row, datetime.fromtimestamp(last["time"] / 1e9, timezone.utc)


def _latest(records: list[dict[str, Any]], event: str, name: str) -> float | None:
    """The last finite number logged as ``name`` by an ``event`` record (a bool is no loss)."""
    for record in reversed(records):
        value = record.get(name)
        if record["event"] == event and type(value) in (int, float) and math.isfinite(value):
            return float(value)
    return None


def error_row(name: str, reason: str) -> dict[str, Any]:
    return {"run": name, "status": "error", "error": reason}


def unreadable_row(entry: UnreadableEntry) -> dict[str, Any]:
    """An entry of the runs root that discovery could not look into: named, with the reason."""
    return {"run": entry.name, "status": "unreadable", "error": entry.reason}


def runs_frame(
    rows: list[dict[str, Any]], times: list[datetime | None], unreadable: tuple[UnreadableEntry, ...]
) -> tuple[pd.DataFrame, np.ndarray]:
    """The runs table of ``rows`` and then a row per ``unreadable`` entry, and each row's last
    record time (``times``) in seconds since the epoch (NaN: none), for ``with_ages``."""
    table = pd.DataFrame(rows + [unreadable_row(bad) for bad in unreadable], columns=list(RUNS_TABLE_COLUMNS))
    seconds = [np.nan if when is None else when.timestamp() for when in times] + [np.nan] * len(unreadable)
    return table, np.array(seconds, dtype=np.float64)


def with_ages(table: pd.DataFrame, times: np.ndarray, now: datetime) -> pd.DataFrame:
    """``runs_frame``'s table with each row's last record age at ``now`` (per call: the rest is kept)."""
    ages = now.timestamp() - times
    return table.assign(**{"last record age (s)": np.where(np.isnan(ages), None, ages)})


def last_value(frame: pd.DataFrame, column: str) -> float | None:
    if column not in frame.columns:
        return None
    # A trainer may have logged a string under a numeric name: it is no value to show.
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    return float(values.iloc[-1]) if len(values) else None


def event_rows(reader: RunReader, event: str) -> int:
    column = reader.column(event, "step")  # every record has a step
    return 0 if column is None else column.size
