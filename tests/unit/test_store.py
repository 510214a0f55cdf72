"""RunStore: one parse per process, snapshots replaced only when the file changed, shared derived data."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import weakref
from array import array
from collections.abc import Callable, Hashable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest

from metrics_core.dashboard.figures.chart_memo import view_chart_grid, view_chart_groups, view_charts
from metrics_core.dashboard.figures.figure_dicts import figure_json
from metrics_core.dashboard.figures.run_charts import run_charts
from metrics_core.dashboard.store import root_listing, run_entry, viewed_runs
from metrics_core.dashboard.store import run_store as store_module
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.snapshot import BOUNDED_KEPT, EMPTY, Lineage, RunView, Slots
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views import chart_specs as views_module
from metrics_core.dashboard.views.chart_specs import (
    LINE_FIELDS,
    MAX_LOGGED_CHARTS,
    ChartOptions,
    chart_fields,
    spec_makers,
)
from metrics_core.dashboard.views.config_tables import view_config
from metrics_core.dashboard.views.memo import view_charts_of, view_findings
from metrics_core.dashboard.views.runs_table import trend
from metrics_core.errors import RunNotFoundError
from metrics_core.read.run_file import RunFile
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import CRASH_REASON
from metrics_core.read.run_summary import LastValue, RunSummary
from metrics_core.roots import runs_root as roots_module
from tests.support import append_bytes, append_records, base_record
from tests.support.dashboard import assert_same_view, full_view


def view_summary(view: RunView) -> RunSummary:
    """The summary of a snapshot the O(n) way, from its frames: the test oracle of ``_summarise``."""
    train, validation = view.frames["train"], view.frames["validation"]
    config = view_config(view)
    progress = view.sessions[-1] if view.sessions else None
    skipped = _last_number(train, "skipped_updates")
    ended = view.sessions[-1].end_error if view.sessions and view.status in ("failed", "interrupted") else None
    return RunSummary(
        status=view.status,
        reason=CRASH_REASON if view.status == "crashed" else ended,
        records=view.records,
        sessions=len(view.sessions),
        started=view.sessions[0].start_time if view.sessions else None,
        last_record_time=view.last_record_time,
        last_step=progress.last_step if progress else None,
        tokens_seen=progress.last_tokens_seen if progress else None,
        skipped_updates=None if skipped is None else int(skipped.value),
        train_loss=_last_number(train, "train_loss"),
        val_loss=_last_number(validation, "val_loss"),
        bad_lines=view.ingest.bad_lines,
        pending_bytes=view.ingest.pending_bytes,
        config=config.values if config is not None else None,
        loss_trend=array("d", trend(view.effective("train")["train_loss"])) if "train_loss" in train.columns else (),
    )


def _last_number(frame: pd.DataFrame, column: str) -> LastValue | None:
    """The last number in ``frame[column]`` and its row's step (the view's frames hold numbers
    where the reader's columns do, missing values elsewhere)."""
    if column not in frame.columns:
        return None
    values = frame[column].astype("float64")
    rows = np.flatnonzero(values.notna().to_numpy())
    return LastValue(float(values.iloc[rows[-1]]), int(frame["step"].iloc[rows[-1]])) if len(rows) else None


def test_views_are_reused_until_the_file_changes(tmp_path: Path) -> None:
    """Same snapshot object while nothing changed (so tabs share it); a new one after an append."""
    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        first = store.view("r")
        assert store.view("r") is first
        append_records(tmp_path / "r" / "metrics.jsonl", base_record(20, train_loss=0.5))
        second = store.view("r")
        assert second is not first and second.records == 2
        assert store.runs_table()["last step"].tolist() == [20]
    finally:
        store.close()


def test_tabs_refreshing_one_run_check_its_path_once_per_safety_interval(tmp_path: Path) -> None:
    """Twenty tabs' refreshes within one safety interval check the run's path once (its realpaths
    are most of a refresh that finds nothing new) and get one snapshot; the next interval checks it
    again, and a run gone from the root is refused then."""
    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0))
    clock = [0.0]
    store = RunStore(tmp_path, StoreSettings(safety_interval=2.0, clock=lambda: clock[0]))
    try:
        views = {store.view("r") for _ in range(20)}
        assert len(views) == 1 and store.stats["resolves"] == 1
        clock[0] += 2.0
        store.view("r")
        assert store.stats["resolves"] == 2
        (tmp_path / "r" / "metrics.jsonl").unlink()
        clock[0] += 2.0
        with pytest.raises(RunNotFoundError):
            store.view("r")
    finally:
        store.close()


def once(slots: Slots, key: Hashable, compute: Callable[[], Any]) -> Any:
    """``compute()`` kept under ``key`` of ``slots`` (a snapshot's memo or a lineage), as the views
    and figures memoise: the first caller to take the key's lock computes, the others read."""
    kept = slots.kept(key)
    with kept.lock:
        if kept.value is EMPTY:
            kept.value = compute()
        return kept.value


def carry(slots: Slots, key: Hashable, update: Callable[[Any], Any], *, bounded: bool = False) -> Any:
    """The state under ``key`` replaced by ``update(it or None)``, as the views and figures carry it."""
    kept = slots.kept(key, bounded=bounded)
    with kept.lock:
        kept.value = update(None if kept.value is EMPTY else kept.value)
        return kept.value


def test_derived_data_is_computed_once_per_snapshot_across_threads(tmp_path: Path) -> None:
    """Eight threads asking for the same charts get one computation and the same figures."""
    append_records(tmp_path / "r" / "metrics.jsonl", *(base_record(s, train_loss=1.0 / s) for s in range(1, 50)))
    store = RunStore(tmp_path)
    try:
        view = store.view("r")
        calls: list[int] = []
        results: list[object] = []

        def ask() -> None:
            results.append(once(view, "counted", lambda: calls.append(1) or len(calls)))

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


