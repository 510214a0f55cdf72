"""Incremental chart state: what a live chart keeps so that a refresh costs the new rows, not the run.

Pure data structures (numpy only); nothing here knows plotly or Streamlit.  Each has an O(n)
oracle in the tests that it must equal after every append (house style item 10).

* ``EmaState`` — the dashboard's debiased EMA (``figures.ema_smooth``) as a running
  ``(acc, count)``: ``acc = w·acc + (1−w)·y`` over finite points only, shown as
  ``acc / (1 − wᶜᵒᵘⁿᵗ)``; a non-finite point is NaN and does not advance it.  ``figures`` smooths
  each trace (one session's rows, superseded or not) from zero, so a chart keeps one state per
  trace; when a new session starts, the earlier sessions' superseded split changes and their
  states are rebuilt (once per resume).  Cost: O(new rows).
* ``MinMaxPyramid`` — min/max downsampling with ``minmax_indices``'s guarantees (each bucket
  keeps its first point, its minimum, its maximum and its first gap; the last point is always
  kept; all rows while they fit) on buckets that depend only on the prefix: level ``k`` cuts
  the rows into aligned buckets of ``base·2ᵏ`` rows and the drawn level is the finest with at
  most ``max_points // 4`` buckets.  Appending changes only the last bucket of each level, so
  ``extend`` costs O(new rows + levels) and every bucket before the last keeps its points until
  the level coarsens (when the row count doubles): a chart can extend its traces instead of
  redrawing them.  Levels finer than the drawn one keep only their last two buckets: memory is
  O(max_points), not O(rows).
* ``RangeIndex`` — the rows whose x lies in ``[x0, x1]``, downsampled by ``minmax_indices`` only
  when they exceed a point budget: O(log n + rows in range) for x that never decreases (step,
  tokens, time within one trace); any other x is still answered, by an O(n) scan.
"""

from __future__ import annotations

import math

import numpy as np

from metrics_core.downsample import minmax_indices

_PYTHON_EMA_ROWS = 64  # below this a plain loop beats numpy's per-call overhead


class EmaState:
    """The debiased EMA of one trace, extended by new rows (see the module docstring)."""

    __slots__ = ("acc", "count", "weight")

    def __init__(self, weight: float) -> None:
        self.weight = float(weight)
        self.acc = 0.0  # w-weighted running sum of the finite points so far
        self.count = 0  # finite points so far (the debias exponent)

    def extend(self, values: np.ndarray) -> np.ndarray:
        """The smoothed values of ``values`` (appended rows); O(len(values))."""
        y = np.asarray(values, dtype=np.float64)
        w = self.weight
        if w <= 0:
            return y.copy()
        if len(y) < _PYTHON_EMA_ROWS:
            out = []
            acc, count = self.acc, self.count
            for value in y.tolist():
                if math.isfinite(value):
                    acc = w * acc + (1 - w) * value
                    count += 1
                    out.append(acc / (1 - w**count))
                else:
                    out.append(math.nan)
            self.acc, self.count = acc, count
            return np.array(out, dtype=np.float64)
        out = np.full_like(y, np.nan)
        finite = np.isfinite(y)
        v = y[finite]
        if not len(v):
            return out
        block = max(1, int(500 / -np.log(w))) if w < 1 else len(v)
        smoothed = np.empty_like(v)
        acc = self.acc
        for start in range(0, len(v), block):  # the closed form of figures.ema_smooth, from `acc`
            chunk = v[start : start + block]
            powers = w ** np.arange(1, len(chunk) + 1)
            run = acc * powers + (1 - w) * powers / w * np.cumsum(chunk * w / powers)
            smoothed[start : start + len(chunk)] = run
            acc = float(run[-1])
        out[finite] = smoothed / (1 - w ** np.arange(self.count + 1, self.count + len(v) + 1))
        self.acc, self.count = acc, self.count + len(v)
        return out


