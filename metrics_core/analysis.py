"""Quantities derived from records, shared by the dashboard, the terminal tail and diagnostics."""

from __future__ import annotations

import numpy as np
import pandas as pd


def tokens_per_second(frame: pd.DataFrame) -> pd.Series:
    """Throughput at each record: tokens consumed since the previous record of the same session,
    divided by the wall time between them.  NaN for a session's first record and wherever time
    did not advance (never a made-up 0 or infinity)."""
    sessions = frame["session_id"]
    tokens = frame["tokens_seen"].astype(np.float64).groupby(sessions, observed=True).diff()
    seconds = frame["time"].groupby(sessions, observed=True).diff().dt.total_seconds()
    rate = tokens / seconds.where(seconds > 0)
    return rate.where(np.isfinite(rate))