def test_a_memo_computation_may_ask_for_another_key_without_deadlocking(tmp_path: Path) -> None:
    """Nested memo calls on different keys (a zoom needs the whole run's charts) finish, and each
    key is computed once, also with a second thread asking for the inner key meanwhile."""
    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0))
    store = RunStore(tmp_path)
    try:
        view = store.view("r")
        calls: list[str] = []
        inner = lambda: once(view, "inner", lambda: calls.append("inner") or 1)  # noqa: E731
        results: list[object] = []
        outer = lambda: results.append(once(view, "outer", lambda: inner() + 1))  # noqa: E731
        threads = [threading.Thread(target=target, daemon=True) for target in (outer, lambda: results.append(inner()))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert not any(thread.is_alive() for thread in threads), "nested memo calls deadlocked"
        assert sorted(results) == [1, 2] and calls == ["inner"]
        assert once(view, "outer", lambda: 0) == 2
    finally:
        store.close()


def test_a_lineage_carries_different_keys_side_by_side_and_one_key_an_update_at_a_time() -> None:
    """A run's first view builds its charts and its diagnostics on two threads at once: an update
    of one key never waits for another key's.  Updates of one key never overlap: each extends the
    one before (none is lost).  A bounded key dropped from the lineage leaves nothing behind."""
    lineage = Lineage()
    updating, other_done = threading.Event(), threading.Event()

    def slow(previous: object) -> str:
        updating.set()
        assert other_done.wait(10), "the other key's update waited for this one"
        return "slow"

    thread = threading.Thread(target=carry, args=(lineage, "charts", slow))
    thread.start()
    assert updating.wait(10)
    assert carry(lineage, "findings", lambda previous: "quick") == "quick"  # while "charts" is updated
    other_done.set()
    thread.join(10)
    assert carry(lineage, "charts", lambda previous: previous) == "slow"

    def bump(previous: int | None) -> int:
        time.sleep(0.01)  # two overlapping updates would both extend the same previous state
        return (previous or 0) + 1

    threads = [threading.Thread(target=carry, args=(lineage, "count", bump)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert carry(lineage, "count", lambda previous: previous) == 8
    for number in range(10 * BOUNDED_KEPT):  # a client asking for ever new options
        carry(lineage, ("options", number), lambda previous: previous, bounded=True)
    assert len(lineage._kept) == BOUNDED_KEPT + 3  # the bounded keys kept, "charts", "findings", "count"


# -- the runs page is O(runs), and each run's row is kept incrementally ------------------


def summary_of(store: RunStore, name: str) -> object:
    return store._entries[name].summary


def test_incremental_summary_equals_the_full_recount_after_every_append(tmp_path: Path) -> None:
    """Each row from the reader's column tails equals the O(n) one from the snapshot's frames, append by append."""
    path = tmp_path / "r" / "metrics.jsonl"
    appends = [
        [base_record(s, train_loss=1.0 / s) for s in (10, 20)],
        [base_record(20, event="validation", val_loss=0.7), base_record(30)],  # a window with no loss
        [base_record(20, event="session_start", session="s2"), base_record(30, session="s2", train_loss=0.4)],
        [base_record(30, event="config", session="s2", config={"optim": {"lr": 1e-4}})],
        [base_record(40, session="s2", train_loss="oops"), base_record(50, session="s2", train_loss=0.3)],
        [base_record(60, session="s2", event="session_end", status="finished")],
    ]
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        for records in appends:
            append_records(path, *records)
            store.runs_table()
            view = store.view("r")
            assert summary_of(store, "r") == view_summary(view)
    finally:
        store.close()


def test_a_snapshot_extended_from_the_last_equals_one_built_from_scratch_after_every_append(tmp_path: Path) -> None:
    """Live appends of the last session extend the previous snapshot's frames and masks; a new session,
    a resume that redoes steps, a new event, a type change and a rewrite too: each equals the oracle's
    (and each summary, with a loss trend of more than 40 points, equals the snapshot's)."""
    path = tmp_path / "r" / "metrics.jsonl"
    train = lambda steps, session="s1", **extra: [base_record(s, session=session, train_loss=1.0 / s, **extra)  # noqa: E731
                                                  for s in steps]  # fmt: skip
    appends = [
        train(range(10, 400, 10)),
        train(range(400, 600, 10)),  # the live case: only the last session's train rows grew
        [base_record(600, event="validation", val_loss=0.5), *train([610])],
        [base_record(620, event="validation", val_loss=0.4), *train([620, 630])],
        [base_record(630, event="checkpoint", path="/c/630")],  # an event logged for the first time
        [base_record(500, event="session_start", session="s2"), *train(range(500, 560, 10), "s2")],  # redoes 510..630
        train(range(560, 700, 10), "s2"),
        [base_record(700, session="s2", train_loss=float("nan")), *train([710], "s2")],  # not finite: not in the trend
        [base_record(720, session="s2", train_loss="oops"), *train([730], "s2")],  # a string: object column
        train([740], "s2"),
        [base_record(750, event="session_end", session="s2", status="finished")],
    ]
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        views = []  # held, as a page's charts hold theirs: what the next snapshot extends
        for records in appends:
            append_records(path, *records)
            views.append(store.view("r"))
            assert_same_view(views[-1], full_view(store, "r"))
            store.runs_table()
            assert summary_of(store, "r") == view_summary(views[-1])
        path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in train(range(10, 100, 10))))  # rewritten
        assert_same_view(store.view("r"), full_view(store, "r"))
    finally:
        store.close()


def test_snapshots_held_by_a_page_never_change_while_live_appends_extend_their_masks_in_place(
    tmp_path: Path,
) -> None:
    """A resumed run's masks (some rows superseded and replaced) extended by live appends past their
    buffers' slack: each snapshot equals the oracle's, its masks are read-only, and every snapshot
    held meanwhile keeps the masks it had."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0) for s in range(10, 300, 10)),
                   base_record(200, event="session_start", session="s2"),
                   *(base_record(s, session="s2", train_loss=0.5) for s in range(200, 260, 10)))  # fmt: skip
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        held = []  # (snapshot, copies of its masks when it was built)
        for number in range(12):
            steps = range(260 + 400 * number, 660 + 400 * number, 10)
            views = [store.view("r")]
            append_records(path, *(base_record(s, session="s2", train_loss=0.5) for s in steps))
            views.append(store.view("r"))
            assert_same_view(views[-1], full_view(store, "r"))
            for view in views:
                masks = [*view.superseded.values(), view.redone_by]
                assert not any(mask.flags.writeable for mask in masks)
                held.append((view, [mask.copy() for mask in masks]))
        assert (held[-1][0].redone_by == 1).any() and held[-1][0].superseded["train"].any()
        for view, masks in held:
            for mask, copy in zip([*view.superseded.values(), view.redone_by], masks, strict=True):
                np.testing.assert_array_equal(mask, copy)
    finally:
        store.close()


def test_a_live_append_extends_the_snapshot_without_a_pass_over_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an append of the last session, no supersession mask (``redone_by``) is recomputed (it is
    O(rows)); after a new session it is."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0) for s in range(10, 200, 10)),
                   base_record(190, event="validation", val_loss=0.8))  # fmt: skip
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        first = store.view("r")
        superseded = count_calls(monkeypatch, RunReader, "superseded")
        replaced = count_calls(monkeypatch, RunReader, "redone_by")
        append_records(path, base_record(200, train_loss=0.5), base_record(200, event="validation", val_loss=0.7))
        second = store.view("r")
        assert (len(superseded), len(replaced)) == (0, 0)
        assert second.frames["checkpoint"] is first.frames["checkpoint"]
        append_records(path, base_record(150, event="session_start", session="s2"))
        store.view("r")
        assert len(superseded) > 0 and len(replaced) > 0
    finally:
        store.close()


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    calls: list[int] = []
    original = getattr(owner, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def runs_table_work(root: Path, runs: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Work of a cold runs page, a no-change one and one after a single append, on ``runs`` runs."""
    for number in range(runs):
        append_records(root / f"run{number:04d}" / "metrics.jsonl",
                       *(base_record(s, train_loss=1.0 / s) for s in range(10, 60, 10)))  # fmt: skip
    frames = count_calls(monkeypatch, RunReader, "frame_columns")
    resolves = count_calls(monkeypatch, roots_module, "resolve_run")  # the local root resolves names
    store = RunStore(root, StoreSettings(safety_interval=3600.0, load_budget_s=3600.0))
    try:
        assert (store.runs_table()["status"] != "loading").all()
        cold = dict(store.stats)
        store.runs_table()
        idle = {key: store.stats[key] - cold[key] for key in cold}
        append_records(root / "run0000" / "metrics.jsonl", base_record(60, train_loss=0.1))
        before = dict(store.stats)
        deadline = time.monotonic() + 30  # until the watcher's hint names the run (a page's refresh)
        while store.runs_table().set_index("run").loc["run0000", "last step"] != 60:
            assert time.monotonic() < deadline, "the watcher never named the appended run"
            time.sleep(0.02)
        after = {key: store.stats[key] - before[key] for key in before}
    finally:
        store.close()
    return {"cold_summaries": cold["summaries"], "cold_walks": cold["find_runs"], "idle_summaries": idle["summaries"],
            "idle_builds": idle["table_builds"], "append_summaries": after["summaries"], "frames": len(frames),
            "resolves": len(resolves)}  # fmt: skip


def test_overview_work_grows_linearly_with_runs_and_an_append_touches_one_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 vs 200 runs: one walk per call, one summary per run cold, none when idle, one per appended run;
    no frame of any run is built and no run name is resolved again (no O(n²) per refresh)."""
    small = runs_table_work(tmp_path / "small", 20, monkeypatch)
    large = runs_table_work(tmp_path / "large", 200, monkeypatch)
    assert small == {"cold_summaries": 20, "cold_walks": 1, "idle_summaries": 0, "idle_builds": 0,
                     "append_summaries": 1, "frames": 0, "resolves": 0}  # fmt: skip
    assert large == {**small, "cold_summaries": 200}
    assert large["cold_summaries"] <= 10 * small["cold_summaries"]


def test_live_appends_to_a_run_logging_200_keys_build_only_what_the_page_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live appends to a run whose records log 200 keys: no frame of every field is built (each
    default chart draws from a frame of its own fields, the keys' charts from one of the drawn
    keys), the keys' charts are made once while the keys stay the same and again when one is added,
    and the carried charts equal a full build."""
    logged = lambda step: {f"k/{n:03}": float(step % 7 + n) for n in range(200)}  # noqa: E731
    path = tmp_path / "run" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s, **logged(s)) for s in range(10, 40, 10)))
    options = ChartOptions()
    store = RunStore(tmp_path, StoreSettings(safety_interval=0))
    try:
        page = lambda view: (view_chart_groups(view, options), view_findings(view))  # noqa: E731
        page(store.view("run"))
        frames = count_calls(monkeypatch, RunReader, "frame")
        made = count_calls(monkeypatch, views_module, "_logged_chart")
        for step in range(40, 70, 10):
            append_records(path, base_record(step, train_loss=1.0 / step, **logged(step)))
            view = store.view("run")
            page(view)
        specs = {key: make() for key, make in spec_makers(view, options.history, charts=view_charts_of(view)).items()}
        assert (len(frames), len(made)) == (0, 0)
        assert max(len(series.frame.columns) for spec in specs.values() for series in spec.series) <= len(
            LINE_FIELDS) + MAX_LOGGED_CHARTS  # fmt: skip
        own = {chart.key: chart_fields([chart]) for chart in view_charts_of(view) if not chart.group}
        assert all(set(series.frame.columns) <= own[key] for key in own for series in specs[key].series)
        append_records(path, base_record(70, train_loss=0.5, **logged(70), extra=1.5))
        view = store.view("run")
        assert "key:extra" in {chart.key for chart in view_charts_of(view)} and len(made) == 201
        assert figure_json(view_charts(view, options)) == figure_json(run_charts(view, options))
    finally:
        store.close()


