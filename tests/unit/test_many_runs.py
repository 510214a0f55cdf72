"""A root of many finished runs: what an idle server does per refresh and per alert pass is the
work of the runs that may have changed, not of every run (work counted, not timed)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from metrics_core.alerts.evaluator import AlertEvaluator
from metrics_core.alerts.rules import AlertConfig
from metrics_core.dashboard.alerting import StoreFollow
from metrics_core.dashboard.store.run_store import SETTLED_POLLS, RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.read.run_status import SETTLED
from metrics_core.roots.runs_root import LocalRoot
from tests.support import append_records, base_record

SAFETY_S = 2.0


class CountingRoot:
    """A ``LocalRoot`` read once (no watcher) that counts the calls that touch the disk."""

    def __init__(self, root: Path) -> None:
        self.inner = LocalRoot(root, watch=False)
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name in ("discover", "stamp", "unchanged", "size", "reader"):

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return value(*args, **kwargs)

            return counted
        return value


def finished_runs(root: Path, count: int) -> None:
    """``count`` finished runs of three train records, logged days before now."""
    for number in range(count):
        append_records(
            root / f"team{number % 4}" / f"run-{number:03d}" / "metrics.jsonl",
            base_record(0, event="session_start"),
            *(base_record(step, train_loss=1.0 / step) for step in (10, 20, 30)),
            base_record(30, event="session_end", status="finished"),
        )


@pytest.fixture
def filled(tmp_path: Path, writer_lock: Callable[[Path], None]) -> Iterator[tuple[RunStore, CountingRoot, list[float]]]:
    """A store on 60 finished runs and one live run (its writer's lock held), every row read (by the
    caller: a big budget)."""
    finished_runs(tmp_path, 60)
    now = datetime.now(timezone.utc).isoformat()
    append_records(tmp_path / "live" / "metrics.jsonl", {**base_record(0, event="session_start"), "time": now})
    writer_lock(tmp_path / "live" / "metrics.jsonl")
    root, clock = CountingRoot(tmp_path), [0.0]
    settings = StoreSettings(safety_interval=SAFETY_S, load_budget_s=60.0, loader_delay_s=60.0, clock=lambda: clock[0])
    store = RunStore(root, settings)
    table = store.runs_table(now=datetime.now(timezone.utc))
    assert (table["status"] == "finished").sum() == 60 and "loading" not in set(table["status"])
    assert table.set_index("run")["status"]["live"] not in SETTLED
    yield store, root, clock
    store.close()


def test_an_idle_refresh_stats_the_unsettled_runs_only(filled: tuple[RunStore, CountingRoot, list[float]]) -> None:
    """Once per safety interval a refresh of the runs page looks at the live run alone; each
    finished run is looked at once per ``SETTLED_POLLS`` intervals, and the root is not walked
    per refresh."""
    store, root, clock = filled
    root.calls.clear()
    for _ in range(SETTLED_POLLS - 1):
        clock[0] += SAFETY_S
        store.runs_table()
        store.runs_table()
    assert root.calls["unchanged"] + root.calls["stamp"] <= SETTLED_POLLS  # the live run's, not 60 per interval
    assert root.calls["reader"] == 0
    walks = root.calls["discover"]
    assert walks <= SETTLED_POLLS * SAFETY_S / 10 + 1  # every REDISCOVER_S at most
    root.calls.clear()
    clock[0] += SAFETY_S
    store.runs_table()
    assert 60 <= root.calls["unchanged"] + root.calls["stamp"] <= 62  # each finished run once, then again later
    assert root.calls["reader"] == 0


def test_an_alert_pass_skips_settled_runs_that_did_not_change(
    filled: tuple[RunStore, CountingRoot, list[float]],
) -> None:
    """The server's alerter reads what the store read: its first pass reopens no finished run
    (older than the rules' horizon, it can raise nothing), and a later pass reads through the
    store only the runs that may have changed."""
    store, root, clock = filled
    config = AlertConfig()
    reads: Counter[str] = Counter()
    read_run = store.read_run

    def counted(info: Any, use: Any, **kwargs: Any) -> Any:
        reads[info.name] += 1
        return read_run(info, use, **kwargs)

    store.read_run = counted  # type: ignore[method-assign]
    evaluator = AlertEvaluator(
        store.root, config, follow=lambda info: StoreFollow(store, info, config, None), runs=store.runs
    )
    root.calls.clear()
    evaluator.evaluate(now=datetime.now(timezone.utc))
    assert root.calls["reader"] <= 1  # no finished run read again for the rules (the live one may be)
    assert len(reads) == 61
    reads.clear()
    clock[0] += SAFETY_S
    root.calls.clear()
    evaluator.evaluate(now=datetime.now(timezone.utc))
    assert set(reads) == {"live"}
    assert root.calls["reader"] == 0
