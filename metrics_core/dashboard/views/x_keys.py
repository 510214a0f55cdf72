"""What a chart's x axis can be: a mode of ``X_MODES`` (step, tokens seen, wall time, hours since
start), or any number the run logged that grows within each session (an epoch, a token count of the
user's, a custom counter).

* ``grows`` is the rule for a key: within every session its logged values never go down, and
  somewhere they go up (a constant is no axis).  A resumed run may start a key over in a new session
  (an epoch counted from 0 again); a metric that wobbles (a loss, a gradient norm) is refused.  On a
  run of thousands of keys most are such metrics: an even sample of ``SAMPLE_ROWS`` rows of all of
  them, one matrix, refuses those before the full pass (``growing_keys``).
* ``fill_x`` gives a record that lacks the key (a validation record: the writer logs no user key
  with it) the x of the train records around it, interpolated on the step, so validation loss
  still draws against an epoch.

Pure functions of snapshots and frames; ``views.memo.view_x_keys`` keeps a run's keys per snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from metrics_core.dashboard.store.snapshot import EventColumns
from metrics_core.read.column_table import Held

X_MODES = {"step": "step", "tokens_seen": "tokens seen", "time": "wall time", "relative": "hours since start"}
SAMPLE_ROWS = 64


def session_codes(columns: EventColumns) -> np.ndarray:
    """Each row's session as a small integer (rows of one session share it)."""
    sessions = columns.array("session_id")
    codes = getattr(sessions, "codes", None)
    return np.asarray(codes) if codes is not None else pd.factorize(np.asarray(sessions))[0]


def _goes_down(values: np.ndarray, codes: np.ndarray) -> bool:
    """Whether a value is ever below the one before it in the same session (NaN compares false)."""
    same = codes[1:] == codes[:-1]
    return bool((values[1:][same] < values[:-1][same]).any())


def grows(values: np.ndarray, codes: np.ndarray) -> bool:
    """Whether ``values`` (rows in file order, ``codes`` their sessions) never go down within a
    session and go up somewhere: a key that can be an x axis.  Missing values are skipped."""
    if values.dtype.kind not in "iuf" or len(values) < 2:
        return False
    finite = np.isfinite(values)
    kept, sessions = values[finite], codes[finite]
    if len(kept) < 2 or _goes_down(kept, sessions):
        return False
    same = sessions[1:] == sessions[:-1]
    return bool((kept[1:][same] > kept[:-1][same]).any())


def growing_keys(
    columns: EventColumns, keys: Iterable[str], known: dict[str, tuple[Held, bool]] | None = None
) -> tuple[str, ...]:
    """The keys among ``keys`` (numeric fields of ``columns``, one event's records) that ``grows``
    holds for, sorted: what the pages offer as x besides ``X_MODES``.

    The cheap refusal first, for every key at once: the same ``SAMPLE_ROWS`` rows of each key, in
    one matrix, drop the keys that go down within a session there (most keys of a big run are
    metrics that wobble); only the rest get the full pass."""
    if columns.rows < 2:
        return ()
    codes = session_codes(columns)
    names = set(columns.names)  # a tuple: ``in`` on it would make this O(keys²)
    arrays, found = {}, []
    for key in (key for key in keys if key not in X_MODES and key in names):
        held = columns.held(key)
        if held is not None:  # held on few rows: those rows alone, O(values held)
            verdict = None if known is None else known.get(key)
            if verdict is None or verdict[0] is not held:  # the same values: the same answer
                numbers = held.values.kind in ("int", "float")  # bools and categories are held as codes
                verdict = (held, numbers and grows(held.values.values.astype(np.float64), codes[held.rows]))
                if known is not None:
                    known[key] = verdict
            if verdict[1]:
                found.append(key)
        elif (values := np.asarray(columns.array(key))).dtype.kind in "iuf":
            arrays[key] = values
    if arrays:
        sample = np.linspace(0, columns.rows - 1, min(SAMPLE_ROWS, columns.rows)).astype(np.int64)
        matrix = np.stack([values[sample].astype(np.float64) for values in arrays.values()])
        same = codes[sample][1:] == codes[sample][:-1]
        down = (matrix[:, 1:][:, same] < matrix[:, :-1][:, same]).any(axis=1)  # NaN compares false
        found += [key for key, refused in zip(arrays, down, strict=True) if not refused and grows(arrays[key], codes)]
    return tuple(sorted(found))


def fill_x(frame: pd.DataFrame, x: str, train: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with logged key ``x`` given where a row lacks it, interpolated on the step between
    ``train``'s records (the effective history, whose steps only grow); rows outside them keep NaN.
    The frame itself when ``x`` is a mode or no row lacks it."""
    if x in X_MODES or not len(frame) or "step" not in frame.columns:
        return frame
    own = column_numbers(frame, x)
    missing = ~np.isfinite(own)
    if not missing.any() or x not in train.columns or "step" not in train.columns:
        return frame
    steps, known = column_numbers(train, "step"), column_numbers(train, x)
    usable = np.isfinite(steps) & np.isfinite(known)
    steps, known = steps[usable], known[usable]
    order = np.argsort(steps, kind="stable")
    filled = own.copy()
    if len(steps):
        filled[missing] = np.interp(
            column_numbers(frame, "step")[missing], steps[order], known[order], left=np.nan, right=np.nan
        )
    # concat, not assign: a frame of many keys' blocks would be copied whole
    rest = frame.drop(columns=x) if x in frame.columns else frame
    return pd.concat([rest, pd.Series(filled, index=frame.index, name=x)], axis=1)


def column_numbers(frame: pd.DataFrame, column: str) -> np.ndarray:
    """``frame``'s ``column`` as float64, NaN where it holds no number (all NaN when it is missing)."""
    if column not in frame.columns:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def x_error(x: str, keys: Iterable[str]) -> str | None:
    """Why ``x`` (from a URL) cannot be the x axis, given the run's growing ``keys``; None when it can."""
    if x in X_MODES or x in set(keys):
        return None
    return (
        f"x={x!r} is not a number that grows within each session of these runs; "
        f"drawn against the step instead (choices: {', '.join([*X_MODES, *keys][:12])})"
    )