class _Level:
    """Buckets of one pyramid level from bucket ``offset`` on, in growable arrays."""

    __slots__ = ("arrays", "count", "offset")
    FIELDS = ("first", "lo", "lo_i", "hi", "hi_i", "gap")

    def __init__(self) -> None:
        self.offset = 0
        self.count = 0
        self.arrays = {name: np.empty(0, np.float64 if name in ("lo", "hi") else np.int64) for name in self.FIELDS}

    def stored(self, start: int) -> dict[str, np.ndarray]:
        return {name: array[start - self.offset : self.count - self.offset] for name, array in self.arrays.items()}

    def write(self, start: int, buckets: dict[str, np.ndarray]) -> int:
        """Set buckets ``start ..`` (replacing those after it) from ``buckets``; returns how many."""
        begin, size = start - self.offset, len(buckets["first"])
        for name, array in self.arrays.items():
            if begin + size > len(array):
                grown = np.empty(max(begin + size, 2 * len(array), 16), dtype=array.dtype)
                grown[:begin] = array[:begin]
                array = self.arrays[name] = grown
            array[begin : begin + size] = buckets[name]
        self.count = start + size
        return size

    def keep_from(self, start: int) -> None:
        """Forget buckets before ``start`` (they never change again)."""
        if start > self.offset:
            shift = start - self.offset
            for name, array in self.arrays.items():
                self.arrays[name] = array[shift : self.count - self.offset].copy()
            self.offset = start


