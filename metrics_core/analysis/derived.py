"""Quantities derived from records, shared by the dashboard and diagnostics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from metrics_core.read.run_status import CRASH_REASON
from metrics_core.read.session_model import Session
from metrics_core.read.supersession import redo_windows
from metrics_core.read.throughput import tokens_per_second_rows


def tokens_per_second(frame: pd.DataFrame) -> pd.Series:
    """``throughput.tokens_per_second_rows`` of a train frame (``session_id``, ``tokens_seen``,
    ``time``; its sessions contiguous, as a run file's are): the rule, for a frame."""
    times = frame["time"]
    times_ns = np.asarray(times.to_numpy(dtype="datetime64[ns]").view(np.int64), dtype=np.float64)
    times_ns[np.asarray(times.isna())] = np.nan
    tokens = pd.to_numeric(frame["tokens_seen"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    sessions = pd.factorize(frame["session_id"])[0]
    return pd.Series(tokens_per_second_rows(tokens, times_ns, sessions), index=frame.index)


def weighted_loss(frame: pd.DataFrame, column: str = "train_loss") -> float | None:
    """Token-weighted mean of ``column`` over rows with a finite value (plain mean without tokens)."""
    found = loss_columns(frame, column)
    return None if found is None else weighted_mean(*found)


def loss_columns(frame: pd.DataFrame, column: str = "train_loss") -> tuple[np.ndarray, np.ndarray] | None:
    """``column`` and its weights (``tokens``, else ones) as float64, or None without ``column``."""
    if column not in frame.columns:
        return None
    values = frame[column].to_numpy(dtype=np.float64)
    weights = frame["tokens"].to_numpy(dtype=np.float64) if "tokens" in frame.columns else np.ones(len(frame))
    return values, weights


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> float | None:
    """``weighted_loss`` of ``loss_columns``' arrays (or rows of them)."""
    usable = np.isfinite(values) & np.isfinite(weights) & (weights > 0)
    if not usable.any():
        return None
    return float(np.average(values[usable], weights=weights[usable]))


@dataclass(frozen=True, slots=True)
class ReplayWindow:
    """Steps a session redid: the earlier sessions' superseded tail against its own redo."""

    session: int
    first_step: int
    last_step: int
    earlier_records: int
    redo_records: int
    earlier_loss: float | None
    redo_loss: float | None

    @property
    def loss_delta(self) -> float | None:
        """Redo minus earlier (token-weighted mean train loss over the same steps)."""
        if self.earlier_loss is None or self.redo_loss is None:
            return None
        return self.redo_loss - self.earlier_loss


# The train fields ``replay_windows`` reads.
REPLAY_FIELDS = frozenset({"session_id", "step", "train_loss", "tokens"})


def session_indices(train: pd.DataFrame, sessions: Sequence[Session]) -> np.ndarray:
    """Per row of ``train``, the index of its session in ``sessions`` (-1: none of them)."""
    column = train["session_id"]
    if not isinstance(column.dtype, pd.CategoricalDtype):
        column = column.astype("category")
    index = {session.session_id: session.index for session in sessions}
    lookup = np.array([index.get(name, -1) for name in column.cat.categories] + [-1], dtype=np.int64)
    return lookup[column.cat.codes.to_numpy()]  # code -1 (no session) takes the trailing -1


def replay_rows(train: pd.DataFrame, sessions: Sequence[Session], redone: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``supersession.redo_windows`` of ``train``: per session the last step it redid (-1: none),
    per row the session whose redo it is (-1: none)."""
    steps = train["step"].to_numpy(dtype=np.int64)
    first_steps = [session.first_step for session in sessions]
    return redo_windows(redone, session_indices(train, sessions), steps, first_steps)


def replay_windows(train: pd.DataFrame, sessions: Sequence[Session], redone: np.ndarray) -> list[ReplayWindow]:
    """One window per session that redid work; ``redone``: per row of ``train``, the session that
    redid it, -1 where none did (``RunReader.redone_by``).  O(rows + sessions), vectorised."""
    if not len(train) or not (redone >= 0).any():
        return []
    count = len(sessions)
    last, redo = replay_rows(train, sessions, redone)
    earlier_records = np.bincount(redone[redone >= 0], minlength=count)
    redo_records = np.bincount(redo[redo >= 0], minlength=count)
    earlier_loss, redo_loss = _group_losses(train, redone, count), _group_losses(train, redo, count)
    return [
        ReplayWindow(
            session=index,
            first_step=sessions[index].first_step,
            last_step=int(last[index]),
            earlier_records=int(earlier_records[index]),
            redo_records=int(redo_records[index]),
            earlier_loss=earlier_loss[index],
            redo_loss=redo_loss[index],
        )
        for index in np.flatnonzero(last >= 0).tolist()
    ]


def _group_losses(
    frame: pd.DataFrame, groups: np.ndarray, count: int, column: str = "train_loss"
) -> list[float | None]:
    """``weighted_loss`` of each group of rows (``groups``: per row, its group below ``count``, -1:
    none), all in one pass."""
    found = loss_columns(frame, column)
    if found is None:
        return [None] * count
    values, weights = found
    usable = (groups >= 0) & np.isfinite(values) & np.isfinite(weights) & (weights > 0)
    total = np.bincount(groups[usable], weights=weights[usable], minlength=count)
    weighted = np.bincount(groups[usable], weights=values[usable] * weights[usable], minlength=count)
    return [float(w / t) if t > 0 else None for w, t in zip(weighted.tolist(), total.tolist(), strict=True)]


def tokens_per_step(train: pd.DataFrame, session_id: str) -> float | None:
    """Median tokens per successful update over one session's windows (None without the fields)."""
    if not {"tokens", "updates"} <= set(train.columns):
        return None
    rows = train[(train["session_id"] == session_id) & (train["updates"] > 0)]
    ratio = (rows["tokens"] / rows["updates"]).dropna()
    return float(ratio.median()) if len(ratio) else None


def session_table(sessions: Sequence[Session], train: pd.DataFrame, run_status: str | None = None) -> pd.DataFrame:
    """The sessions page's table: one row per session, what it ran and what its resume cost.

    A session without ``session_end`` crashed if a later one exists; the last one has the run's
    status (``live``, ``stalled``, ``crashed``) when given.
    """
    rows = []
    for session in sessions:
        ended = session.end_status or ("crashed" if session.index + 1 < len(sessions) else run_status)
        mine = train[train["session_id"] == session.session_id] if len(train) else train
        duration = (session.end_time - session.start_time).total_seconds()
        skipped = mine["skipped_updates_in_window"].sum() if "skipped_updates_in_window" in mine else None
        tokens = session.last_tokens_seen - session.first_tokens_seen
        rows.append(
            {
                "session": session.index + 1,
                "id": session.session_id,
                "start": session.start_time,
                "end": session.end_time,
                "duration (s)": round(duration, 1),
                "downtime before (s)": None if session.downtime_s is None else round(session.downtime_s, 1),
                "first step": session.first_step,
                "last step": session.last_step,
                "resume step": session.resume_step if session.index else None,
                "steps replayed": session.steps_replayed,
                "tokens replayed": session.tokens_replayed,
                "tokens replayed is an upper bound": session.tokens_replayed_is_upper_bound,
                "records": session.records,
                "discarded bytes": session.discarded_bytes,
                "skipped updates": None if skipped is None else int(skipped),
                "mean tokens/s": round(tokens / duration) if duration > 0 else None,
                "end status": ended or "no session_end",
                "reason": session.end_error or (CRASH_REASON if ended == "crashed" else None),
            }
        )
    return pd.DataFrame(rows).astype({"resume step": "Int64", "discarded bytes": "Int64", "mean tokens/s": "Int64"})
