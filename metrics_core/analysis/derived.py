"""Quantities derived from records, shared by the dashboard and diagnostics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from metrics_core.read.run_status import CRASH_REASON
from metrics_core.read.session_model import Session
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
    if column not in frame.columns or frame.empty:
        return None
    values = frame[column].to_numpy(dtype=np.float64)
    weights = frame["tokens"].to_numpy(dtype=np.float64) if "tokens" in frame.columns else np.ones(len(frame))
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


def replay_windows(
    train: pd.DataFrame, sessions: Sequence[Session], replaced: Mapping[int, np.ndarray]
) -> list[ReplayWindow]:
    """One window per session that redid work; ``replaced[j]`` marks train rows session j superseded."""
    windows = []
    for session in sessions[1:]:
        mask = replaced.get(session.index)
        if mask is None or not mask.any():
            continue
        earlier = train[mask]
        last = int(earlier["step"].max())
        steps = train["step"]
        redo = train[(train["session_id"] == session.session_id) & (steps >= session.first_step) & (steps <= last)]
        windows.append(
            ReplayWindow(
                session=session.index,
                first_step=session.first_step,
                last_step=last,
                earlier_records=len(earlier),
                redo_records=len(redo),
                earlier_loss=weighted_loss(earlier),
                redo_loss=weighted_loss(redo),
            )
        )
    return windows


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
