"""A restarted server lists the settled runs it read before without reading them again, from the
summaries its store kept in the cache directory, and trusts none it should not (work counted, not
timed: readers opened); a settled run holds its row's facts only, and what reading a cold root
freed is given back (what a server of ten thousand runs holds per run)."""

from __future__ import annotations

import gc
import logging
import os
import threading
from array import array
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from metrics_core.alerts.evaluator import AlertEvaluator
from metrics_core.alerts.rules import AlertConfig, RunRules
from metrics_core.dashboard.alerting import StoreFollow
from metrics_core.dashboard.store.cold_loader import ColdLoader
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.read.column_cache import CachePolicy
from tests.support import append_records, base_record
from tests.unit.test_many_runs import CountingRoot, finished_runs

RUNS = 12


def listed(root: Path, cache: Path) -> tuple[pd.DataFrame, CountingRoot, RunStore]:
    """Every row of a fresh store on ``root`` (the runs read within the call), its counting root,
    and the store (closed: its summaries kept)."""
    counting = CountingRoot(root)
    store = RunStore(counting, StoreSettings(cache=CachePolicy(cache), load_budget_s=60.0, loader_delay_s=60.0))
    try:
        table = store.runs_table(now=datetime.now(timezone.utc))
    finally:
        store.close()
    assert "loading" not in set(table["status"])
    return table.drop(columns=["last record age (s)"]).set_index("run").sort_index(), counting, store


@pytest.fixture
def root(tmp_path: Path) -> Path:
    finished_runs(tmp_path / "runs", RUNS)
    return tmp_path / "runs"


def test_a_restart_lists_unchanged_settled_runs_without_reading_them(root: Path, tmp_path: Path) -> None:
    """The second server opens no reader, and its rows are the first server's, field for field."""
    first, counting, _ = listed(root, tmp_path / "cache")
    assert counting.calls["reader"] == RUNS
    second, counting, store = listed(root, tmp_path / "cache")
    assert counting.calls["reader"] == 0
    assert store.stats["summaries"] == 0
    pd.testing.assert_frame_equal(first, second)


def test_a_run_written_since_is_read_again(root: Path, tmp_path: Path) -> None:
    """A file changed after its summary was kept is read again, and its row shows the change."""
    listed(root, tmp_path / "cache")
    changed = root / "team1" / "run-001" / "metrics.jsonl"
    append_records(changed, base_record(40, event="session_start"), base_record(50, train_loss=0.01))
    table, counting, _ = listed(root, tmp_path / "cache")
    assert counting.calls["reader"] == 1
    assert table.loc["team1/run-001", "last step"] == 50


def test_a_file_rewritten_in_place_is_read_again(root: Path, tmp_path: Path) -> None:
    """Same size and mtime, other bytes: read again, not trusted."""
    listed(root, tmp_path / "cache")
    path = root / "team2" / "run-002" / "metrics.jsonl"
    data, before = path.read_bytes(), os.stat(path)
    with open(path, "r+b") as file:  # one digit of the first record's time, same length
        file.write(data[:40].replace(b"2", b"3", 1))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.read_bytes() != data
    _, counting, _ = listed(root, tmp_path / "cache")
    assert counting.calls["reader"] >= 1