def test_a_cold_root_is_listed_at_once_and_filled_in_in_the_background(tmp_path: Path) -> None:
    """With no load budget, the first call lists every run (not read yet: 'loading') and reads none
    itself; the loader thread reads them all, with no call asking for it."""
    for name in ("a", "b", "c"):
        append_records(tmp_path / name / "metrics.jsonl", base_record(10, train_loss=1.0))
    store = RunStore(tmp_path, StoreSettings(load_budget_s=0.0, loader_delay_s=0.0))
    try:
        first = store.runs_table()
        assert first["run"].tolist() == ["a", "b", "c"]
        assert set(first["status"]) <= {"loading", "crashed"}
        deadline = time.monotonic() + 60
        while store.stats["background_reads"] < 3:
            assert time.monotonic() < deadline, "the background loader did not finish"
            time.sleep(0.01)
        assert store.runs_table()["status"].tolist() == ["crashed"] * 3
        assert store.stats["summaries"] == 3
    finally:
        store.close()


def test_a_loader_that_dies_does_not_stop_later_calls_from_loading(tmp_path: Path, monkeypatch) -> None:
    """An unforeseen error kills the loader thread while it peeks at a big run: the next runs_table()
    starts another loader, which reads every queued run."""
    records = store_module.CALLER_READ_BYTES // 150 + 1  # too big for a page's call: the loader's
    for name in ("a", "b"):
        append_records(tmp_path / name / "metrics.jsonl",
                       *(base_record(s, train_loss=1.0, pad="x" * 40) for s in range(records)))  # fmt: skip
    failures = []

    def peek_fails_once(name: str, file: RunFile) -> None:
        if not failures:
            failures.append(name)
            raise RuntimeError("unforeseen")
        return None

    monkeypatch.setattr(run_entry, "peek_row", peek_fails_once)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the dying thread's traceback
    store = RunStore(tmp_path, StoreSettings(load_budget_s=0.0, loader_delay_s=0.0))
    try:
        store.runs_table()
        deadline = time.monotonic() + 60
        while store.stats["background_reads"] < 2:
            assert time.monotonic() < deadline, f"queued runs never read after the loader died ({failures})"
            store.runs_table()
            time.sleep(0.05)
        assert failures and store.runs_table()["status"].tolist() == ["crashed", "crashed"]
    finally:
        store.close()


