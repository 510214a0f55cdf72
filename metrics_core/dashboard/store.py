"""Parsed run data held once per server process and shared by every browser tab.

Streamlit's ``st.cache_resource`` hands the same ``RunStore`` to every session and script thread,
so all of it is thread-safe: one lock guards the run table, one lock per run guards its reader.
Pages never touch a reader: they get an immutable ``RunView`` snapshot, rebuilt only when the
run's file changed, so ten open tabs cost one parse and one set of frames.

Refresh policy: a run is re-read when the watcher reports its file changed, and in any case when
its last refresh is older than ``safety_interval`` seconds (a no-change refresh is one ``stat``),
so a lost inotify event or a network filesystem never means stale data.

Failure containment: one run never takes a page down.  Whatever reading or snapshotting a run
raises (a reader bug, a permission error, a value pandas cannot hold) becomes a ``RunViewError``
naming the run and the cause in plain text; ``overview()`` turns it into that run's row with
status ``error`` and lists every other run.  The failed run's reader is discarded (its state is
unknown after an exception mid-refresh) and the failure is remembered: the file is re-read from
the start only once it changed and ``safety_interval`` has passed, so a broken run costs one
``stat`` per refresh, not a full re-read.

The overview's ``config`` column holds each run's flattened config (``dashboard.config``), computed
once per snapshot, for the runs page to filter on and pick columns from; it is not shown as is.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.dashboard.config import view_config
from metrics_core.errors import MetricsError, RunNotFoundError
from metrics_core.reader import IngestHealth, RunReader, Session
from metrics_core.runs import RunInfo, find_runs, resolve_run, run_status
from metrics_core.watch import RunsWatcher

EVENTS = ("train", "validation", "checkpoint", "session_start", "session_end", "config")
REDISCOVER_S = 10.0  # find_runs even without a watcher event (a watch can miss a new directory)
OVERVIEW_COLUMNS = ("run", "status", "sessions", "last step", "tokens seen", "train loss", "val loss",
                    "skipped updates", "last record age (s)", "bad lines", "error", "config")  # fmt: skip
_log = logging.getLogger(__name__)


class RunViewError(MetricsError, RuntimeError):
    """A run's data could not be read or shown; ``cause`` says why in plain text (no traceback)."""

    def __init__(self, name: str, cause: str) -> None:
        super().__init__(f"run {name!r} cannot be shown: {cause}")
        self.name = name
        self.cause = cause


