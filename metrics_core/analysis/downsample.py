"""Downsampling that never hides the story.

A browser chart needs at most a few thousand points per trace, but a plain stride or a
reservoir sample drops exactly the points a user is looking for: a loss spike is one window in
ten thousand.  ``minmax_indices`` splits the series into equal-count buckets and keeps, from each,
the first point, the minimum and the maximum (so every spike and dip survives and the line's
shape is kept), one missing value if the bucket holds any (so a gap stays a gap), and always the
very last point (TensorBoard: "the latest datum should always be included").

A chart's caller chooses the downsampler (a ``Downsampler``: the y series and a budget in, the
sorted indices to draw out), as TensorBoard's data provider takes ``downsample=``: the code that
builds traces draws the points it is handed and never knows how they were chosen.  Min/max is the
default; ``benchmarks/bench_downsample.py`` measures it against LTTB (docs/PERFORMANCE.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Downsampler = Callable[[np.ndarray, int], np.ndarray]  # (y series, max points) -> sorted indices to keep


def minmax_indices(values: np.ndarray, max_points: int = 4000) -> np.ndarray:
    """Sorted row indices to keep so that at most ~``max_points`` remain; all rows if fewer.

    ``values`` is the y series (NaN = missing).  Each bucket contributes up to four indices, so
    buckets number ``max_points // 4``.
    """
    count = len(values)
    if count <= max_points:
        return np.arange(count)
    buckets = max(1, max_points // 4)
    edges = np.linspace(0, count, buckets + 1).astype(np.int64)
    finite = np.isfinite(values)
    if finite.all():  # no copy of a long series to mask what it does not hold
        low = high = values
        gaps = np.empty(0, dtype=np.int64)
    else:  # argmin/argmax per bucket with NaN masked out: +inf/-inf never win where a real value exists
        low = np.where(finite, values, np.inf)
        high = np.where(finite, values, -np.inf)
        gaps = _first_per_bucket(np.flatnonzero(~finite), edges)
    mins = _bucket_arg(low, edges, np.minimum)
    maxs = _bucket_arg(high, edges, np.maximum)
    return np.unique(np.concatenate([edges[:-1], mins, maxs, gaps, [count - 1]]))


def _bucket_arg(values: np.ndarray, edges: np.ndarray, reduce: np.ufunc) -> np.ndarray:
    """Index of the first reduce-extreme value within each bucket (rows ``edges[i]`` to ``edges[i + 1]``)."""
    extremes = reduce.reduceat(values, edges[:-1])
    hits = np.flatnonzero(values == np.repeat(extremes, np.diff(edges)))
    return hits[_run_starts(_bucket_of(hits, edges))]


def _bucket_of(rows: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bucket of each of ``rows``: only the rows asked about, never a map of every row."""
    return np.searchsorted(edges, rows, side="right") - 1


def _first_per_bucket(rows: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The first of ``rows`` (sorted) inside each bucket that holds any."""
    if not len(rows):
        return rows
    return rows[_run_starts(_bucket_of(rows, edges))]


def _run_starts(keys: np.ndarray) -> np.ndarray:
    """Where each run of equal values in sorted ``keys`` begins: ``np.unique(keys, return_index=True)[1]``
    without its sort."""
    return np.flatnonzero(np.concatenate((np.ones(min(len(keys), 1), dtype=bool), keys[1:] != keys[:-1])))
