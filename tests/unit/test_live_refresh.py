"""The run page's live refresh without a browser: the changes route that tells a tab its run
changed and brings its charts the new points (``live.push``, ``live.feed``), and the one drawing
slot every tab's refresh takes (``widgets.refresh_slot``)."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from starlette.routing import Route

from metrics_core.dashboard.live.chart_component import encode
from metrics_core.dashboard.live.feed import drawn_charts, page_signature
from metrics_core.dashboard.live.push import CHANGES_PATH, SharedAnswers, changes_route, options_query, snapshot_serial
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.chart_specs import ChartOptions
from metrics_core.dashboard.widgets import refresh_slot
from tests.support import append_records, base_record, run_async
from tests.support.dashboard import route_get


async def answer(route: Route, **query: object) -> tuple[int, dict]:
    status, body = await route_get(route, CHANGES_PATH, **query)
    return status, json.loads(body)


async def ask(route: Route, run: str, seen: int) -> int:
    return (await answer(route, run=run, seen=seen))[1]["serial"]


def test_the_changes_route_answers_a_tab_once_its_run_has_a_newer_snapshot(tmp_path: Path) -> None:
    """A tab that drew an older snapshot is answered at once, one that drew the latest only once a
    record is appended (with the serial of the snapshot it will then draw), or at the long poll's end."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(10, 51, 10)))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        drawn = snapshot_serial(store.view("r"))
        assert snapshot_serial(store.view("r")) == drawn  # the same snapshot while nothing changed
        short = changes_route(lambda: store, lambda: 0.05, long_poll_s=0.5)
        route = changes_route(lambda: store, lambda: 0.05, long_poll_s=30.0)  # answered long before

        async def scenario() -> tuple[int, int, int, float]:
            older = await ask(route, "r", drawn - 1)
            start = time.monotonic()
            unchanged = await ask(short, "r", drawn)
            waited = time.monotonic() - start
            later = asyncio.create_task(ask(route, "r", drawn))
            await asyncio.sleep(0.2)
            append_records(path, base_record(60, train_loss=0.5))
            return older, unchanged, await later, waited

        older, unchanged, newer, waited = run_async(scenario())
        assert older == drawn and unchanged == drawn and waited >= 0.5
        assert newer > drawn and newer == snapshot_serial(store.view("r"))
    finally:
        store.close()