def test_a_big_cold_run_is_read_by_the_loader_never_on_a_page_call(tmp_path: Path) -> None:
    """Even with time left in the budget, a page's call reads only small cold runs; a run of more than
    CALLER_READ_BYTES is listed and read in the background, and its page can be opened meanwhile."""
    append_records(tmp_path / "small" / "metrics.jsonl", base_record(10, train_loss=1.0))
    records = store_module.CALLER_READ_BYTES // 150 + 1  # a record is > 150 bytes
    append_records(
        tmp_path / "big" / "metrics.jsonl", *(base_record(s, train_loss=1.0, pad="x" * 40) for s in range(records))
    )
    store = RunStore(tmp_path, StoreSettings(load_budget_s=3600.0, loader_delay_s=0.0))
    try:
        first = store.runs_table().set_index("run")["status"]
        assert first["small"] == "crashed" and first["big"] in ("loading", "crashed")
        assert store.view("big").records == records
        deadline = time.monotonic() + 60
        while store.stats["background_reads"] < 1:
            assert time.monotonic() < deadline, "the background loader did not read the big run"
            time.sleep(0.01)
        assert store.runs_table()["status"].tolist() == ["crashed", "crashed"]
    finally:
        store.close()


def test_a_big_cold_run_shows_its_last_records_from_the_tail_until_it_is_read(tmp_path: Path) -> None:
    """Before the loader reads a big run, its row has the last step, tokens and losses of the last
    valid records of its tail (a torn last line and a string loss skipped), and their age."""
    append_records(tmp_path / "a" / "metrics.jsonl", base_record(10, train_loss=1.0))
    records = store_module.CALLER_READ_BYTES // 150 + 1
    append_records(tmp_path / "big" / "metrics.jsonl",
                   *(base_record(s, train_loss=1.0 / (s + 1), pad="x" * 40) for s in range(records)),
                   base_record(records, event="validation", val_loss=0.25),
                   base_record(records + 1, train_loss="oops"))  # fmt: skip
    append_bytes(tmp_path / "big" / "metrics.jsonl", b'{"schema_version": 1, "step": 99')  # torn
    store = RunStore(tmp_path, StoreSettings(load_budget_s=0.0, safety_interval=3600.0, loader_delay_s=0.0))
    try:
        [first, _] = store.runs()
        with store._entry(first).lock:  # the loader, done peeking, waits to read "a"
            deadline = time.monotonic() + 60
            while pd.isna((row := store.runs_table().set_index("run").loc["big"])["last step"]):
                assert time.monotonic() < deadline, "the big run was never peeked at"
                time.sleep(0.01)
            assert row["status"] == "loading" and row["last step"] == records + 1
            assert row["tokens seen"] == (records + 1) * 100 and row["train loss"] == 1.0 / records
            assert row["val loss"] == 0.25 and row["last record age (s)"] > 0
        loaded = store._entries["big"]
        deadline = time.monotonic() + 60
        while loaded.summary is None:
            assert time.monotonic() < deadline, "the big run was never read"
            time.sleep(0.01)
        assert store.runs_table().set_index("run").loc["big", "status"] == "crashed"
    finally:
        store.close()


def test_a_run_busy_in_another_thread_does_not_hold_up_the_overview(tmp_path: Path) -> None:
    """A run whose lock another thread holds (a tab snapshotting it, the loader reading it) keeps
    its row; every other run is refreshed, and the busy one is once it is free."""
    for name in ("a", "b"):
        append_records(tmp_path / name / "metrics.jsonl", base_record(10, train_loss=1.0))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        store.runs_table()
        for name in ("a", "b"):
            append_records(tmp_path / name / "metrics.jsonl", base_record(20, train_loss=0.5))
        tables: list[object] = []
        with store._entries["a"].lock:
            worker = threading.Thread(target=lambda: tables.append(store.runs_table()), daemon=True)
            worker.start()
            worker.join(timeout=30)
            assert tables, "runs_table() waited for a busy run"
        assert tables[0]["last step"].tolist() == [10, 20]
        assert store.runs_table()["last step"].tolist() == [20, 20]
    finally:
        store.close()


def test_an_idle_overview_only_recomputes_ages(tmp_path: Path) -> None:
    """No change: the same rows, the table not rebuilt, and the record age follows the clock."""
    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0))
    store = RunStore(tmp_path, StoreSettings(safety_interval=3600.0))
    try:
        first = store.runs_table()
        builds = store.stats["table_builds"]
        later = store.runs_table(now=datetime.now(timezone.utc) + timedelta(seconds=30))
        assert store.stats["table_builds"] == builds
        assert later["last record age (s)"].iloc[0] == pytest.approx(first["last record age (s)"].iloc[0] + 30, abs=1)
    finally:
        store.close()


