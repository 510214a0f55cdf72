"""What a request to the server's own routes can make it do, without a server: the chart filter
matches in one pass, the routes refuse what no page asks for and name no server path, and what a
request names (static spellings, chart options) keeps a bounded amount of memory."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from starlette.routing import Route

from metrics_core.dashboard.downloads import csv_route
from metrics_core.dashboard.figures.chart_memo import view_charts
from metrics_core.dashboard.live.push import (
    X_KEY_MAX_CHARS,
    changes_route,
    options_query,
    parse_options,
    snapshot_serial,
    x_allowed,
)
from metrics_core.dashboard.server.asgi_gzip import GzipCopies, StaticGzip, canonical
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.snapshot import BOUNDED_KEPT, EMPTY
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.chart_csv import chart_csv_pieces_of
from metrics_core.dashboard.views.chart_filter import FILTER_MAX_CHARS, chart_filter, filter_error
from metrics_core.dashboard.views.chart_specs import (
    DEFAULT_CHARTS,
    MAX_LOGGED_CHARTS,
    SMOOTHING_MAX,
    SMOOTHING_STEP,
    ChartOptions,
    key_charts,
    pick_charts,
)
from tests.support import append_records, base_record, run_async, small_run
from tests.support.dashboard import BUNDLE, IMMUTABLE, fetch, route_get, static_app

CATASTROPHIC = "(.|.|.|.)*!"  # exponential for a backtracking regular expression on any title


class CountingText(str):
    """A name whose lookups (``find``, ``startswith``, ``endswith``) are counted: the matcher's steps."""

    calls = 0

    def find(self, *args: object) -> int:
        CountingText.calls += 1
        return super().find(*args)

    def startswith(self, *args: object) -> bool:
        CountingText.calls += 1
        return super().startswith(*args)

    def endswith(self, *args: object) -> bool:
        CountingText.calls += 1
        return super().endswith(*args)


@pytest.mark.parametrize(
    ("pattern", "kept"),
    [
        ("", {"Loss", "val/acc", "sys/gpu0_mem_gb", "k.(1)"}),
        ("LOSS", {"Loss"}),
        ("loss | val/", {"Loss", "val/acc"}),
        ("^sys/*mem", {"sys/gpu0_mem_gb"}),
        ("^val$|acc$", {"val/acc"}),
        ("^loss$", {"Loss"}),
        ("gpu*gb$", {"sys/gpu0_mem_gb"}),
        ("k.(1)", {"k.(1)"}),  # no character but | * ^ $ means anything but itself
        ("k.", {"k.(1)"}),
        ("a*c", {"val/acc"}),
        ("*", {"Loss", "val/acc", "sys/gpu0_mem_gb", "k.(1)"}),
        (CATASTROPHIC, {"k.(1)"}),  # its alternatives "(.", ".", ".", ".)*!": literal text
        ("|", {"Loss", "val/acc", "sys/gpu0_mem_gb", "k.(1)"}),  # empty alternatives are none
    ],
)
def test_the_chart_filter_keeps_names_holding_any_alternative_ignoring_case(pattern: str, kept: set[str]) -> None:
    """``|`` alternatives of literal text, ``*`` for any text, ``^``/``$`` anchors, case ignored."""
    names = {"Loss", "val/acc", "sys/gpu0_mem_gb", "k.(1)"}
    assert {name for name in names if chart_filter(pattern).keeps(name)} == kept


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("a*" * 99 + "b", "a" * 10_000),  # every piece found at once, the last never: no retrying
        ("^" + "a*" * 98 + "b$", "a" * 10_000 + "c"),
        ("x*" * 60 + "y" + "|" + "a" * 20 + "*b", "x" * 5_000),
        (CATASTROPHIC, "(" * 5_000 + "!"),
    ],
)
def test_the_chart_filter_looks_each_piece_up_once_whatever_the_input(pattern: str, text: str) -> None:
    """Adversarial patterns and names: the matcher does at most one lookup per ``*``-separated
    piece of each alternative (and one per anchor), never retrying a piece: linear in the
    pattern, each lookup one ``str.find``."""
    parsed = chart_filter(pattern)
    budget = sum(len(alternative.pieces) + 2 for alternative in parsed.alternatives)
    CountingText.calls = 0
    assert not any(alternative.matches(CountingText(text)) for alternative in parsed.alternatives)
    assert 0 < CountingText.calls <= budget