class MinMaxPyramid:
    """Stable min/max downsampling of a growing series (see the module docstring)."""

    def __init__(self, max_points: int = 4000, *, base: int = 4) -> None:
        self.max_points = max_points
        self.budget = max(1, max_points // 4)  # buckets drawn; each keeps up to four points
        self.base = base
        self.size = 0
        self._tail = np.empty(0)  # values of the last, partial level-0 bucket
        self._levels = [_Level()]
        self.work = 0  # buckets written by the last extend (the complexity tests count it)

    @property
    def level(self) -> int:
        """The drawn level: buckets of ``base · 2**level`` rows."""
        return len(self._levels) - 1

    @property
    def bucket_rows(self) -> int:
        return self.base << self.level

    def extend(self, values: np.ndarray) -> None:
        """Append rows; O(len(values) + levels)."""
        values = np.asarray(values, dtype=np.float64)
        if not len(values):
            return
        start_bucket = self.size // self.base
        rows = np.concatenate((self._tail, values))
        self.size += len(values)
        self._tail = rows[(len(rows) - 1) // self.base * self.base :] if self.size % self.base else rows[:0]
        work = self._levels[0].write(start_bucket, _leaf_buckets(rows, start_bucket * self.base, self.base))
        changed = start_bucket
        for below, above in zip(self._levels, self._levels[1:], strict=False):
            changed //= 2
            work += above.write(changed, _combine(below.stored(2 * changed)))
        while self._levels[-1].count > self.budget:  # coarsen: once per doubling of the rows
            top = self._levels[-1]
            level = _Level()
            work += level.write(0, _combine(top.stored(top.offset)))  # top still holds every bucket
            self._levels.append(level)
        for below, above in zip(self._levels, self._levels[1:], strict=False):
            below.keep_from(2 * max(above.count - 1, 0))  # only the last parent's children can change
        self.work = work

    def indices(self) -> np.ndarray:
        """Sorted rows to draw: all rows while they fit in ``max_points``; O(points)."""
        if self.size <= self.max_points:
            return np.arange(self.size)
        return self.indices_from(0)

    def stable_buckets(self) -> int:
        """Buckets of the drawn level whose points no later append changes (until the level coarsens)."""
        return max(self._levels[-1].count - 1, 0)

    def indices_from(self, bucket: int) -> np.ndarray:
        """Sorted rows drawn for buckets ``bucket ..`` of the drawn level, and the last row."""
        top = self._levels[-1]
        parts = top.stored(max(bucket, top.offset))
        keep = np.concatenate([parts["first"], parts["lo_i"], parts["hi_i"], parts["gap"], [self.size - 1]])
        return np.unique(keep[keep >= 0])


def _leaf_buckets(rows: np.ndarray, first_row: int, base: int) -> dict[str, np.ndarray]:
    """Level-0 buckets of ``rows`` (whose first row is ``first_row``, aligned to ``base``)."""
    count = -(-len(rows) // base)
    padded = np.full(count * base, np.nan)
    padded[: len(rows)] = rows
    grid = padded.reshape(count, base)
    finite = np.isfinite(grid)
    low = np.where(finite, grid, np.inf)
    high = np.where(finite, grid, -np.inf)
    starts = first_row + np.arange(count) * base
    gaps = ~finite
    gaps.reshape(-1)[len(rows) :] = False  # padding is not a gap
    lo_i, hi_i = low.argmin(axis=1), high.argmax(axis=1)  # first occurrence; 0 when no finite value
    return {
        "first": starts,
        "lo": low[np.arange(count), lo_i],
        "lo_i": starts + lo_i,
        "hi": high[np.arange(count), hi_i],
        "hi_i": starts + hi_i,
        "gap": np.where(gaps.any(axis=1), starts + gaps.argmax(axis=1), -1),
    }


def _combine(children: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Parents of consecutive child pairs (the last parent may have one child); ties keep the left."""
    count = len(children["first"])
    left = {name: array[0::2] for name, array in children.items()}
    right = {name: array[1::2] for name, array in children.items()}
    if count % 2:  # a lone last child: its parent is itself
        right = {name: np.append(array, left[name][-1]) for name, array in right.items()}
    take_lo = right["lo"] < left["lo"]
    take_hi = right["hi"] > left["hi"]
    return {
        "first": left["first"],
        "lo": np.where(take_lo, right["lo"], left["lo"]),
        "lo_i": np.where(take_lo, right["lo_i"], left["lo_i"]),
        "hi": np.where(take_hi, right["hi"], left["hi"]),
        "hi_i": np.where(take_hi, right["hi_i"], left["hi_i"]),
        "gap": np.where(left["gap"] >= 0, left["gap"], right["gap"]),
    }


def pyramid_level(size: int, max_points: int, base: int) -> int:
    """The level ``MinMaxPyramid`` draws for ``size`` rows: the finest with at most ``max_points // 4`` buckets."""
    budget, level = max(1, max_points // 4), 0
    while -(-size // (base << level)) > budget:
        level += 1
    return level


class RangeIndex:
    """x and y of one trace, for zooming: the rows in an x-range, raw unless there are too many."""

    def __init__(self) -> None:
        self._x = np.empty(0)
        self._y = np.empty(0)
        self.size = 0
        self.sorted = True  # x never decreased: queries bisect

    def extend(self, x: np.ndarray, y: np.ndarray) -> None:
        """Append rows; amortised O(new rows)."""
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if not len(x):
            return
        if self.sorted and (
            np.isnan(x).any() or np.any(np.diff(x) < 0) or (self.size and x[0] < self._x[self.size - 1])
        ):
            self.sorted = False  # from now on queries scan (a NaN x is in no range)
        end = self.size + len(x)
        if end > len(self._x):
            capacity = max(end, 2 * len(self._x), 64)
            self._x = np.concatenate((self._x[: self.size], np.empty(capacity - self.size)))
            self._y = np.concatenate((self._y[: self.size], np.empty(capacity - self.size)))
        self._x[self.size : end], self._y[self.size : end] = x, y
        self.size = end

    def query(self, x0: float, x1: float, *, max_points: int = 4000) -> np.ndarray:
        """Sorted row numbers with ``x0 <= x <= x1``, min/max downsampled beyond ``max_points``."""
        x = self._x[: self.size]
        if self.sorted:  # O(log n + rows in range)
            rows = np.arange(np.searchsorted(x, x0, side="left"), np.searchsorted(x, x1, side="right"))
        else:  # O(n)
            rows = np.flatnonzero((x >= x0) & (x <= x1))
        if len(rows) <= max_points:
            return rows
        return rows[minmax_indices(self._y[rows], max_points)]
