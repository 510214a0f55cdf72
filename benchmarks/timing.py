"""Side-by-side timing: candidates run in interleaved batches so machine noise hits all alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_us_interleaved(
    candidates: dict[str, Callable[[], object]], *, calls: int = 1000, batches: int = 60
) -> dict[str, float]:
    """Median µs per call of each candidate, batches alternating between candidates."""
    per_call: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(batches):
        for name, fn in candidates.items():
            start = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            per_call[name].append((time.perf_counter_ns() - start) / calls / 1000)
    return {name: statistics.median(values) for name, values in per_call.items()}


def percentile(values: list[float], share: float) -> float:
    """The ``share`` quantile of sorted ``values``, nearest rank (0.5: the median's rank, 0.99: p99)."""
    return values[min(len(values) - 1, round(share * (len(values) - 1)))]
