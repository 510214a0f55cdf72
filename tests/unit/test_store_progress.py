"""Long work beside the pages: a read's progress published by the reader and told by the store
without waiting, and the columnar cache written by the store's saver thread, never by a page's call."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from metrics_core.dashboard.store import run_entry
from metrics_core.dashboard.store import run_store as store_module
from metrics_core.dashboard.store.rows import RUNS_TABLE_COLUMNS
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.memo import view_findings
from metrics_core.dashboard.views.runs_table import readable_runs
from metrics_core.read import column_cache
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.line_follower import LineFollower
from metrics_core.read.run_file import LocalFile
from metrics_core.read.run_reader import RunReader
from tests.support import append_records, base_record
from tests.support.dashboard import assert_same_view, full_view


def eventually(condition: Callable[[], bool], deadline_s: float = 20.0) -> None:
    """Wait for ``condition`` (another thread's work) with a deadline; what it checks is work done."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, "condition not met"
        time.sleep(0.01)


def big_run(path: Path) -> None:
    """A run too big for a page's caller to read (over ``CALLER_READ_BYTES``)."""
    records = store_module.CALLER_READ_BYTES // 150 + 1
    append_records(path, *(base_record(s, train_loss=1.0 / (s + 1), pad="x" * 40) for s in range(records)))


def held_refreshes(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Every ``RunReader.refresh`` from now on sets the first event, then waits for the second: a
    read held under way on purpose until the test saw what the store says meanwhile."""
    reading, read = threading.Event(), threading.Event()
    refresh = RunReader.refresh

    def held(reader: RunReader, *args, **kwargs):
        reading.set()
        assert read.wait(20)
        return refresh(reader, *args, **kwargs)

    monkeypatch.setattr(RunReader, "refresh", held)
    return reading, read


def test_the_follower_publishes_bytes_read_of_the_size_it_reads_up_to_block_by_block(tmp_path: Path) -> None:
    """Between two blocks of one follow, offset says how far it came and target the size it reads up
    to; the reader's read_position is the same pair, equal once the refresh is done."""
    path = tmp_path / "run" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=0.5) for s in range(1, 201)))
    size = path.stat().st_size
    follower = LineFollower(LocalFile(path), max_record_bytes=1000, chunk=1024)
    blocks = follower.follow()
    next(blocks)
    assert 0 < follower.offset < follower.target == size
    for _ in blocks:
        assert follower.offset <= follower.target == size
    assert follower.offset == size
    reader = RunReader(path.parent)
    assert reader.read_position == (0, 0)
    reader.refresh()
    assert reader.read_position == (size, size)


def test_prepare_reads_a_big_run_beside_the_caller_and_says_how_far_it_came(tmp_path: Path) -> None:
    """prepare() never reads on the caller's thread: a big run not read yet gets its read started
    and the caller its progress (nothing read of the file's size yet), then None once view() would
    not wait; a small run is None at once (read on the caller's time).  The view equals a cold read."""
    runs = tmp_path / "runs"
    big_run(runs / "big" / "metrics.jsonl")
    append_records(runs / "small" / "metrics.jsonl", base_record(1, train_loss=1.0))
    store = RunStore(runs)
    try:
        first = store.prepare("big")
        assert first is not None
        assert (first.done, first.total) == (0, (runs / "big" / "metrics.jsonl").stat().st_size)
        eventually(lambda: store.prepare("big") is None)
        eventually(lambda: store.stats["prepared"] == 1)  # counted just after the read ends
        assert_same_view(store.view("big"), full_view(store, "big"))
        assert store.prepare("small") is None and store.stats["prepared"] == 1
    finally:
        store.close()


def test_prepare_says_the_read_goes_on_from_its_first_moment_until_its_view_is_built(
    tmp_path: Path, monkeypatch
) -> None:
    """Before the reader found the file's size, prepare() says nothing read of the size it was asked
    for; once every byte is read, while the summary and the view are built under the run's lock,
    all of them.  Never None before view() would not wait: a page told the read is over would wait
    for the view blind, on the lock.  (The reader's refresh and the view's build are held back on
    purpose, each until the test saw the store's answer.)"""
    runs = tmp_path / "runs"
    big_run(runs / "big" / "metrics.jsonl")
    size = (runs / "big" / "metrics.jsonl").stat().st_size
    reading, read = held_refreshes(monkeypatch)
    building, built = threading.Event(), threading.Event()
    build_view = run_entry.build_view

    def held_build(*args, **kwargs):
        building.set()
        assert built.wait(20)
        return build_view(*args, **kwargs)

    monkeypatch.setattr(run_entry, "build_view", held_build)
    store = RunStore(runs)
    try:
        assert store.prepare("big") is not None
        assert reading.wait(20)
        now = store.prepare("big")
        assert (now.done, now.total) == (0, size)
        read.set()
        assert building.wait(20)
        now = store.prepare("big")
        assert (now.done, now.total) == (size, size)
        built.set()
        eventually(lambda: store.prepare("big") is None)
        assert_same_view(store.view("big"), full_view(store, "big"))
    finally:
        read.set()
        built.set()
        store.close()


