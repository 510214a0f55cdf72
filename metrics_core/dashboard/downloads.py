"""A chart's rows as CSV from a route of the server's own, not a widget per chart per refresh;
and the server's own routes, wired (``own_routes``).

A ``st.download_button`` is a widget: drawn in the run page's live fragment, each chart's button
was built, registered (with its deferred callable, under a process-wide lock) and sent again on
every refresh of every tab, a quarter of what a refresh cost.  Where app.py serves ``csv_route``
(``serving.app_options``; not under ``METRICS_SERVE_PLAIN=1``: ``serving.routes_served``), each live
chart carries a link to it instead (``csv_link``: a constant string in the chart's payload, nothing
per refresh), and the CSV is built when the link is followed, from the run's latest snapshot
(``chart_csv.chart_csv_pieces_of``, the rows the chart draws).  Where the route is not served (plain
serving, ``AppTest``), ``csv_link`` is None and the page draws the download button.

A chart's CSV is sent as it is written, a piece at a time (``chart_csv_pieces``), never held whole
as text; while it is sent it holds a copy of its rows, O(the run's records).  So at most
``CSV_ANSWERS_MAX`` are written or sent at once, per route; up to ``CSV_WAITING_MAX`` more wait
their turn, holding nothing but their connection, and beyond those a request is answered 503:
however many are asked for, the memory they take is bounded.

The routes read the same server-wide store and alerter every page reads (``settings.open_store``,
``settings.open_alerter``); a name the store refuses (outside the runs root, not a run) is answered
404 with the reason in words that name no server path (``push.run_refusal``), never a traceback; a refused
chart filter (``chart_filter.filter_error``) 400.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlencode

from anyio import to_thread
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from metrics_core.dashboard.alerting import run_alerts
from metrics_core.dashboard.display_text import file_stem
from metrics_core.dashboard.live.push import base_path, changes_route, route_url, run_refusal
from metrics_core.dashboard.server.serving import routes_served
from metrics_core.dashboard.settings import open_alerter, open_store, settings
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.views.chart_csv import chart_csv_pieces_of
from metrics_core.dashboard.views.chart_filter import filter_error
from metrics_core.dashboard.views.chart_specs import HISTORY_MODES, ChartOptions
from metrics_core.errors import MetricsError

CSV_PATH = "/api/csv"  # outside the paths Streamlit serves (``serving.STREAMLIT_PATHS``)
CSV_ANSWERS_MAX = 2  # CSVs built or being sent at once
CSV_WAITING_MAX = 16  # requests waiting for their turn; beyond, 503
CSV_RETRY_S = 5


def csv_file_name(run: str, chart: str) -> str:
    """The file name a chart's CSV downloads as."""
    return f"{file_stem(run)}-{file_stem(chart)}.csv"


def csv_link(run: str, chart: str, options: ChartOptions) -> str | None:
    """The URL of the CSV of ``run``'s chart ``chart`` as ``options`` draw it, or None where this
    server does not serve ``csv_route``."""
    if not routes_served():
        return None
    query = urlencode({"run": run, "chart": chart, "history": options.history, "only": options.only})
    return f"{route_url(CSV_PATH)}?{query}"


def csv_route(
    store: Callable[[], RunStore],
    *,
    base_url: str = "",
    answers_max: int = CSV_ANSWERS_MAX,
    waiting_max: int = CSV_WAITING_MAX,
) -> Route:
    """The route that answers ``csv_link``'s URLs from ``store()``, mounted under ``base_url``:
    ``answers_max`` at once, ``waiting_max`` more waiting, the others refused (503)."""
    turns = asyncio.Semaphore(answers_max)
    waiting = 0

    async def answer(request: Request) -> Response | _ReleasedAfter:
        nonlocal waiting
        query = request.query_params
        run, chart = query.get("run", ""), query.get("chart", "")
        history = query.get("history", "")
        only = query.get("only", "")
        if history not in HISTORY_MODES:
            return PlainTextResponse(f"no history mode {history!r}", status_code=400)
        if error := filter_error(only):
            return PlainTextResponse(error, status_code=400)
        if turns.locked() and waiting >= waiting_max:
            busy = "other charts' CSVs are being built: ask again in a moment"
            return PlainTextResponse(busy, status_code=503, headers={"Retry-After": str(CSV_RETRY_S)})
        waiting += 1
        try:
            await turns.acquire()
        finally:
            waiting -= 1
        try:
            response = await _csv_answer(store, run, chart, ChartOptions(history=history, only=only))
        except BaseException:
            turns.release()
            raise
        return _ReleasedAfter(response, turns.release)

    return Route(f"{base_path(base_url)}{CSV_PATH}", answer, methods=["GET"])


async def _csv_answer(store: Callable[[], RunStore], run: str, chart: str, options: ChartOptions) -> Response:
    """The CSV of ``run``'s chart, sent piece by piece as it is written (``chart_csv_pieces_of``),
    each piece on a worker thread; or why there is none, before anything is sent."""
    try:
        pieces = await to_thread.run_sync(lambda: chart_csv_pieces_of(store().view(run), options, chart))
    except (MetricsError, OSError) as exc:
        return PlainTextResponse(run_refusal(run, exc), status_code=404)
    except KeyError:
        return PlainTextResponse(f"run {run!r} has no chart {chart!r}", status_code=404)

    async def written() -> AsyncIterator[str]:
        while (piece := await to_thread.run_sync(next, pieces, None)) is not None:
            yield piece

    disposition = f'attachment; filename="{csv_file_name(run, chart)}"'
    return StreamingResponse(written(), media_type="text/csv", headers={"Content-Disposition": disposition})


class _ReleasedAfter:
    """An ASGI answer: ``response`` sent, then ``release()``, whether the client took it all or left."""

    def __init__(self, response: Response, release: Callable[[], None]) -> None:
        self.response, self.release = response, release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.release()


def own_routes(base_url: str) -> list[Route]:
    """The server's own routes under ``base_url`` (``serving.app_options`` mounts them): a chart's CSV
    and a run's changes (``push.changes_route``), both from the server-wide store."""
    server = functools.cache(settings)  # argv and environment stay as the server started: parsed once

    def store() -> RunStore:
        return open_store(server())

    return [
        csv_route(store, base_url=base_url),
        changes_route(store, lambda: server().refresh, _run_alerts, base_url=base_url),
    ]


def _run_alerts(run: str) -> tuple[str, ...]:
    """The alerts firing for ``run``, as its page shows them (none when alerts are off)."""
    try:
        return run_alerts(open_alerter(settings()), run)
    except MetricsError:
        return ()
