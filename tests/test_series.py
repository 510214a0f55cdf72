"""Incremental chart state equals its O(n) oracle after every append, at a cost independent of history."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrics_core.dashboard.metric_figures import ema_smooth
from metrics_core.downsample import minmax_indices
from metrics_core.series import EmaState, MinMaxPyramid, RangeIndex, pyramid_level

VALUE = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 1.0, -1.0, 2.5]) | st.floats(-1e6, 1e6)
APPENDS = st.lists(st.lists(VALUE, max_size=90), min_size=1, max_size=12)


def pyramid_oracle(values: np.ndarray, max_points: int, base: int) -> np.ndarray:
    """From scratch: at the pyramid's level, each aligned bucket's first row, first min, first max, first gap."""
    if len(values) <= max_points:
        return np.arange(len(values))
    rows = base << pyramid_level(len(values), max_points, base)
    keep = [len(values) - 1]
    for start in range(0, len(values), rows):
        part = values[start : start + rows]
        finite = np.isfinite(part)
        keep += [start, start + int(np.argmin(np.where(finite, part, np.inf))),
                 start + int(np.argmax(np.where(finite, part, -np.inf)))]  # fmt: skip
        if not finite.all():
            keep.append(start + int(np.argmin(finite)))
    return np.unique(keep)


@settings(max_examples=200, deadline=None)
@given(appends=APPENDS, weight=st.sampled_from([0.0, 0.3, 0.6, 0.9, 0.99]))
def test_ema_state_equals_the_figures_smoothing_after_every_append(appends: list[list[float]], weight: float) -> None:
    """(acc, count) carried forward gives figures.ema_smooth of the whole trace, gaps included."""
    state, seen, out = EmaState(weight), [], []
    for chunk in appends:
        seen += chunk
        out += state.extend(np.array(chunk, dtype=np.float64)).tolist()
        np.testing.assert_allclose(out, ema_smooth(np.array(seen, dtype=np.float64), weight), rtol=1e-9, atol=1e-9)


def test_ema_state_large_appends_take_the_vector_path_and_still_agree() -> None:
    """Blocks longer than the plain-loop cut-off use the closed form from the carried state."""
    rng = np.random.default_rng(0)
    values = rng.normal(size=5000)
    values[rng.integers(0, 5000, 300)] = np.nan
    state = EmaState(0.999)
    out = np.concatenate([state.extend(values[i : i + 700]) for i in range(0, 5000, 700)])
    np.testing.assert_allclose(out, ema_smooth(values, 0.999), rtol=1e-9, atol=1e-12)


@settings(max_examples=300, deadline=None)
@given(appends=APPENDS, max_points=st.sampled_from([4, 8, 20, 40]), base=st.sampled_from([1, 2, 4]))
def test_pyramid_equals_its_oracle_and_keeps_minmax_guarantees_after_every_append(
    appends: list[list[float]], max_points: int, base: int
) -> None:
    """Incremental == from scratch; every bucket's min, max and first gap and the last row are kept;
    points of stable buckets never move while the level stays."""
    pyramid, seen = MinMaxPyramid(max_points, base=base), np.empty(0)
    previous: tuple[int, np.ndarray] | None = None
    for chunk in appends:
        seen = np.concatenate((seen, np.array(chunk, dtype=np.float64)))
        pyramid.extend(np.array(chunk, dtype=np.float64))
        got = pyramid.indices()
        assert got.tolist() == pyramid_oracle(seen, max_points, base).tolist()
        if len(seen):
            assert got[-1] == len(seen) - 1
            assert len(got) <= max_points + 1
        if len(seen) > max_points:
            rows = pyramid.bucket_rows
            for start in range(0, len(seen), rows):
                part = seen[start : start + rows]
                kept = set(got[(got >= start) & (got < start + rows)].tolist())
                finite = np.isfinite(part)
                if finite.any():
                    assert part[finite].min() in seen[list(kept)] and part[finite].max() in seen[list(kept)]
                if not finite.all():
                    assert any(not np.isfinite(seen[i]) for i in kept)
            if previous is not None and previous[0] == pyramid.level:
                stable_end = previous[1]
                assert got[got < stable_end].tolist() == previous[2][previous[2] < stable_end].tolist()
            previous = (pyramid.level, pyramid.stable_buckets() * pyramid.bucket_rows, got)
        else:
            previous = None


@settings(max_examples=200, deadline=None)
@given(
    appends=st.lists(st.lists(st.tuples(st.integers(0, 50), VALUE), max_size=40), min_size=1, max_size=8),
    monotone=st.booleans(),
    x0=st.integers(-5, 60),
    width=st.integers(0, 60),
    budget=st.sampled_from([4, 12, 1000]),
)
def test_range_query_equals_a_scan_after_every_append(
    appends: list[list[tuple[int, float]]], monotone: bool, x0: int, width: int, budget: int
) -> None:
    """Rows with x in [x0, x1], min/max downsampled past the budget, whether x is sorted or not."""
    index, xs, ys = RangeIndex(), [], []
    for chunk in appends:
        if monotone:
            chunk = [(len(xs) + i, y) for i, (_, y) in enumerate(chunk)]
        xs += [float(x) for x, _ in chunk]
        ys += [y for _, y in chunk]
        index.extend(np.array([x for x, _ in chunk], dtype=float), np.array([y for _, y in chunk], dtype=float))
        x, y = np.array(xs), np.array(ys)
        rows = np.flatnonzero((x >= x0) & (x <= x0 + width))
        expected = rows if len(rows) <= budget else rows[minmax_indices(y[rows], budget)]
        assert index.query(x0, x0 + width, max_points=budget).tolist() == expected.tolist()


# -- scaled-down complexity of each scale scenario (counts, not timings) -------------------------


def test_extending_the_pyramid_costs_the_new_rows_and_the_levels_not_the_history() -> None:
    """10 appended rows write about as many buckets on 200k rows as on 20k (≤ 10 + 2·levels)."""
    rng = np.random.default_rng(1)
    work = {}
    for size in (20_000, 200_000):
        pyramid = MinMaxPyramid(4000)
        pyramid.extend(rng.normal(size=size))
        costs = []
        for _ in range(20):
            pyramid.extend(rng.normal(size=10))
            costs.append(pyramid.work)
        work[size] = max(costs)
        assert work[size] <= 10 + 2 * (pyramid.level + 1)
        stored = sum(len(level.arrays["first"]) for level in pyramid._levels)
        assert stored <= 4 * 1000 + 16 * len(pyramid._levels)  # O(max_points) memory, not O(rows)
    assert work[200_000] <= 3 * work[20_000]


def test_a_zoom_touches_only_the_rows_in_range() -> None:
    """On a sorted x the range query bisects: zooming into 100 rows of 2M returns them raw."""
    index = RangeIndex()
    x = np.arange(2_000_000, dtype=float)
    index.extend(x, np.sin(x))
    rows = index.query(1_000_000, 1_000_099)
    assert rows.tolist() == list(range(1_000_000, 1_000_100))
    assert index.sorted


@pytest.mark.parametrize("weight", [0.6, 0.999])
def test_ema_state_carries_only_two_numbers(weight: float) -> None:
    """The EMA's state is O(1): (acc, count), however long the trace."""
    state = EmaState(weight)
    state.extend(np.ones(100_000))
    assert state.count == 100_000 and isinstance(state.acc, float)
