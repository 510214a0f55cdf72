"""Throughput (tokens/s) of each ``train`` record: the one rule the run page's charts, the compare
page and ``python -m metrics_core tail`` all show.

The rule: the tokens consumed since the previous ``train`` record (``tokens_seen`` minus its
``tokens_seen``) over the wall time between their ``time``s, when that record is of the same
session; none at a session's first record, where time did not advance, where either count or
time is missing, or where the quotient is not finite: never a made-up 0 or infinity.  The
previous record is the one before it in the file: a run file's sessions are contiguous.

Two forms of that rule, side by side here and tested equal (tests/unit/test_derived_appends.py):
``Rates``, fed records one at a time, for the terminal (which may have no numpy), and
``tokens_per_second_rows`` over columns, vectorised, for the dashboard's snapshot, which extends
the series per append from the row before the new ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from metrics_core.read.session_model import number

if TYPE_CHECKING:
    import numpy as np


def rate(tokens_before: float | None, ns_before: int | None, tokens: float | None, ns: int | None) -> float | None:
    """The rule for one record against the record before it of the same session (counts and
    times in ns; None where missing)."""
    if tokens_before is None or ns_before is None or tokens is None or ns is None or ns <= ns_before:
        return None
    value = (tokens - tokens_before) / ((ns - ns_before) / 1e9)
    return value if math.isfinite(value) else None


class Rates:
    """Tokens per second of each ``train`` record fed in file order (records as ``records``
    checks them: ``time`` in ns), by ``rate`` against the train record fed before it."""

    def __init__(self) -> None:
        self._last: tuple[Any, float | None, int | None] | None = None  # (session, tokens_seen, time ns)

    def __call__(self, record: Mapping[str, Any]) -> float | None:
        """The rate at ``record``, a train record."""
        session, tokens, ns = record.get("session_id"), number(record.get("tokens_seen")), record.get("time")
        ns = ns if isinstance(ns, int) and not isinstance(ns, bool) else None
        before, self._last = self._last, (session, tokens, ns)
        if before is None or before[0] != session:
            return None
        return rate(before[1], before[2], tokens, ns)


def tokens_per_second_rows(tokens: np.ndarray, times_ns: np.ndarray, sessions: np.ndarray) -> np.ndarray:
    """The rule over columns (tokens seen and times in ns as float64, NaN where missing; session
    codes) of contiguous sessions: each row against the row before it, so the values of appended
    rows need only the row before them.  NaN where ``rate`` says none, and at row 0.  O(rows)."""
    import numpy as np  # here: the terminal's ``Rates`` imports this module without numpy

    result = np.full(len(tokens), np.nan)
    if len(tokens) < 2:
        return result
    with np.errstate(divide="ignore", invalid="ignore"):
        seconds = np.diff(times_ns) / 1e9
        step = np.diff(tokens) / np.where(seconds > 0, seconds, np.nan)
    step[(sessions[1:] != sessions[:-1]) | ~np.isfinite(step)] = np.nan
    result[1:] = step
    return result
