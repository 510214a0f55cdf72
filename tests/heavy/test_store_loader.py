"""Closing a store while its loader reads a big run leaves a whole cache."""

from __future__ import annotations

from pathlib import Path

from metrics_core.dashboard.store import run_store as store_module
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from tests.support import append_records, base_record
from tests.support.dashboard import assert_same_view, full_view


def test_closing_a_store_while_its_loader_reads_leaves_a_whole_cache(tmp_path: Path) -> None:
    """close() right after the loader started on big runs: no reader is closed (and its cache saved)
    mid-read, and a store reopening them from the cache shows exactly what a cold read does."""
    from metrics_core.read.column_cache import CachePolicy

    runs, policy = tmp_path / "runs", CachePolicy(tmp_path / "cache", min_records=1)
    records = store_module.CALLER_READ_BYTES // 150 + 1
    for name in ("a", "b", "c"):
        append_records(runs / name / "metrics.jsonl",
                       *(base_record(s, train_loss=1.0 / (s + 1), pad="x" * 40) for s in range(records)))  # fmt: skip
    first = RunStore(runs, StoreSettings(cache=policy, loader_delay_s=0.0))
    first.runs_table()  # all three too big for the caller: the loader reads them
    first.close()
    second = RunStore(runs, StoreSettings(cache=policy))
    try:
        for name in ("a", "b", "c"):
            assert_same_view(second.view(name), full_view(second, name))
    finally:
        second.close()
