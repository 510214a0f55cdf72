"""The runs page in a real headless Chromium against a real `streamlit run`: the table
is redrawn only when a row it shows changed, and a click on a run while a cold root is still loading
opens that run in this tab."""

from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path

from metrics_core.testing.live_server import (
    ROW_STATUSES_JS,
    RUN_ROWS_JS,
    Wire,
    click,
    live_charts_drawn,
    row_point,
    streamlit_server,
    wait_until,
)
from tests.support import DESKTOP, append_records, base_record, cold_root, in_background


def appending(path: Path, steps: range, every: float = 0.3) -> AbstractContextManager[None]:
    """Appends a record with ``base_record``'s (old) time per step of ``steps``, one every ``every`` s."""

    def write(stop: threading.Event) -> None:
        for step in steps:
            if stop.wait(every):
                return
            append_records(path, base_record(step, train_loss=1.0 / step))

    return in_background(write)


def settled(page: object, wire: Wire, *, quiet_ms: int = 2000, timeout_s: float = 120) -> None:
    """Wait until the page has received no more than a fragment's small answers for ``quiet_ms``:
    a redraw still on its way after the last run turned ``ready`` would count as the next one.  A
    page that never goes quiet fails here, not as a redraw in the measurement that follows."""
    deadline = time.monotonic() + timeout_s
    while True:
        wire.reset()
        page.wait_for_timeout(quiet_ms)
        if wire.frames < 20_000:
            return
        assert time.monotonic() < deadline, f"the page still received {wire.frames} bytes per {quiet_ms} ms"


def test_rows_changing_off_the_page_shown_do_not_redraw_it(browser: object, tmp_path: Path) -> None:
    """120 runs, page 1 shown: a run on page 2 (its records an hour older than the rest) appends every
    0.3 s, so the store's rows change at every refresh; the page shown does not, and is not sent again
    (a redraw of a page of 100 rows is ~45 KB of websocket frames; the old page redrew at each change)."""
    cold_root(tmp_path, small=119, big=0, big_records=0)
    old = tmp_path / "old" / "metrics.jsonl"
    append_records(old, *(base_record(s, train_loss=1.0, time="2026-11-29T09:00:00.000000+00:00") for s in (1, 2)))
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        wire = Wire(context, page)
        with streamlit_server(tmp_path) as url:
            page.goto(url + "/")
            wait_until(page, lambda: page.get_by_text("Showing 1–100 of 120 runs").count() == 1, timeout=60)
            wait_until(page, lambda: "loading" not in page.evaluate(ROW_STATUSES_JS), timeout=60)
            # the alerter's first pass over the runs: its end redraws the page (the caption goes)
            first_pass = page.get_by_text("Alerts: reading the runs for the first time")
            wait_until(page, lambda: first_pass.count() == 0, timeout=120)
            settled(page, wire)  # the last redraws of the loading root are done
            wire.reset()
            with appending(old, range(3, 100)):
                page.wait_for_timeout(6000)
            received = wire.frames
        print(f"websocket bytes while a run off the page appended for 6 s: {received}")
        assert received < 20_000, received
    finally:
        context.close()


def test_a_click_on_a_run_while_a_cold_root_loads_opens_it_in_this_tab(browser: object, tmp_path: Path) -> None:
    """80 small runs and 6 big ones the store's loader reads for seconds, the rows changing meanwhile: a
    click on a small run's link while the big ones, drawn first (newest by their tails), still read
    ``loading`` opens that run's page in this tab."""
    cold_root(tmp_path, small=80, big=6, big_records=120_000)  # ~30 MB per big run: seconds to read
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        with streamlit_server(tmp_path) as url:
            page.goto(url + "/")
            target = "small000"  # the first row after the big ones: drawn while they load
            shown = lambda: f"run?run={target}" in page.evaluate(RUN_ROWS_JS)["names"]  # noqa: E731
            wait_until(page, lambda: "loading" in page.evaluate(ROW_STATUSES_JS) and shown(), timeout=60, interval=0.02)
            click(page, *row_point(page, target, 50))  # the pointer arrives ~0.2 s after loading rows were seen
            wait_until(page, lambda: live_charts_drawn(page), timeout=60)
            assert page.url == f"{url}/run?run={target}" and len(context.pages) == 1
    finally:
        context.close()