def test_a_page_waiting_for_a_read_is_answered_as_it_ends_and_its_findings_are_warmed_beside_it(
    tmp_path: Path, monkeypatch
) -> None:
    """prepare(wait=) returns the read's progress after ``wait`` while the read goes on, and None as
    soon as it ends, not when its wait would have: the page's charts are not a period late.  Then
    the store's ``warm`` gets the view the page is shown, on the read's thread, not the page's."""
    runs = tmp_path / "runs"
    big_run(runs / "big" / "metrics.jsonl")
    reading, read = held_refreshes(monkeypatch)
    warmed: list[tuple[object, str]] = []
    done = threading.Event()

    def warm(view: object) -> None:
        view_findings(view)
        warmed.append((view, threading.current_thread().name))
        done.set()

    store = RunStore(runs, StoreSettings(warm=warm))
    try:
        assert store.prepare("big") is not None
        assert reading.wait(20)
        start = time.monotonic()
        assert store.prepare("big", wait=0.2) is not None
        assert time.monotonic() - start >= 0.2
        answers: list[tuple[object, float]] = []
        page = threading.Thread(
            target=lambda: answers.append((store.prepare("big", wait=60), time.monotonic())), daemon=True
        )
        page.start()
        time.sleep(0.2)
        assert not answers, "prepare(wait=) returned before the read ended"
        ended = time.monotonic()
        read.set()
        page.join(30)
        assert answers and answers[0][0] is None and answers[0][1] - ended < 20
        assert done.wait(20)
        view = store.view("big")
        assert warmed == [(view, "RunStore prepare")]
        assert view.kept("findings").value == view_findings(view)  # kept by the warm-up, not computed again
    finally:
        read.set()
        store.close()


def test_a_run_re_read_beside_the_runs_table_is_not_shown_as_being_read(tmp_path: Path, monkeypatch) -> None:
    """A run whose row is drawn from its data, reopened by another of the store's readers (the
    server's alerter) while the runs table is built: the table says no read is under way.  A
    progress column that comes and goes with such a reopen changes the table's shape, and the
    page redraws every row it shows for it; only rows still loading say how far their read came."""
    runs = tmp_path / "runs"
    path = runs / "old" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0) for s in range(1, 51)))
    store = RunStore(runs, StoreSettings(idle_s=0.0, safety_interval=0.0))  # an idle run's reader is released at once
    try:
        assert store.runs_table()["progress"].isna().all()
        [info] = store.runs()
        store.read_run(info, lambda *_: None)  # as the alerter does: the idle run's reader released after
        assert store.stats["releases"] == 1
        append_records(path, base_record(51, train_loss=0.5))
        reading, read = held_refreshes(monkeypatch)
        alerter = threading.Thread(target=store.read_run, args=(info, lambda *_: None), kwargs={"need_reader": True})
        alerter.start()
        try:
            assert reading.wait(20)  # the reopen is under way, the run's lock held
            table = store.runs_table()
            assert table["progress"].isna().all() and table.loc[0, "run"] == "old"
        finally:
            read.set()
            alerter.join(20)
    finally:
        store.close()


def test_cache_saves_are_written_by_the_saver_thread_never_in_a_view(tmp_path: Path, monkeypatch) -> None:
    """A cold parse's save and a growing run's periodic save are both written by the store's saver
    thread, never by the thread that asked for the view; what they wrote reopens the run."""
    threads: list[str] = []
    save = column_cache.save

    def recorded(policy: CachePolicy, key: str, parse: column_cache.CachedParse) -> bool:
        threads.append(threading.current_thread().name)
        return save(policy, key, parse)

    monkeypatch.setattr(column_cache, "save", recorded)
    clock = [0.0]
    policy = CachePolicy(tmp_path / "cache", min_records=1000, interval_s=60.0, clock=lambda: clock[0])
    runs = tmp_path / "runs"
    path = runs / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(1, 2001)))
    store = RunStore(runs, StoreSettings(cache=policy, safety_interval=0, saver_delay_s=0))
    try:
        store.view("r")  # the cold parse: its save is due
        eventually(lambda: store.stats["cache_saves"] == 1)
        append_records(path, base_record(2001, train_loss=0.5))
        clock[0] = 61.0  # the save interval passed: the refresh that finds the append makes a save due
        assert store.view("r").records == 2001
        eventually(lambda: store.stats["cache_saves"] == 2)
    finally:
        store.close()
    assert threads == ["RunStore cache saver"] * 2
    reopened = RunReader(runs / "r", cache=policy)
    reopened.refresh()
    assert reopened.served_from_cache and reopened.records == 2001


def test_the_runs_table_shows_a_progress_column_only_while_a_run_is_read() -> None:
    """A row being read says how far it came; a table with none being read has no such column."""
    rows = [
        {"run": "big", "status": "loading", "progress": "312 MB of 780 MB · 100 MB/s · 5 s left"},
        {"run": "small", "status": "finished", "progress": None},
    ]
    table = pd.DataFrame(rows, columns=list(RUNS_TABLE_COLUMNS))
    shown = readable_runs(table).set_index("run")
    assert shown.loc["big", "progress"] == "312 MB of 780 MB · 100 MB/s · 5 s left"
    assert shown.loc["small", "progress"] == ""
    assert "progress" not in readable_runs(table.assign(progress=None)).columns