def test_the_chart_filter_narrows_two_thousand_keys() -> None:
    """A run logging 2,000 keys: a filter keeps exactly the charts it matches, the defaults it
    names among them, and ``MAX_LOGGED_CHARTS`` of the logged keys' charts drawn."""
    charts = [*DEFAULT_CHARTS, *key_charts({f"k/{n:04}": ("train",) for n in range(2_000)})]
    picked, matched = pick_charts(charts, "^k/19*5$|^loss$|K/0007")
    assert matched == 11  # k/1905, k/1915 ... k/1995 and k/0007
    assert [chart.key for chart in picked][:2] == ["loss", "key:k/0007"] and len(picked) == 1 + MAX_LOGGED_CHARTS


def test_a_chart_filter_longer_than_the_cap_is_refused_with_its_reason() -> None:
    """A pattern over ``FILTER_MAX_CHARS`` is refused, saying the limit; one at it is taken."""
    assert filter_error("x" * FILTER_MAX_CHARS) is None
    error = filter_error("x" * (FILTER_MAX_CHARS + 1))
    assert error is not None and str(FILTER_MAX_CHARS) in error
    with pytest.raises(ValueError, match=str(FILTER_MAX_CHARS)):
        chart_filter("x" * (FILTER_MAX_CHARS + 1))


def test_the_changes_route_takes_only_options_the_page_can_produce() -> None:
    """Every smoothing of the slider, as Python adds its steps up, is taken; a value between them,
    beyond it, an empty or over-long x, a history or theme the page has not, or a refused filter is
    refused.  An x that names a key is the route's to check against the run (``x_allowed``)."""
    steps = round(SMOOTHING_MAX / SMOOTHING_STEP)
    for step in range(steps + 1):
        for smoothing in (step * SMOOTHING_STEP, round(step * SMOOTHING_STEP, 2)):
            options = ChartOptions(smoothing=smoothing, only="loss|val/")
            assert parse_options(options_query(options)) == options
    for wrong in (
        {"smoothing": 0.123},
        {"smoothing": 0.995},
        {"smoothing": -0.01},
        {"x": ""},
        {"x": "k" * (X_KEY_MAX_CHARS + 1)},
        {"history": "bogus"},
        {"theme": "bogus"},
        {"only": "x" * (FILTER_MAX_CHARS + 1)},
    ):
        with pytest.raises(ValueError):
            parse_options(json.dumps(json.loads(options_query(ChartOptions())) | wrong))


async def ask(route: Route, path: str, **query: object) -> tuple[int, str]:
    status, body = await route_get(route, path, **query)
    return status, body.decode()


class CountingStore:
    """A store whose ``view`` calls are counted."""

    def __init__(self, store: RunStore) -> None:
        self.store, self.views = store, 0

    def view(self, name: str) -> object:
        self.views += 1
        return self.store.view(name)


def test_long_polls_for_unknown_runs_are_answered_404_at_once_and_long_polls_are_capped(tmp_path: Path) -> None:
    """A long poll for a name that is no run, or outside the runs root, is answered 404 at once
    after one look at the store, naming no server path; a run's long poll waits; beyond the cap
    a long poll is answered 503."""
    small_run(tmp_path / "r" / "metrics.jsonl")
    store = CountingStore(RunStore(tmp_path, StoreSettings(safety_interval=0.0)))
    route = changes_route(lambda: store, lambda: 0.05, long_poll_s=3600.0, long_polls_max=3)
    try:
        seen = snapshot_serial(store.store.view("r"))

        async def scenario() -> tuple[list[tuple[int, str]], int, list[tuple[int, str]], int]:
            unknown = [ask(route, "/api/changes", run=name, seen=0) for name in ("nope", "../x", "/etc", "r/..x")]
            unknown_answers = await asyncio.wait_for(asyncio.gather(*unknown), 60)
            views = store.views
            waiting = [asyncio.create_task(ask(route, "/api/changes", run="r", seen=seen)) for _ in range(3)]
            await asyncio.sleep(0.2)
            beyond = [await ask(route, "/api/changes", run="r", seen=seen) for _ in range(2)]
            still = sum(not task.done() for task in waiting)
            for task in waiting:
                task.cancel()
            return unknown_answers, views, beyond, still

        unknown, views, beyond, still = run_async(scenario())
    finally:
        store.store.close()
    assert [status for status, _ in unknown] == [404] * 4 and views == 4
    assert all(str(tmp_path) not in body and "error" in json.loads(body) for _, body in unknown)
    assert still == 3 and [status for status, _ in beyond] == [503, 503]


