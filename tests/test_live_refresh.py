"""The run page's live refresh without a browser: the changes route that tells a tab its run
changed (``live_push``), and the one drawing slot every tab's refresh takes (``widgets.refresh_slot``)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.routing import Route

from metrics_core.dashboard.live_push import changes_route, snapshot_serial
from metrics_core.dashboard.store import RunStore
from metrics_core.dashboard.widgets import refresh_slot
from tests.support import append_records, base_record


async def ask(route: Route, run: str, seen: int) -> int:
    scope = {"type": "http", "method": "GET", "path": "/api/changes", "headers": [],
             "query_string": urlencode({"run": run, "seen": seen}).encode()}  # fmt: skip
    return json.loads((await route.endpoint(Request(scope))).body)["serial"]


def test_the_changes_route_answers_a_tab_once_its_run_has_a_newer_snapshot(tmp_path: Path) -> None:
    """A tab that drew an older snapshot is answered at once, one that drew the latest only once a
    record is appended (with the serial of the snapshot it will then draw), or at the long poll's end."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s) for s in range(10, 51, 10)))
    store = RunStore(tmp_path, safety_interval=0.0)
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

        older, unchanged, newer, waited = asyncio.run(scenario())
        assert older == drawn and unchanged == drawn and waited >= 0.5
        assert newer > drawn and newer == snapshot_serial(store.view("r"))
    finally:
        store.close()


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
