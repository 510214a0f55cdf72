"""What one client on the same machine can make a served dashboard do with plain GETs to its
routes: no request stalls the server, requests for runs that are not there cost next to nothing,
and what a request names (a static file's spelling, chart options) keeps no memory per name.

Every request of this module goes through ``get``: the one place that says how a client asks.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

import psutil
import pytest

from metrics_core.dashboard.live.push import options_query
from metrics_core.dashboard.views.chart_specs import SMOOTHING_STEP, ChartOptions
from metrics_core.testing.live_server import streamlit_server
from tests.support import append_records, base_record

CATASTROPHIC = "(.|.|.|.)*!"  # a regular expression that backtracks for ever on any chart title
BIG_RUN_RECORDS = 20_000  # records of the run whose figures each option set builds


def get(url: str, *, timeout: float = 30.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """GET ``url``: its status and body, an error status included."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, psutil.Process]]:
    """A dashboard serving a root with one run of ``BIG_RUN_RECORDS`` records: its URL and process."""
    root = tmp_path_factory.mktemp("runs")
    append_records(
        root / "big" / "metrics.jsonl",
        *(base_record(step, train_loss=1.0 + 1.0 / step, lr=3e-4) for step in range(1, BIG_RUN_RECORDS + 1)),
    )
    with streamlit_server(root, refresh=0.5) as url:  # the dashboard's default refresh period
        port = url.rsplit(":", 1)[1]
        (process,) = [
            found
            for found in psutil.process_iter(["cmdline"])
            if "streamlit" in (found.info["cmdline"] or []) and port in (found.info["cmdline"] or [])
        ]
        settle(process)  # its start's work (imports, the first loads' gzip copies) done
        yield url, process


def settle(process: psutil.Process, *, timeout: float = 60.0) -> None:
    """Until ``process`` spends under 5 % of a core over half a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = sum(process.cpu_times()[:2])
        time.sleep(0.5)
        if sum(process.cpu_times()[:2]) - before < 0.025:
            return
    raise AssertionError(f"the server stayed busy for {timeout} s")


def test_a_catastrophic_chart_filter_is_answered_and_never_stalls_the_server(server: tuple[str, object]) -> None:
    """The filter that backtracked for ever is answered within 5 s, and the health route keeps
    answering within 1 s all the while."""
    url, _ = server
    query = urlencode({"run": "big", "chart": "x", "history": "effective", "only": CATASTROPHIC})
    answered: list[tuple[int, float]] = []

    def ask() -> None:
        start = time.monotonic()
        status, _ = get(f"{url}/api/csv?{query}", timeout=60)
        answered.append((status, time.monotonic() - start))

    asking = threading.Thread(target=ask)
    asking.start()
    health = []
    while asking.is_alive() and len(health) < 100:
        start = time.monotonic()
        status, _ = get(f"{url}/_stcore/health", timeout=30)
        health.append((status, time.monotonic() - start))
        time.sleep(0.05)
    asking.join(60)
    assert answered and answered[0][0] == 404 and answered[0][1] <= 5.0  # the run has no chart "x"
    assert health and all(status == 200 and took <= 1.0 for status, took in health), health


def test_long_polls_for_unknown_runs_cost_under_forty_percent_of_a_core(server: tuple[str, object]) -> None:
    """300 long polls for runs that do not exist, all waiting for a snapshot far ahead: each is
    answered 404 without waiting, and over the 3 s after they were sent the server spends at most
    40 % of a core (a ticker each would ask the store for each name several times a second)."""
    url, process = server
    before, start = process.cpu_times(), time.monotonic()
    with ThreadPoolExecutor(300) as pool:
        asked = [pool.submit(get, f"{url}/api/changes?run=ghost-{n}&seen={10**9}", timeout=60) for n in range(300)]
        time.sleep(max(0.0, 3.0 - (time.monotonic() - start)))
        after, wall = process.cpu_times(), time.monotonic() - start
        answers = [future.result() for future in asked]
    cpu = sum(after[:2]) - sum(before[:2])
    assert [status for status, _ in answers] == [404] * 300
    assert all(b"ghost" in body and b"/" not in body for _, body in answers)
    assert cpu / wall <= 0.40, f"{cpu:.2f} s of CPU in {wall:.2f} s"


def static_bundle(url: str) -> str:
    """The path of the first script Streamlit's index.html loads (a content-hashed bundle)."""
    _, index = get(f"{url}/")
    return "/" + re.search(rb'src="\.?/?(static/js/[^"]+\.js)"', index).group(1).decode()


def test_static_spellings_and_option_sets_keep_no_memory_each(server: tuple[str, object]) -> None:
    """100 spellings of one static file (each answered with the file) and 200 chart option sets the
    page can produce (each building the run's figures) grow the server's RSS by at most 40 MB."""
    url, process = server
    bundle = static_bundle(url)
    gzip = {"Accept-Encoding": "gzip"}
    assert get(f"{url}{bundle}", headers=gzip)[0] == 200

    def changes(options: ChartOptions) -> int:
        query = {"run": "big", "seen": 0, "sig": "x", "opts": options_query(options), "held": "{}"}
        status, body = get(f"{url}/api/changes?{urlencode(query)}", timeout=120)
        assert status == 200 and json.loads(body).get("rerun") is True, body
        return status

    changes(ChartOptions())  # the run read, its first figures built: what every server holds
    before = process.memory_info().rss
    spellings = [bundle.replace("/static/", "/static/" + "./" * n, 1) for n in range(1, 51)]
    spellings += [bundle.replace("/static/", "/static" + "/" * n, 1) for n in range(2, 52)]
    for spelling in spellings:
        assert get(f"{url}{spelling}", headers=gzip)[0] == 200
    for log_y in (False, True):
        for step in range(100):
            changes(ChartOptions(smoothing=round(step * SMOOTHING_STEP, 2), log_y=log_y))
    grown = (process.memory_info().rss - before) / 1e6
    assert grown <= 40, f"RSS grew by {grown:.0f} MB"