def test_the_overview_generation_moves_only_when_a_row_or_the_run_list_changes(tmp_path: Path) -> None:
    """Idle calls and the periodic rediscovery leave it alone; an append and a new run move it."""
    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0))
    clock = [0.0]
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0, clock=lambda: clock[0]))
    try:
        store.runs_table()
        idle = store.runs_table_generation()
        for _ in range(3):
            clock[0] += root_listing.REDISCOVER_S  # find_runs again, same runs
            store.runs_table()
        assert store.runs_table_generation() == idle
        append_records(tmp_path / "r" / "metrics.jsonl", base_record(20, train_loss=0.5))
        clock[0] += 1.0
        store.runs_table()
        appended = store.runs_table_generation()
        assert appended != idle
        append_records(tmp_path / "s" / "metrics.jsonl", base_record(10, train_loss=1.0))
        clock[0] += root_listing.REDISCOVER_S
        assert store.runs_table()["run"].tolist() == ["r", "s"]
        assert store.runs_table_generation() != appended
    finally:
        store.close()


# -- memory O(runs) + O(records of the live and viewed runs) ------------------------------

MEMORY_NOW = datetime(2026, 11, 29, 10, 34, tzinfo=timezone.utc)  # base_record's step 2000 is 10:33:20


def memory_root(root: Path, finished: int, hold: Callable[[Path], None] | None, records: int = 2000) -> None:
    """``finished`` ended runs of ``records`` records and one run "live" at ``MEMORY_NOW``, its
    writer's lock held by ``hold`` (the ``writer_lock`` fixture; None: its writer is gone)."""
    for number in range(finished):
        append_records(root / f"run{number:02d}" / "metrics.jsonl",
                       *(base_record(s, train_loss=1.0 / s) for s in range(1, records + 1)),
                       base_record(records, event="session_end", status="finished"))  # fmt: skip
    append_records(
        root / "live" / "metrics.jsonl", *(base_record(s, train_loss=1.0 / s) for s in range(1, records + 1))
    )
    if hold is not None:
        hold(root / "live" / "metrics.jsonl")


def listed_store(root: Path, clock: list[float], **options: object) -> RunStore:
    """A store that read every run of ``root`` in its first ``runs_table()`` (no loader, no budget)."""
    store = RunStore(root, StoreSettings(safety_interval=0.0, load_budget_s=3600.0, clock=lambda: clock[0], **options))
    assert "loading" not in store.runs_table(now=MEMORY_NOW)["status"].tolist()
    return store


def test_a_listed_root_holds_the_records_of_its_live_run_only_whatever_the_number_of_runs(
    tmp_path: Path, writer_lock: Callable[[Path], None]
) -> None:
    """3 or 12 finished runs of 2,000 records: once listed, readers hold the live run's 2,000 records
    (the old store held every run's: 26,024 for 12); the finished runs' rows are all there."""
    for finished in (3, 12):
        root = tmp_path / f"root{finished}"
        memory_root(root, finished, writer_lock)
        store = listed_store(root, [0.0])
        try:
            table = store.runs_table(now=MEMORY_NOW).set_index("run")
            assert table.loc["live", "status"] == "live" and (table.drop(index="live")["status"] == "finished").all()
            assert (table["last step"] == 2000).all() and len(table) == finished + 1
            assert store.held_records() == 2000
            assert store.stats["releases"] == finished
        finally:
            store.close()


def test_a_viewed_run_keeps_its_reader_and_follows_appends_until_nobody_viewed_it_for_a_while(
    tmp_path: Path, writer_lock: Callable[[Path], None]
) -> None:
    """A run opened by a page keeps its reader (each view extends it with the appended records); neither
    viewed nor changed for idle_s it is released at the next runs page; appended to once released, its
    row shows the new records (a fresh reader), which it keeps while it changes (the next append is not
    a re-read, even with records too old to read live), and the view built then equals a cold read's."""
    memory_root(tmp_path, 4, writer_lock)
    clock = [0.0]
    store = listed_store(tmp_path, clock, idle_s=30.0)
    try:
        assert store.view("run01").records == 2001 and store.held_records() == 4001
        views = store.stats["views"]
        for step in (2001, 2002):
            append_records(tmp_path / "run01" / "metrics.jsonl", base_record(step, session="s2", train_loss=0.5))
            clock[0] += 1.0
            assert store.view("run01").sessions[-1].last_step == step
            store.runs_table(now=MEMORY_NOW)
            assert store.held_records() == 2000 + 2001 + step - 2000
        assert store.stats["views"] == views + 2 and store.stats["reopens"] == 1  # the first view reopened it
        clock[0] += 30.0
        later = MEMORY_NOW + timedelta(hours=1)  # no run live any more
        assert store.runs_table(now=later).set_index("run").loc["run01", "last step"] == 2002
        assert store.held_records() == 0
        run03 = tmp_path / "run03" / "metrics.jsonl"
        append_records(run03, base_record(2001, event="session_start", session="s2"))
        clock[0] += 1.0
        assert store.runs_table(now=later).set_index("run").loc["run03", "sessions"] == 2
        assert store.held_records() == 2002 and store.stats["reopens"] == 2  # read again, and kept: it changes
        append_records(run03, base_record(2010, session="s2", train_loss=0.25))
        clock[0] += 1.0
        row = store.runs_table(now=later).set_index("run").loc["run03"]
        assert (row["sessions"], row["last step"], row["train loss"]) == (2, 2010, 0.25)
        assert store.stats["reopens"] == 2 and store.held_records() == 2003
        assert_same_view(store.view("run03"), full_view(store, "run03"))
        clock[0] += 30.0
        store.runs_table(now=later)
        assert store.held_records() == 0
    finally:
        store.close()


def test_viewed_runs_beyond_the_record_budget_are_released_least_recently_viewed_first(
    tmp_path: Path, writer_lock: Callable[[Path], None]
) -> None:
    """With a budget of 5,000 records, viewing three finished runs of 2,001 recent_s apart keeps the
    last two viewed."""
    memory_root(tmp_path, 3, writer_lock)
    clock = [0.0]
    store = listed_store(tmp_path, clock, view_budget_records=5000, recent_s=5.0)
    try:
        for name in ("run00", "run01", "run02"):
            store.view(name)
            clock[0] += 5.0
        assert store.held_records() == 2000 + 2 * 2001
        assert store._entries["run00"].reader is None and store._entries["run02"].reader is not None
    finally:
        store.close()