def test_a_long_poll_whose_client_is_gone_ends_at_once_and_gives_its_place_back(tmp_path: Path) -> None:
    """A closed tab's long poll ends when its connection closes, not at the poll's end: its place
    under the cap is free again at once, and a server stopping (it waits for the requests in
    flight) is not kept waiting by it."""
    small_run(tmp_path / "r" / "metrics.jsonl")
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    route = changes_route(lambda: store, lambda: 0.05, long_poll_s=3600.0, long_polls_max=1)
    try:
        seen = snapshot_serial(store.view("r"))

        async def scenario() -> tuple[int, int, int]:
            gone = asyncio.Event()
            waiting = asyncio.create_task(route_get(route, "/api/changes", gone=gone, run="r", seen=seen))
            while (refused := await ask(route, "/api/changes", run="r", seen=0))[0] != 503:
                await asyncio.sleep(0.01)  # until the long poll holds the one place
            gone.set()
            ended, _ = await asyncio.wait_for(waiting, 60)
            return refused[0], ended, (await ask(route, "/api/changes", run="r", seen=0))[0]

        refused, ended, after = run_async(scenario())
    finally:
        store.close()
    assert (refused, ended, after) == (503, 204, 200)


def test_a_key_is_an_x_only_where_the_run_logs_it_growing(tmp_path: Path) -> None:
    """The modes are always an x; a key is one only where the run logs it and it grows (``epoch``),
    never a key it lacks or one that does not grow (``train_loss`` falls)."""
    append_records(
        tmp_path / "r" / "metrics.jsonl",
        *(base_record(step, train_loss=1.0 / step, epoch=step // 10) for step in range(1, 60)),
    )
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        view = store.view("r")
        assert x_allowed(view, "step") and x_allowed(view, "time") and x_allowed(view, "epoch")
        assert not x_allowed(view, "bogus") and not x_allowed(view, "train_loss")
    finally:
        store.close()


def test_the_csv_route_names_no_server_path_and_refuses_an_over_long_filter(tmp_path: Path) -> None:
    """A missing run, a name outside the root and a chart the run has not are 404s that name no
    server path; an over-long filter is a 400 saying the limit; the catastrophic pattern is a
    filter like any other."""
    small_run(tmp_path / "root" / "r" / "metrics.jsonl")
    small_run(tmp_path / "outside" / "metrics.jsonl")
    store = RunStore(tmp_path / "root", StoreSettings(safety_interval=0.0))
    route = csv_route(lambda: store)

    async def scenario() -> list[tuple[int, str]]:
        return [
            await ask(route, "/api/csv", run="missing", chart="loss", history="effective"),
            await ask(route, "/api/csv", run="../outside", chart="loss", history="effective"),
            await ask(route, "/api/csv", run="r", chart="x", history="effective", only=CATASTROPHIC),
            await ask(route, "/api/csv", run="r", chart="loss", history="effective", only="x" * 1000),
            await ask(route, "/api/csv", run="r", chart="loss", history="effective", only="loss"),
        ]

    try:
        missing, outside, no_chart, too_long, rows = run_async(scenario())
    finally:
        store.close()
    assert missing[0] == outside[0] == no_chart[0] == 404
    assert all(
        str(tmp_path) not in body and "/" not in body.replace("../outside", "") for _, body in (missing, outside)
    )
    assert too_long[0] == 400 and str(FILTER_MAX_CHARS) in too_long[1]
    assert rows[0] == 200 and rows[1].startswith("series,metric")


def test_chart_csvs_are_built_a_few_at_a_time_the_next_ones_wait_and_the_rest_are_refused(tmp_path: Path) -> None:
    """Seven CSVs asked for at once while the store is slow: two are built at once, three wait and
    are then answered in full, two are refused at once (503, with when to ask again).  A client that
    leaves while its CSV is sent gives its turn back."""
    small_run(tmp_path / "r" / "metrics.jsonl")
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    gate, lock = threading.Event(), threading.Lock()
    building = {"now": 0, "most": 0}

    def slow_store() -> RunStore:  # each build waits here until the gate opens
        with lock:
            building["now"] += 1
            building["most"] = max(building["most"], building["now"])
        gate.wait(30)
        with lock:
            building["now"] -= 1
        return store

    route = csv_route(slow_store, answers_max=2, waiting_max=3)
    query = {"run": "r", "chart": "loss", "history": "effective"}

    async def scenario() -> tuple[list[tuple[int, str]], list[tuple[int, str]], int]:
        asks = [asyncio.create_task(ask(route, "/api/csv", **query)) for _ in range(7)]
        for _ in range(500):
            if building["now"] == 2 and sum(task.done() for task in asks) == 2:
                break
            await asyncio.sleep(0.01)
        refused = [task.result() for task in asks if task.done()]
        gate.set()
        answered = await asyncio.gather(*asks)

        left = asyncio.Event()
        left.set()
        for _ in range(3):  # more than the turns there are: each given back
            await asyncio.wait_for(route_get(route, "/api/csv", gone=left, **query), 10)
        return refused, answered, (await ask(route, "/api/csv", **query))[0]

    try:
        refused, answered, after = run_async(scenario())
        rows = "".join(chart_csv_pieces_of(store.view("r"), ChartOptions(), "loss"))
    finally:
        store.close()
    assert [status for status, _ in refused] == [503, 503] and "ask again" in refused[0][1]
    assert building["most"] == 2
    assert sorted(status for status, _ in answered) == [200] * 5 + [503] * 2
    assert all(body == rows for status, body in answered if status == 200) and rows.startswith("series,metric")
    assert after == 200


def test_a_run_keeps_the_figures_of_the_last_options_asked_for_only(tmp_path: Path) -> None:
    """Figures asked for with many options are kept for the last ``BOUNDED_KEPT`` of them per
    snapshot and lineage: options asked for again are the memoised figures, the first ones'
    figures and lineage are dropped (built again if asked for), and what is kept of the others
    stays."""
    small_run(tmp_path / "r" / "metrics.jsonl")
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        view = store.view("r")
        first = ChartOptions(smoothing=0.0)
        built = view_charts(view, first)
        for step in range(1, 41):  # the last: smoothing 0.4
            last = view_charts(view, ChartOptions(smoothing=round(step * SMOOTHING_STEP, 2)))
        assert view_charts(view, ChartOptions(smoothing=0.4)) is last
        assert view_charts(view, first) is not built  # dropped, built again
        kept = view.lineage.kept(("charts", ChartOptions(smoothing=0.4).key)).value
        dropped = view.lineage.kept(("charts", ChartOptions(smoothing=0.01).key)).value
    finally:
        store.close()
    assert kept is not EMPTY and kept.figures is last and dropped is EMPTY
    assert BOUNDED_KEPT < 40


def test_one_gzip_copy_per_file_however_its_path_is_spelled_and_copies_bounded() -> None:
    """``/static//js/a.js``, ``/static/./js/a.js`` and the like pass through uncompressed, keeping
    no copy: only the canonical path of a file gets one; the copies hold at most ``max_bytes``,
    least recently asked for dropped first."""
    spellings = [
        "/static//js/a.js",
        "/static/./js/a.js",
        "/static/js/../js/a.js",
        "/static/js/a.js/.",
        "//static/js/a.js",
    ]
    assert canonical("/static/js/a.js") and not any(canonical(path) for path in spellings)
    middleware = StaticGzip(static_app(IMMUTABLE))
    for path in [*spellings, "/static/js/a.js", *(f"/static/js//a.js?{n}" for n in range(20))]:
        run_async(fetch(middleware, path))
    assert len(middleware.copies) == 1

    probe = GzipCopies()
    run_async(probe.copy("/static/js/probe.js", BUNDLE))
    size = len(run_async(probe.copy("/static/js/probe.js", BUNDLE)))
    bounded = StaticGzip(static_app(IMMUTABLE), copies=GzipCopies(max_bytes=2 * size + size // 2))
    for name in ("a", "b", "a", "c"):  # "a" asked for again before "c": "b" is the one dropped
        headers, _ = run_async(fetch(bounded, f"/static/js/{name}.js"))
        assert headers[b"content-encoding"] == b"gzip"
    assert len(bounded.copies) == 2
    assert bounded.copies._made.keys() == {("/static/js/a.js", len(BUNDLE)), ("/static/js/c.js", len(BUNDLE))}