def test_tabs_in_step_get_the_appended_points_from_one_answer_and_a_changed_page_a_rerun(tmp_path: Path) -> None:
    """Twenty tabs that drew the same snapshot with the same options, holding the same figures, get
    one answer computed once: the status line and every chart's appended point as an extend of the
    figure it holds.  A tab whose page differs (it drew another layout) is told to rerun; a query
    the route cannot read is refused."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s, lr=3e-4) for s in range(10, 51, 10)))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    computed: list[str] = []

    def alerts(run: str) -> tuple[str, ...]:  # asked once per answer computed
        computed.append(run)
        return ()

    try:
        view, options = store.view("r"), ChartOptions(smoothing=0.6)
        held = {key: encode(figure).token for key, figure in drawn_charts(view, options).items()}
        query = {"run": "r", "seen": snapshot_serial(view), "sig": page_signature(view, options, ()).layout,
                 "opts": options_query(options), "held": json.dumps(held)}  # fmt: skip
        route = changes_route(lambda: store, lambda: 0.05, alerts, long_poll_s=30.0)

        async def scenario() -> tuple[list[tuple[int, dict]], int, tuple[int, dict], tuple[int, dict]]:
            tabs = [asyncio.create_task(answer(route, **query)) for _ in range(20)]
            await asyncio.sleep(0.2)
            append_records(path, base_record(60, train_loss=0.5, lr=3e-4))
            answers = await asyncio.gather(*tabs)
            computations = len(computed)
            stale = await answer(route, **(query | {"sig": "drawn-elsewhere"}))
            return answers, computations, stale, await answer(route, **(query | {"opts": '{"x": 1}'}))

        answers, computations, stale, refused = run_async(scenario())
    finally:
        store.close()
    assert computations == 1 and all(found == answers[0] for found in answers)
    status, body = answers[0]
    assert status == 200 and body["status"] == "crashed" and "6 records" in body["counts"]
    loss = body["charts"]["chart_loss"]
    assert loss["op"] == "extend" and loss["base"] == held["chart_loss"]
    assert [60] in [xs for step in loss["steps"] for xs in step["update"]["x"]]
    assert stale == (200, {"serial": body["serial"], "rerun": True})
    assert refused[0] == 400 and "opts" in refused[1]["error"]


def test_shared_answers_keep_a_runs_newest_snapshot_only_and_stay_under_their_byte_bound() -> None:
    """Twenty tabs in step share one answer.  Once a run's newer snapshot is asked for, the answers
    of its older ones are dropped (their tabs do not ask again) and other runs' are kept; answers
    past the byte bound are dropped oldest first, the newest always kept."""
    computed: list[str] = []

    def compute(name: str, size: int = 1000) -> Callable[[], dict]:
        def answer() -> dict:
            computed.append(name)
            return {"charts": {"chart_loss": {"op": "full", "figure": "x" * size}}}

        return answer

    async def scenario() -> tuple[list[dict], int]:
        answers = SharedAnswers(max_bytes=3_000_000)
        tabs = await asyncio.gather(*(answers.get("r", 1, ("opts",), compute("r@1")) for _ in range(20)))
        await answers.get("other", 1, ("opts",), compute("other@1"))
        await answers.get("r", 2, ("opts",), compute("r@2"))
        await answers.get("r", 2, ("opts",), compute("r@2 again"))
        await answers.get("other", 1, ("opts",), compute("other@1 again"))
        await answers.get("r", 1, ("opts",), compute("r@1 again"))
        for held in range(5):
            await answers.get("big", 1, (held,), compute(f"big {held}", 1_000_000))
        kept = answers.kept_bytes()
        await answers.get("big", 1, (4,), compute("big 4 again"))
        await answers.get("big", 1, (0,), compute("big 0 again"))
        return tabs, kept

    tabs, kept = asyncio.run(scenario())
    assert all(tab is tabs[0] for tab in tabs)
    assert computed == ["r@1", "other@1", "r@2", "r@1 again", *(f"big {held}" for held in range(5)), "big 0 again"]
    assert 2_000_000 < kept <= 3_000_000


def test_a_superseded_snapshots_figures_are_freed_without_the_cyclic_collector(tmp_path: Path) -> None:
    """A live run's charts, drawn and encoded for a tab (whole figure JSON included), are freed as
    soon as a newer snapshot replaces them, by reference counting alone: on a server's large heap
    the cyclic collector's full passes come minutes apart, and every append's figures would wait."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(10, 51, 10)))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    drawn: list[list[weakref.ref]] = []
    gc.disable()
    try:
        for step in range(60, 160, 10):
            append_records(path, base_record(step, train_loss=1.0 / step))
            figures = drawn_charts(store.view("r"), ChartOptions())
            assert all(encode(figure).json for figure in figures.values())
            drawn.append([weakref.ref(figure) for figure in figures.values()])
        del figures
        alive = [sum(ref() is not None for ref in refs) for refs in drawn]
    finally:
        gc.enable()
        store.close()
    assert alive == [0] * (len(drawn) - 1) + [len(drawn[-1])] and alive[-1] > 0


def test_refresh_slot_lets_one_live_fragment_draw_at_a_time() -> None:
    """Tabs refreshing at once draw one after another, never two together."""
    inside, most, start = [0], [0], threading.Barrier(4)

    def draw() -> None:
        start.wait()
        with refresh_slot():
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.05)
            inside[0] -= 1

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1