def test_two_tabs_on_two_runs_over_the_budget_keep_both_until_one_is_left(
    tmp_path: Path, writer_lock: Callable[[Path], None]
) -> None:
    """Two tabs refreshing two finished runs of 2,001 records each, with a budget of 3,000: each view
    used to release the other tab's run, whose next refresh reopened it and rebuilt its snapshot
    (and so its charts' lineage).  Runs viewed in the last recent_s stay over the budget: no reopen,
    no rebuild; once one tab is gone for recent_s, the next view of the other releases its run."""
    memory_root(tmp_path, 2, writer_lock)
    clock = [0.0]
    store = listed_store(tmp_path, clock, view_budget_records=3000, recent_s=5.0)
    try:
        first = {name: store.view(name) for name in ("run00", "run01")}
        reopens, views = store.stats["reopens"], store.stats["views"]
        for _ in range(10):  # each tab refreshes every 2 s, one second apart
            for name in ("run00", "run01"):
                clock[0] += 1.0
                assert store.view(name) is first[name]
        assert store.stats["reopens"] == reopens and store.stats["views"] == views
        assert store.held_records() == 2000 + 2 * 2001
        left = clock[0] - 1.0  # run00's tab closes: its last view
        while clock[0] - left < 5.0:
            assert store._entries["run00"].reader is not None
            clock[0] += 1.0
            store.view("run01")
        assert store._entries["run00"].reader is None and store.held_records() == 2000 + 2001
        assert store.stats["reopens"] == reopens and store.stats["releases"] >= 3
    finally:
        store.close()


def test_a_run_viewed_while_being_trimmed_keeps_its_reader_and_a_busy_one_is_released_later(
    tmp_path: Path, writer_lock: Callable[[Path], None]
) -> None:
    """The interleavings of two threads, in one thread: ``ViewedRuns.trim`` picks run00 (over the budget,
    not viewed for recent_s), then a view of run00 comes before the eviction step (``ViewedRuns.unview`` with the
    viewed_at it saw): run00 stays viewed, so the next runs page keeps its reader (it used to lose its
    fresh viewed_at and be released under a page showing it).  And a run whose lock another thread
    holds when it would be trimmed stays viewed, and the next view releases it (it used to be
    forgotten unreleased: held for good while no runs page runs)."""
    memory_root(tmp_path, 2, writer_lock)
    clock = [0.0]
    store = listed_store(tmp_path, clock, view_budget_records=3000, recent_s=5.0)
    run00 = store._entries["run00"]
    try:
        store.view("run00")
        seen = run00.viewed_at
        clock[0] += 10.0  # run00 is now the trim's to evict ...
        store.view("run00")  # ... but a tab views it first
        assert store._viewed.unview(run00, seen) == 0
        assert "run00" in store._viewed and run00.viewed_at == clock[0]
        store.runs_table(now=MEMORY_NOW)
        assert run00.reader is not None and store.held_records() == 2000 + 2001

        clock[0] += 10.0
        with run00.lock:  # another thread is reading run00
            store.view("run01")  # over the budget, run00 not viewed lately: trimmed, but busy
        assert "run00" in store._viewed and run00.reader is not None
        clock[0] += 1.0
        store.view("run01")
        assert "run00" not in store._viewed and run00.reader is None
        assert store.held_records() == 2000 + 2001
    finally:
        store.close()


def test_a_live_run_that_stops_is_released_and_its_status_still_follows_its_writer(tmp_path: Path) -> None:
    """The live run, an hour later with its writer's lock still held, reads stalled and its reader
    goes; once the lock is gone it reads crashed, with no read of its file (the released state's
    lock probe): a released run that did not change costs a stat and that probe."""
    import os

    from metrics_core.write.crash_safety import lock_exclusive

    memory_root(tmp_path, 2, None)
    clock = [0.0]
    store = listed_store(tmp_path, clock)
    writer = os.open(tmp_path / "live" / "metrics.jsonl", os.O_WRONLY | os.O_APPEND)
    try:
        lock_exclusive(writer)  # a hung trainer: the lock held, nothing written
        summaries = store.stats["summaries"]
        clock[0] += 1.0
        hung = store.runs_table(now=MEMORY_NOW + timedelta(hours=1)).set_index("run")
        assert hung.loc["live", "status"] == "stalled" and store.held_records() == 0
        os.close(writer)
        writer = None
        clock[0] += 1.0
        assert store.runs_table(now=MEMORY_NOW + timedelta(hours=2)).set_index("run").loc["live", "status"] == "crashed"
        assert store.stats["summaries"] == summaries and store.stats["reopens"] == 0
    finally:
        if writer is not None:
            os.close(writer)
        store.close()


def test_a_released_run_is_reopened_from_the_cache_when_the_store_has_one(
    tmp_path: Path, writer_lock: Callable[[Path], None]
) -> None:
    """Closing a released reader saves its cache; the reopen after an append reads only the new bytes."""
    from metrics_core.read.column_cache import CachePolicy

    runs = tmp_path / "runs"
    memory_root(runs, 1, writer_lock)
    store = listed_store(runs, [0.0], cache=CachePolicy(tmp_path / "cache", min_records=1))
    try:
        assert store.held_records() == 2000
        append_records(runs / "run00" / "metrics.jsonl", base_record(2001, session="s2", train_loss=0.5))
        view = store.view("run00")
        assert store._entries["run00"].reader.served_from_cache  # restored, not parsed cold
        assert_same_view(view, full_view(store, "run00"))
    finally:
        store.close()


# -- a live update of a long run costs O(appended records) ------------------------------


def long_run(path: Path, steps: range, session: str = "s1") -> None:
    values = lambda s: {"train_loss": 2.0 + 1.0 / s + 0.01 * (s % 7), "grad_norm_avg": 1.0, "grad_norm_max": 2.0,  # noqa: E731
                        "lr": 1e-4, "clipped_fraction": 0.1, "skipped_updates_in_window": 0, "tokens": 100}  # fmt: skip
    append_records(path, *(base_record(s, session=session, **values(s)) for s in steps))