def test_a_corrupt_summary_file_is_ignored_with_a_warning(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A flipped byte in the kept summaries: that run is read again, the others are not, and it says so."""
    listed(root, tmp_path / "cache")
    [kept] = (tmp_path / "cache").glob("summaries-*.jsonl")
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0x01
    kept.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        _, counting, _ = listed(root, tmp_path / "cache")
    assert 1 <= counting.calls["reader"] <= 2
    assert "corrupt" in caplog.text


def test_a_summary_file_others_can_write_is_refused(root: Path, tmp_path: Path) -> None:
    """Kept summaries another user could have written are not trusted: every run is read."""
    listed(root, tmp_path / "cache")
    [kept] = (tmp_path / "cache").glob("summaries-*.jsonl")
    assert os.stat(kept).st_mode & 0o777 == 0o600
    os.chmod(kept, 0o666)
    _, counting, _ = listed(root, tmp_path / "cache")
    assert counting.calls["reader"] == RUNS


def test_a_released_run_holds_its_row_and_no_reader_state(root: Path, tmp_path: Path) -> None:
    """A settled run let go keeps its row's facts only, compactly: no lineage, loss trend or tails
    state; the row's loss trend the summary's own array of doubles, its metrics' numbers one array
    and their names shared with the runs that log the same; the server's alerter holds no rules
    for a run it never fed (past the horizon), and rules hold no loss window before a loss."""
    store = RunStore(root, StoreSettings(cache=CachePolicy(tmp_path / "cache"), load_budget_s=60.0))
    try:
        store.runs_table()
        entries = list(store._entries.values())
        for entry in entries:
            assert entry.reader is None and (entry.lineage, entry.trend, entry.tails) == (None, None, None)
            assert entry.row["loss trend"] is entry.summary.loss_trend
            assert isinstance(entry.summary.loss_trend, array) and len(entry.summary.loss_trend) == 3
            tails = entry.row["metrics"]
            assert tails["train_loss"][0] == entry.summary.train_loss.value
            assert not any(isinstance(value, float) for value in gc.get_referents(tails))
        assert len({id(entry.row["metrics"]._index) for entry in entries}) == 1
        config = AlertConfig()
        follow = lambda info: StoreFollow(store, info, config, None)  # noqa: E731
        evaluator = AlertEvaluator(store.root, config, follow=follow, runs=store.runs)
        evaluator.evaluate(now=datetime.now(timezone.utc))
        assert len(evaluator._runs) == RUNS and all(run.follow.rules is None for run in evaluator._runs.values())
    finally:
        store.close()
    assert RunRules(AlertConfig())._losses is None


def test_stale_lines_are_dropped_when_they_outnumber_the_runs(root: Path, tmp_path: Path) -> None:
    """A file holding three lines per run is rewritten with the last of each when read, and still restores them all."""
    listed(root, tmp_path / "cache")
    [kept] = (tmp_path / "cache").glob("summaries-*.jsonl")
    lines = kept.read_bytes().splitlines(keepends=True)
    assert len(lines) == RUNS
    kept.write_bytes(b"".join(lines * 3))
    _, counting, _ = listed(root, tmp_path / "cache")
    assert counting.calls["reader"] == 0
    assert len(kept.read_bytes().splitlines()) == RUNS


def test_the_server_alerter_asking_first_restores_too(root: Path, tmp_path: Path) -> None:
    """A restarted server's alerter may reach a run before the runs page does: it too gets the
    kept facts, no read."""
    listed(root, tmp_path / "cache")
    counting = CountingRoot(root)
    store = RunStore(
        counting, StoreSettings(cache=CachePolicy(tmp_path / "cache"), load_budget_s=60.0, loader_delay_s=60.0)
    )
    try:
        config = AlertConfig()
        follow = lambda info: StoreFollow(store, info, config, None)  # noqa: E731
        AlertEvaluator(store.root, config, follow=follow, runs=store.runs).evaluate(now=datetime.now(timezone.utc))
        assert counting.calls["reader"] == 0
        assert "loading" not in set(store.runs_table()["status"])
        assert counting.calls["reader"] == 0
    finally:
        store.close()


def test_the_cold_loader_says_when_its_queue_is_drained(root: Path) -> None:
    """Once the loader has read every queued run it calls ``drained`` (the store gives what the
    parses freed back to the OS then), after the last read."""
    reads: list[str] = []
    drained = threading.Event()
    loader = ColdLoader(
        size=lambda info: 1,
        read=lambda entry, info: reads.append(info),
        peek=lambda entry, info: None,
        big=1 << 20,
        delay_s=0.0,
        stats={"background_reads": 0},
        drained=lambda: drained.set() if len(reads) == 3 else None,
    )
    loader.queue([(SimpleNamespace(queued=False), name) for name in ("a", "b", "c")])
    loader.start()
    assert drained.wait(30.0)
    assert sorted(reads) == ["a", "b", "c"]