@dataclass(frozen=True, eq=False)
class RunView:
    """Everything a page shows about one run, as of one refresh.

    Immutable, so anything derived from it (figures, diagnostics) is computed once per snapshot
    with ``memo`` and shared by every tab: on a 1M-record run the charts take ~1.5 s and the
    diagnostics ~1 s to build, far too much to redo per tab per second.
    """

    name: str
    records: int
    sessions: list[Session]
    frames: dict[str, pd.DataFrame]
    superseded: dict[str, np.ndarray]
    replaced: dict[int, np.ndarray]  # per session index: the train rows it redid
    ingest: IngestHealth
    last_record_time: datetime | None
    status: str
    _memo: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def memo(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per snapshot and ``key``, whichever thread asks first."""
        with self._memo_lock:
            if key not in self._memo:
                self._memo[key] = compute()
            return self._memo[key]

    def effective(self, event: str) -> pd.DataFrame:
        """``event`` records no later session redid."""
        return self.frames[event][~self.superseded[event]].reset_index(drop=True)


@dataclass
class _Entry:
    reader: RunReader
    lock: threading.Lock = field(default_factory=threading.Lock)
    refreshed_at: float = float("-inf")
    view_key: tuple[int, ...] | None = None
    view: RunView | None = None
    failure: str | None = None  # why the last attempt failed, until the file changes
    failure_stamp: tuple[int, int, int] | None = None
    failed_at: float = float("-inf")


class RunStore:
    """Readers and views of every run under ``root``; see the module docstring."""

    def __init__(
        self,
        root: str | Path,
        *,
        force_polling: bool = False,
        safety_interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = Path(root)
        self.safety_interval = safety_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._runs: list[RunInfo] = []
        self._runs_key: tuple[int, float] | None = None
        if not self.root.is_dir():
            raise RunNotFoundError(
                f"{self.root}: the runs root does not exist or is not a directory (point --runs or "
                "METRICS_RUNS_DIR at a directory of runs, or add --demo to create it with a demo run)"
            )
        self.watcher = RunsWatcher(self.root, force_polling=force_polling).start()

    def close(self) -> None:
        self.watcher.stop()
        with self._lock:
            for entry in self._entries.values():
                entry.reader.close()

    def runs(self) -> list[RunInfo]:
        """The runs under the root, rediscovered when the watcher saw the tree change."""
        with self._lock:
            key = (self.watcher.structure_generation, self._clock() // REDISCOVER_S)
            if key != self._runs_key:
                self._runs = find_runs(self.root)
                self._runs_key = key
            dirty = self.watcher.take_dirty()
            for name, entry in self._entries.items():
                if entry.reader.path.parent in dirty or (self.root / name) in dirty:
                    entry.refreshed_at = float("-inf")
            return list(self._runs)

    def view(self, name: str, *, now: datetime | None = None) -> RunView:
        """A fresh snapshot of run ``name``.

        Raises RunPathError / RunNotFoundError for bad names (OSError for one the OS refuses,
        e.g. too long), and RunViewError when the run exists but cannot be read or shown.
        """
        info = resolve_run(self.root, name)
        self.runs()  # collect watcher hints
        with self._lock:
            entry = self._entries.get(info.name)
            if entry is None:
                entry = self._entries[info.name] = _Entry(RunReader(info.directory))
        with entry.lock:
            if entry.failure is not None:
                stamp = _stamp(info.metrics_path)
                if stamp == entry.failure_stamp or self._clock() - entry.failed_at < self.safety_interval:
                    raise RunViewError(info.name, entry.failure)
            try:
                view = self._fresh_view(info.name, entry, now or datetime.now(timezone.utc))
            except RunNotFoundError:
                raise  # the run vanished: pages wait for it to come back
            except Exception as exc:
                _log.warning("run %r cannot be shown", info.name, exc_info=True)
                entry.reader.close()
                entry.reader = RunReader(info.directory)
                entry.view = entry.view_key = None
                entry.refreshed_at = float("-inf")
                entry.failure, entry.failure_stamp = _cause(exc), _stamp(info.metrics_path)
                entry.failed_at = self._clock()
                raise RunViewError(info.name, entry.failure) from exc
            entry.failure = entry.failure_stamp = None
            return view

    def _fresh_view(self, name: str, entry: _Entry, now: datetime) -> RunView:
        """``entry``'s snapshot, refreshed if due; the caller holds ``entry.lock``."""
        if self._clock() - entry.refreshed_at >= self.safety_interval or entry.view is None:
            entry.reader.refresh()
            entry.refreshed_at = self._clock()
        reader = entry.reader
        status = run_status(reader, now=now)
        key = (reader.records, reader.resets, reader.bad_lines, reader.pending_bytes)
        if key != entry.view_key or entry.view is None:
            entry.view = _build_view(name, reader, status)
            entry.view_key = key
        elif entry.view.status != status:
            entry.view = replace(entry.view, status=status)  # same data; derived data rebuilt once
        return entry.view

    def overview(self, *, now: datetime | None = None) -> pd.DataFrame:
        """One row per run with what the runs table shows; a run that cannot be shown is a row
        with status ``error`` and the reason in ``error``, never an exception."""
        now = now or datetime.now(timezone.utc)
        rows = []
        for info in self.runs():
            try:
                rows.append(_overview_row(self.view(info.name, now=now), now))
            except Exception as exc:
                reason = exc.cause if isinstance(exc, RunViewError) else _cause(exc)
                rows.append({"run": info.name, "status": "error", "error": reason})
        return pd.DataFrame(rows, columns=list(OVERVIEW_COLUMNS))


def _overview_row(view: RunView, now: datetime) -> dict[str, Any]:
    train, validation = view.frames["train"], view.frames["validation"]
    last = train.iloc[-1] if len(train) else None
    return {
        "run": view.name,
        "status": view.status,
        "sessions": len(view.sessions),
        "last step": view.sessions[-1].last_step if view.sessions else None,
        "tokens seen": view.sessions[-1].last_tokens_seen if view.sessions else None,
        "train loss": _last_value(train, "train_loss"),
        "val loss": _last_value(validation, "val_loss"),
        "skipped updates": int(last["skipped_updates"]) if last is not None else None,
        "last record age (s)": (now - view.last_record_time).total_seconds() if view.last_record_time else None,
        "bad lines": view.ingest.bad_lines,
        "error": None,
        "config": config.values if (config := view_config(view)) is not None else None,
    }


def _cause(exc: BaseException) -> str:
    """An exception as one plain line: its type and message, no traceback."""
    message = " ".join(str(exc).split())
    if isinstance(exc, MetricsError):
        return message or type(exc).__name__
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is appended to or replaced."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _last_value(frame: pd.DataFrame, column: str) -> float | None:
    if column not in frame.columns:
        return None
    # A trainer may have logged a string under a numeric name: it is no value to show.
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    return float(values.iloc[-1]) if len(values) else None


def _numeric_where_numbers(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every mixed-type column that holds numbers made numeric.

    The reader keeps a field whose type changed between records (a string logged under
    ``train_loss`` once) as Python objects; every chart and check expects numbers there, and one
    such string used to raise in the loss-replay arithmetic.  The strings become missing values:
    drawn as gaps and counted by the diagnostics.  Only object columns pay (~0.1 s per million
    rows); a well-formed run has none.
    """
    mixed = [column for column in frame.columns if frame[column].dtype == object]
    if not mixed:
        return frame
    numbers = {column: pd.to_numeric(frame[column], errors="coerce") for column in mixed}
    return frame.assign(**{column: values for column, values in numbers.items() if values.notna().any()})


def _view_frame(reader: RunReader, event: str) -> pd.DataFrame:
    frame = reader.frame(event)
    # config records hold the nested "config" object: kept as written, never made numeric
    return frame if event == "config" else _numeric_where_numbers(frame)


def _build_view(name: str, reader: RunReader, status: str) -> RunView:
    return RunView(
        name=name,
        records=reader.records,
        sessions=reader.sessions,
        frames={event: _view_frame(reader, event) for event in EVENTS},
        superseded={event: reader.superseded(event) for event in EVENTS},
        replaced={s.index: reader.replaced_by(s.index, "train") for s in reader.sessions},
        ingest=reader.ingest_health(),
        last_record_time=reader.last_record_time,
        status=status,
    )