def drawn(figure: object, name: str) -> tuple[np.ndarray, np.ndarray]:
    [trace] = [t for t in figure.data if t.name == name]
    return np.asarray(trace.x, dtype=np.float64), np.asarray(trace.y, dtype=np.float64)


def test_a_live_update_of_a_long_run_draws_every_new_record_from_a_short_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first build of a 30k-record run, ten appended records are drawn raw and exactly
    (smoothed too, to 1e-6) on top of the unchanged drawn prefix, from a tail of O(warm-up + 10)
    rows, not the 30k; a new session means a full build."""
    from metrics_core.dashboard.figures import chart_memo

    path = tmp_path / "r" / "metrics.jsonl"
    long_run(path, range(10, 300_001, 10))
    rows_seen: list[int] = []
    original = chart_memo.run_charts

    def counted(drawing: Callable[..., object]) -> Callable[..., object]:
        def draw(view: RunView, options: ChartOptions, **kw: object) -> object:
            rows_seen.append(len(view.frames["train"]))
            return drawing(view, options, **kw)

        return draw

    for drawing in ("run_charts", "chart_builders"):  # a tail's charts; a full build's, drawn one by one
        monkeypatch.setattr(chart_memo, drawing, counted(getattr(chart_memo, drawing)))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        options = ChartOptions(smoothing=0.6)
        first = view_charts(store.view("r"), options)
        for round_ in range(3):
            steps = range(300_010 + 100 * round_, 300_101 + 100 * round_, 10)
            long_run(path, steps)
            view = store.view("r")
            figures = view_charts(view, options)
            full = original(view, options)
            xs, ys = drawn(figures["loss"], "train · S1")
            old_xs, _ = drawn(first["loss"], "train · S1")
            assert np.array_equal(xs[: len(old_xs)], old_xs)  # the base, as first drawn
            frame = view.frames["train"].set_index("step")
            assert xs[-10:].tolist() == list(steps)
            assert ys[-10:] == pytest.approx(frame.loc[list(steps), "train_loss"].to_numpy(), rel=1e-6)
            smooth_x, smooth_y = drawn(figures["loss"], "train · S1 (smoothed)")
            exact = dict(zip(*drawn(full["loss"], "train · S1 (smoothed)"), strict=True))
            assert smooth_y[-1] == pytest.approx(exact[smooth_x[-1]], rel=1e-6)
        warmup = chart_memo.warmup_rows(options)
        assert rows_seen == [30_000] + [warmup + 10] * 3  # O(appended + warm-up), not O(run)
        long_run(path, range(300_000, 300_101, 10), session="s2")
        rows_seen.clear()
        view_charts(store.view("r"), options)
        assert rows_seen == [30_030 + 11]
    finally:
        store.close()


def test_a_first_build_draws_each_chart_when_the_page_asks_and_a_live_update_extends_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a run's first view the grid draws a chart only when the page asks for it (a big run's
    first chart is shown while the others are drawn); ``view_charts`` then takes those figures, each
    drawn once.  Once the lineage carries the options, the grid holds the extended charts."""
    from metrics_core.dashboard.figures import run_charts as run_charts_module

    path = tmp_path / "run" / "metrics.jsonl"
    long_run(path, range(10, 25_001, 10))
    append_records(path, base_record(25_010, **{"opt/mfu": 0.4}))
    drawn_keys: list[str] = []
    original = run_charts_module.spec_figure

    def counted(view: RunView, key: str, *args: object) -> object:
        drawn_keys.append(key)
        return original(view, key, *args)

    monkeypatch.setattr(run_charts_module, "spec_figure", counted)
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        options = ChartOptions(smoothing=0.6)
        view = store.view("run")
        grid = view_chart_grid(view, options)
        assert grid.groups == {
            "": ["loss", "clipped", "skipped", "grad_norm", "lr", "throughput"],
            "opt": ["key:opt/mfu"],
        }
        first = grid.figure("loss")
        assert drawn_keys == ["loss"]
        figures = view_charts(view, options)
        assert figures["loss"] is first and sorted(drawn_keys) == sorted(figures)
        assert all(grid.figure(key) is figure for key, figure in figures.items())
        assert grid.groups == {group: list(keyed) for group, keyed in view_chart_groups(view, options)[0].items()}
        assert figure_json(figures) == figure_json(run_charts(view, options))
        long_run(path, range(25_020, 25_101, 10))
        drawn_keys.clear()
        view = store.view("run")
        grid = view_chart_grid(view, options)
        carried = view_charts(view, options)
        assert all(grid.figure(key) is figure for key, figure in carried.items())
        assert len(drawn_keys) == len(carried)  # once each, from a short tail (the test above)
        assert figure_json(carried["loss"]) != figure_json(figures["loss"])
    finally:
        store.close()


def test_a_first_build_left_half_drawn_does_not_keep_its_snapshot_alive(tmp_path: Path) -> None:
    """A page interrupted after its first chart leaves the build in the snapshot's memo: once the
    run moved on, the old snapshot is freed as soon as nothing uses it, not by the garbage
    collector (which may not run for minutes while it holds a big run's rows)."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(1, 200)))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    gc.disable()
    try:
        view = store.view("r")
        view_chart_grid(view, ChartOptions(smoothing=0.2)).figure("loss")
        old = weakref.ref(view)
        del view
        append_records(path, base_record(300, train_loss=0.5))
        store.view("r")
        assert old() is None
    finally:
        gc.enable()
        store.close()


def test_findings_of_a_live_run_are_recomputed_at_most_a_share_of_a_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snapshots within cost / REBUILD_CPU_SHARE seconds of the last check reuse its findings."""
    from metrics_core.dashboard.views import memo as live_views

    calls: list[int] = []
    monkeypatch.setattr(live_views, "diagnose", lambda **kw: calls.append(len(kw["train"])) or [])
    monkeypatch.setattr(live_views, "REBUILD_CPU_SHARE", 1e-9)  # every check "costs" far more than its interval
    path = tmp_path / "r" / "metrics.jsonl"
    long_run(path, range(10, 101, 10))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        live_views.view_findings(store.view("r"))
        long_run(path, range(110, 121, 10))
        live_views.view_findings(store.view("r"))
        assert calls == [10]
        monkeypatch.setattr(live_views, "REBUILD_CPU_SHARE", 1e9)
        long_run(path, range(130, 141, 10))
        live_views.view_findings(store.view("r"))
        assert calls == [10, 14]
    finally:
        store.close()


