"""Which ``train`` rows of a long block the rules need, found in a reader's columns: what the
server's alerter (``dashboard.alerting``) feeds ``RunRules`` instead of every record, so that a
first pass over a run of millions of records builds records of a few thousand.

The rules say what each kind needs (``rules.TRAIN_KINDS``, its ``lookback``); this module finds
those rows: the rows from the last ``RunRules.memory`` finite-loss windows on, and before them,
for each "last" kind and each threshold, the last row setting its value with the row before it.
It reads a "last" kind's value as ``RunRules`` does (``_VALUES``); a kind it cannot read, a kind
that needs every row, or a column of mixed types (which only the rules themselves read right):
every row.  A row counts as a finite-loss window only when it surely is one: counting too few only
feeds more rows.  tests/unit/test_alerts.py checks, over every kind, that the rules fed these rows
say what they say fed every row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from metrics_core.alerts.rules import TRAIN_KINDS, RunRules

# One event's columns as ``dashboard.alerting`` takes them: {field: (column kind, values, categories)}.
Columns = Mapping[str, tuple[str, np.ndarray, list[str]]]


def _skipped(numbers: Mapping[str, np.ndarray], missing: np.ndarray) -> np.ndarray:
    attempted = numbers.get("attempted_updates", missing)
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = numbers.get("skipped_updates_in_window", missing) / attempted
    return np.where(attempted != 0, fraction, np.nan)


# Each "last" kind's value at each row (NaN: the row sets none), as ``RunRules`` reads it.
_VALUES: dict[str, Callable[[Mapping[str, np.ndarray], np.ndarray], np.ndarray]] = {
    "clipped_fraction": lambda numbers, missing: numbers.get("clipped_fraction", missing),
    "skipped_updates": _skipped,
}


class _Numbers(Mapping[str, np.ndarray]):
    """The int and float columns of ``columns`` as float64, what the rules take for a number
    (``session_model.number``: an int or a float, never a bool), each made when read and not
    kept: the few fields the rules read cost a copy each, one at a time, not every field a run
    logs at once."""

    def __init__(self, columns: Columns) -> None:
        self._columns = columns

    def __getitem__(self, name: str) -> np.ndarray:
        kind, values, _ = self._columns[name]
        if kind not in ("int", "float"):
            raise KeyError(name)
        return values.astype(np.float64)

    def __contains__(self, name: object) -> bool:
        return name in self._columns and self._columns[name][0] in ("int", "float")  # type: ignore[index]

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._columns if name in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def needed_rows(columns: Columns, rules: RunRules) -> np.ndarray | None:
    """Of a block of train rows (``columns``, in file order, fed after what ``rules`` was fed),
    the rows the rules need, in order; None: every row."""
    kinds = {name: kind for name, (kind, _, _) in columns.items()}
    rows = len(columns["step"][1])
    if rows <= 2 * rules.memory or not set(kinds.values()) <= {"int", "float", "bool", "cat"}:
        return None
    if any(kind.lookback not in ("windows", "last") or (kind.lookback == "last" and kind.name not in _VALUES)
           for kind in TRAIN_KINDS):  # fmt: skip
        return None
    numbers = _Numbers(columns)
    missing = np.full(rows, np.nan)
    finite = np.isfinite(numbers.get("train_loss", missing))
    if kinds.get("nonfinite_loss") == "bool":
        finite &= columns["nonfinite_loss"][1] != 1
    if "nonfinite_keys" in columns:
        finite &= columns["nonfinite_keys"][1] < 0  # a window naming keys is not surely finite
    # The last row from which ``memory`` finite-loss windows follow: counted from the end, the
    # counts never decrease, so the first count to reach ``memory`` finds it.
    from_end = int(np.searchsorted(np.cumsum(finite[::-1], dtype=np.int64), rules.memory))
    start = rows - 1 - from_end
    if start <= 0:
        return None
    sessions = columns["session_id"][1][:start]
    judged = np.ones(start, dtype=bool)  # the first row is judged against the rules' last session
    judged[1:] = sessions[1:] == sessions[:-1]
    setters = []
    for kind in TRAIN_KINDS:
        if kind.lookback == "last":
            sets = np.isfinite(_VALUES[kind.name](numbers, missing)[:start])
            setters.append(sets & judged if kind.judged else sets)
    setters += [
        np.isfinite(numbers[t.key][:start])
        for t in rules.config.thresholds
        if t.event in (None, "train") and t.key in numbers
    ]
    # The row before the tail too: it says whether the tail's first row is judged.
    last = {start} | {int(found[-1]) for setter in setters if len(found := np.flatnonzero(setter))}
    head = sorted({row for setter in last for row in (setter - 1, setter) if 0 <= row < start})
    return np.concatenate([np.array(head, dtype=np.int64), np.arange(start, rows)])
