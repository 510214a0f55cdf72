"""RunStore: one parse per process, snapshots replaced only when the file changed, shared derived data."""

from __future__ import annotations

import threading
from pathlib import Path

from metrics_core.dashboard.charts import ChartOptions, view_charts
from metrics_core.dashboard.store import RunStore
from tests.conftest import append_records, base_record


def test_views_are_reused_until_the_file_changes(tmp_path: Path) -> None:
    """Same snapshot object while nothing changed (so tabs share it); a new one after an append."""
    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0))
    store = RunStore(tmp_path, safety_interval=0.0)
    try:
        first = store.view("r")
        assert store.view("r") is first
        append_records(tmp_path / "r" / "metrics.jsonl", base_record(20, train_loss=0.5))
        second = store.view("r")
        assert second is not first and second.records == 2
        assert store.overview()["last step"].tolist() == [20]
    finally:
        store.close()


def test_derived_data_is_computed_once_per_snapshot_across_threads(tmp_path: Path) -> None:
    """Eight threads asking for the same charts get one computation and the same figures."""
    append_records(tmp_path / "r" / "metrics.jsonl", *(base_record(s, train_loss=1.0 / s) for s in range(1, 50)))
    store = RunStore(tmp_path)
    try:
        view = store.view("r")
        calls: list[int] = []
        results: list[object] = []

        def ask() -> None:
            results.append(view.memo("counted", lambda: calls.append(1) or len(calls)))

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert calls == [1] and results == [1] * 8
        options = ChartOptions(smoothing=0.5)
        assert view_charts(view, options) is view_charts(view, options)
    finally:
        store.close()