def test_a_zoomed_chart_holds_every_raw_record_in_range_and_the_run_around_it(tmp_path: Path) -> None:
    """Zoomed into 1,000 of 30,000 records: all 1,000 raw in range (the whole-run chart holds far fewer
    there), the same downsampled points outside it."""
    from metrics_core.dashboard.figures.chart_memo import zoom_chart

    long_run(tmp_path / "r" / "metrics.jsonl", range(10, 300_001, 10))
    store = RunStore(tmp_path)
    try:
        view, options = store.view("r"), ChartOptions(smoothing=0.6)
        whole_x, _ = drawn(view_charts(view, options)["loss"], "train · S1")
        xs, ys = drawn(zoom_chart(view, options, "loss", (100_005.0, 110_000.0)), "train · S1")
        inside = (xs >= 100_005) & (xs <= 110_000)
        assert xs[inside].tolist() == list(range(100_010, 110_001, 10))
        assert ((whole_x >= 100_005) & (whole_x <= 110_000)).sum() < 500
        assert np.array_equal(xs[~inside], whole_x[(whole_x < 100_005) | (whole_x > 110_000)])
        frame = view.frames["train"].set_index("step")
        assert ys[inside] == pytest.approx(frame.loc[list(range(100_010, 110_001, 10)), "train_loss"], rel=1e-6)
    finally:
        store.close()


def test_a_restarted_store_reopens_a_big_run_from_its_own_cache_dir(tmp_path: Path) -> None:
    """The cache lives in the dashboard's directory, not the runs root; a second store reads only new bytes."""
    from metrics_core.read.column_cache import CachePolicy

    runs, cache = tmp_path / "runs", tmp_path / "cache"
    path = runs / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(1, 2001)))
    policy = CachePolicy(cache, min_records=1)
    first = RunStore(runs, StoreSettings(cache=policy))
    try:
        cold = first.view("r")
    finally:
        first.close()  # readers save what they parsed
    assert list(cache.iterdir()) and sorted(p.name for p in (runs / "r").iterdir()) == ["metrics.jsonl"]
    append_records(path, base_record(2001, train_loss=0.1))
    second = RunStore(runs, StoreSettings(cache=policy))
    try:
        warm = second.view("r")
        entry = second._entries["r"]
        assert entry.reader.served_from_cache  # restored, not parsed cold
        assert warm.records == cold.records + 1
        np.testing.assert_array_equal(warm.frames["train"]["step"], np.arange(1, 2002))
    finally:
        second.close()


def test_the_cache_dir_defaults_outside_the_runs_root_and_is_refused_inside_it(tmp_path: Path) -> None:
    """--cache-dir defaults to $METRICS_CACHE_DIR, then XDG, then ~/.cache; inside the runs root is an error."""
    from metrics_core.dashboard.settings import parse_settings

    runs = tmp_path / "runs"
    assert parse_settings(["--runs", str(runs)], {"XDG_CACHE_HOME": str(tmp_path / "x")}).cache == (
        tmp_path / "x" / "metrics_core"
    )
    assert parse_settings([], {"METRICS_CACHE_DIR": str(tmp_path / "c")}).cache == tmp_path / "c"
    assert parse_settings(["--no-cache"], {}).cache is None
    with pytest.raises(SystemExit, match="inside the runs root"):
        parse_settings(["--runs", str(runs), "--cache-dir", str(runs / ".cache")], {})


def test_a_live_page_holds_a_bounded_set_of_snapshots_and_figures_and_gives_freed_memory_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tab on a live run, an append every 0.25 s: after each, the snapshot, its charts and their
    payloads (what the page and the live route build); the objects alive (the snapshots, their
    columns, the encoded figures, the lineage's state) stay as many after six times ``BOUNDED_KEPT``
    appends as after three (every bounded set full), not one more per append, and the heap's freed
    pages go back to the OS once per ``TRIM_S`` of the store's clock (the growth of a server's RSS
    with time was freed memory the heap kept)."""
    import gc

    from metrics_core.dashboard.live.chart_component import Encoded, encode
    from metrics_core.dashboard.live.feed import drawn_charts, feed_answer, page_signature
    from metrics_core.dashboard.store.snapshot import EventColumns

    returned: list[float] = []
    clock = [0.0]
    monkeypatch.setattr(viewed_runs, "return_memory_to_os", lambda: returned.append(clock[0]))
    path = tmp_path / "live" / "metrics.jsonl"
    append_records(path, *(base_record(step, train_loss=1.0 / step, grad_norm_avg=0.5) for step in range(1, 11)))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0, clock=lambda: clock[0]))
    options = ChartOptions()

    def alive() -> dict[str, int]:
        gc.collect()
        kinds = (RunView, EventColumns, Encoded)
        counts = {kind.__name__: 0 for kind in kinds}
        for thing in gc.get_objects():
            for kind in kinds:
                if isinstance(thing, kind):
                    counts[kind.__name__] += 1
        counts["lineage"] = len(store._entries["live"].lineage._kept)
        return counts

    try:
        view = store.view("live")
        signature = page_signature(view, options, ()).layout
        held = {key: encode(figure).token for key, figure in drawn_charts(view, options).items()}
        counts = []
        full, last = 10 + 3 * BOUNDED_KEPT, 10 + 6 * BOUNDED_KEPT  # every bound crossed, then as many appends again
        for step in range(11, last + 1):
            clock[0] += 0.25
            append_records(path, base_record(step, train_loss=1.0 / step + 0.01 * (step % 7), grad_norm_avg=0.5))
            view = store.view("live")
            if feed_answer(view, options, (), signature, held).get("rerun"):
                signature = page_signature(view, options, ()).layout
            held = {key: encode(figure).token for key, figure in drawn_charts(view, options).items()}
            if step in (full, last):
                counts.append(alive())
        assert counts[1] == counts[0]  # 3 * BOUNDED_KEPT appends later: not one more snapshot, column set or figure
        assert len(returned) == int(clock[0] / viewed_runs.TRIM_S) + 1  # at 0, then once per TRIM_S
        assert all(b - a >= viewed_runs.TRIM_S for a, b in itertools.pairwise(returned))
    finally:
        store.close()
