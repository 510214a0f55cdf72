"""A live run page follows its run without rerunning: the server says when the run changed, and
what changed.

A fragment with ``run_every`` reruns in every tab every refresh period, whether or not the run
changed: a script run, every element built, sent and compressed, per tab, twice a second, for a
run that appends a record a minute.  Where the server serves ``changes_route`` (``serving.routes_served``),
the run page's live fragment has no ``run_every``; it mounts ``live_watch`` instead, the element
that shows the run's status line and asks the route, "has the run changed since the snapshot this
tab drew?" (a long poll: the answer comes when it has, or after ``LONG_POLL_S`` to ask again).  The
answer carries what the tab needs of the new snapshot (``feed.feed_answer``: the status line
and each chart's appended points, which the page applies itself), or says that something else on
the page changed, and the tab reruns the fragment (a component trigger, Streamlit's public way),
saying which figure each chart holds (``chart_component.pages_hold``).

Which snapshot a tab drew is its serial (``snapshot_serial``): a number per ``RunView`` object,
increasing with each new one (``RunStore.view`` returns the same object while nothing changed).
Per run, one ``_Ticker`` asks the store for the run's view ``POLLS_PER_REFRESH`` times per refresh
period while any tab waits, and wakes every waiting tab when it gets a newer one: twenty idle tabs
cost those few ``store.view`` calls between them (a ``stat`` at most, when nothing changed), and
nothing per tab; a record waits a quarter of a period on average to be noticed, not half of one.
Tabs in step (same snapshot, options and figures) get one answer, computed once (``SharedAnswers``,
which keeps those of each run's newest snapshot only, within a byte bound).
A run the store cannot show gets a new serial at each poll, so its tabs rerun every period (the
watch pauses a period after each trigger), as they did, and say why.  A name that is no run gets no
ticker: it is answered 404 at once, and its tab asks again a period later (the first ask after the
run appears gets a ticker, and the page draws the run).  Long polls waiting at once are capped per
server (``LONG_POLLS_MAX``), and only chart options the page can produce are taken
(``parse_options``): what a request names costs the server a bounded amount.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import streamlit as st
from anyio import to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from metrics_core.dashboard.figures.layout import THEMES
from metrics_core.dashboard.live.chart_component import pages_hold
from metrics_core.dashboard.live.feed import DETAILS_S, feed_answer, page_signature, status_line
from metrics_core.dashboard.store.run_store import RunStore, RunViewError
from metrics_core.dashboard.store.snapshot import RunView
from metrics_core.dashboard.views.chart_filter import filter_error
from metrics_core.dashboard.views.chart_specs import HISTORY_MODES, ChartOptions, smoothing_error
from metrics_core.dashboard.views.memo import view_x_keys
from metrics_core.dashboard.views.x_keys import X_MODES
from metrics_core.errors import MetricsError, RunPathError

CHANGES_PATH = "/api/changes"  # outside the paths Streamlit serves (``serving.STREAMLIT_PATHS``)
WATCH_KEY = "metrics_live_watch"  # the element that shows the run's status line
POLLS_PER_REFRESH = 2
LONG_POLL_S = 20.0  # an unchanged run is answered after this long; the page asks again
ANSWERS_KEPT = 64  # answers kept for tabs still to ask: one per (run, options, figures held)
# Bytes of answers kept at most (``answer_bytes``): dozens of whole-figure answers of pages of many
# charts; beyond it, tabs asking late compute theirs again.
ANSWERS_BYTES = 16 * 2**20
# Long polls waiting at once, per server: a tab holds one, so this is hundreds of tabs; beyond it a
# poll is answered 503 and its tab asks again a refresh period later.  Each holds a connection
# (a file descriptor: the process has a thousand or so) and a coroutine.
LONG_POLLS_MAX = 256
X_KEY_MAX_CHARS = 200  # a logged key named as x: longer than any the page offers
_LOG = logging.getLogger(__name__)
_ASSETS = Path(__file__).parent.parent / "assets"

_serials: weakref.WeakKeyDictionary[RunView, int] = weakref.WeakKeyDictionary()
_serial_lock = threading.Lock()
_counter = itertools.count(1)


def base_path(base_url: str) -> str:
    """``server.baseUrlPath`` as the prefix of this server's paths: "" or "/a/b" (slashes trimmed,
    empty segments dropped)."""
    parts = [part for part in base_url.split("/") if part]
    return "/" + "/".join(parts) if parts else ""


def route_url(path: str) -> str:
    """``path`` of one of the server's own routes (``changes_route``, ``downloads.csv_route``) as the
    page asks for it: under ``server.baseUrlPath``."""
    return f"{base_path(str(st.get_option('server.baseUrlPath') or ''))}{path}"


def snapshot_serial(view: RunView) -> int:
    """``view``'s serial: the same for the same snapshot object, larger for every later one."""
    with _serial_lock:
        serial = _serials.get(view)
        if serial is None:
            serial = _serials[view] = next(_counter)
        return serial


class _Ticker:
    """One run's serial as the store has it now, polled ``POLLS_PER_REFRESH`` times every
    ``refresh`` seconds while any tab waits (on the server's event loop; ``store.view`` runs in a worker thread)."""

    def __init__(self, store: Callable[[], RunStore], name: str, refresh: float) -> None:
        self._store, self._name, self._refresh = store, name, refresh
        self.serial = 0
        self.view: RunView | None = None  # the snapshot of ``serial`` (None: the run cannot be shown)
        self._newer = asyncio.Event()
        self._waiting = 0
        self._task: asyncio.Task[None] | None = None

    async def newer_than(self, seen: int, timeout: float) -> int:
        """The run's serial once it is larger than ``seen``, or the current one after ``timeout``."""
        self._waiting += 1
        if self._task is None:
            self._task = asyncio.create_task(self._poll())
        try:
            async with asyncio.timeout(timeout):
                while self.serial <= seen:
                    await self._newer.wait()
        except TimeoutError:
            pass
        finally:
            self._waiting -= 1
        return self.serial

    async def _poll(self) -> None:
        try:
            while self._waiting:
                try:
                    view = await to_thread.run_sync(self._store().view, self._name)
                    serial = snapshot_serial(view)
                except (MetricsError, OSError):
                    view, serial = None, next(_counter)  # the page says why, and tries again next period
                if serial > self.serial:
                    self.serial, self.view = serial, view
                    self._newer.set()
                    self._newer = asyncio.Event()
                await asyncio.sleep(self._refresh / POLLS_PER_REFRESH)
        finally:
            self._task = None


def options_query(options: ChartOptions) -> str:
    """``options`` as the route's ``opts`` parameter (``parse_options`` reads it back)."""
    return json.dumps(dataclasses.asdict(options), separators=(",", ":"))


def parse_options(text: str) -> ChartOptions:
    """The ``ChartOptions`` of an ``opts`` parameter; ``ValueError`` naming what is wrong with it.

    Only options the run page's controls can produce are taken: each distinct one costs the run a
    set of figures (bounded per run, ``snapshot.BOUNDED_KEPT``, but each one built), and a
    smoothing near 1 a warm-up of millions of rows per update (``chart_specs.warmup_rows``).  An x
    that is no mode of ``X_MODES`` must be a key of the run that can be x (``x_allowed``: the route
    checks it once it holds the run's snapshot)."""
    fields = json.loads(text)
    defaults = dataclasses.asdict(ChartOptions())
    if not isinstance(fields, dict) or fields.keys() != defaults.keys():
        raise ValueError(f"opts must name exactly {sorted(defaults)}")
    for name, value in fields.items():
        kind = float if isinstance(defaults[name], float) else type(defaults[name])
        if not isinstance(value, kind) and not (kind is float and type(value) is int):
            raise ValueError(f"opts: {name} is not a {kind.__name__}")
    options = ChartOptions(**fields)
    for name, allowed in (("history", HISTORY_MODES), ("theme", THEMES)):
        if getattr(options, name) not in allowed:
            raise ValueError(f"opts: {name} must be one of {sorted(allowed)}")
    if not options.x or len(options.x) > X_KEY_MAX_CHARS:
        modes = sorted(X_MODES)
        raise ValueError(f"opts: x must be one of {modes} or a logged key of at most {X_KEY_MAX_CHARS} characters")
    if error := smoothing_error(options.smoothing):
        raise ValueError(f"opts: {error}")
    if error := filter_error(options.only):
        raise ValueError(f"opts: only: {error}")
    return options


def x_allowed(view: RunView, x: str) -> bool:
    """Whether the run page can draw ``view``'s run against ``x``: a mode, or a key that grows."""
    return x in X_MODES or x in view_x_keys(view)


def _held(text: str) -> dict[str, int]:
    held = json.loads(text)
    if not isinstance(held, dict) or not all(type(token) is int for token in held.values()):
        raise ValueError("held must map chart keys to numbers")
    return held


class SharedAnswers:
    """The route's answers for tabs in step, computed once: the first tab to ask for one computes it
    (in a worker thread), the others await the same result.

    A tab asks for the serial its run's ticker holds now, so a run's answers of older snapshots are
    dropped once one of a newer snapshot is asked for (a tab that asks for an older one after that,
    having waited in the instant the newer one arrived, computes its answer again).  Of the rest,
    at most ``ANSWERS_KEPT`` and about ``ANSWERS_BYTES`` (``answer_bytes``) are kept, the oldest
    dropped first: past the charts' point cap an append moves downsampled points, and then an
    answer carries whole figures.
    """

    def __init__(self, max_bytes: int = ANSWERS_BYTES) -> None:
        self._kept: OrderedDict[tuple[Any, ...], asyncio.Future[dict[str, Any]]] = OrderedDict()
        self._sizes: dict[tuple[Any, ...], int] = {}  # of the kept answers computed
        self._max_bytes = max_bytes

    async def get(
        self, run: str, serial: int, key: tuple[Any, ...], compute: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """The answer of run ``run``'s snapshot ``serial`` for what ``key`` names, computed once."""
        for stale in [kept for kept in self._kept if kept[0] == run and kept[1] < serial]:
            self._drop(stale)
        key = (run, serial, *key)
        future = self._kept.get(key)
        if future is None:
            future = self._kept[key] = asyncio.ensure_future(to_thread.run_sync(compute))
            future.add_done_callback(lambda done: self._computed(key, done))
            self._trim()
        return await asyncio.shield(future)

    def kept_bytes(self) -> int:
        """About how many bytes the kept answers hold (``answer_bytes``)."""
        return sum(self._sizes.values())

    def _computed(self, key: tuple[Any, ...], future: asyncio.Future[dict[str, Any]]) -> None:
        if self._kept.get(key) is future and not future.cancelled() and future.exception() is None:
            self._sizes[key] = answer_bytes(future.result())
            self._trim()

    def _trim(self) -> None:
        while len(self._kept) > 1 and (len(self._kept) > ANSWERS_KEPT or self.kept_bytes() > self._max_bytes):
            self._drop(next(iter(self._kept)))

    def _drop(self, key: tuple[Any, ...]) -> None:
        del self._kept[key]  # a tab awaiting it still gets it: only later ones compute it again
        self._sizes.pop(key, None)


def answer_bytes(value: object) -> int:
    """About what ``value`` (an answer: dicts, lists, strings and numbers) holds, in bytes: its
    strings' lengths (a whole figure is one JSON string) and eight bytes per other item."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(answer_bytes(key) + answer_bytes(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return 8 + sum(answer_bytes(item) for item in value)
    return 8


def changes_route(
    store: Callable[[], RunStore],
    refresh: Callable[[], float],
    alerts: Callable[[str], Sequence[str]] = lambda run: (),
    *,
    base_url: str = "",
    long_poll_s: float = LONG_POLL_S,
    long_polls_max: int = LONG_POLLS_MAX,
) -> Route:
    """``GET /api/changes?run=<name>&seen=<serial>``: ``{"serial": n}`` once the run's serial is
    larger than ``seen``, or after ``long_poll_s`` (``n`` then is not larger).

    With ``sig`` (the page signature the tab drew), ``opts`` (its ``options_query``) and ``held`` (a
    JSON object: chart element key -> the figure token it holds), a newer serial's answer also
    carries ``feed.feed_answer`` for them; ``alerts(run)`` are the run's firing alerts.

    A name that is no run (or outside the runs root) is answered 404 at once (``run_refusal``): only
    runs get a ticker.  Beyond ``long_polls_max`` polls waiting at once, a poll is answered 503."""
    tickers: dict[str, _Ticker] = {}
    answers = SharedAnswers()
    waiting = 0

    async def answer(request: Request) -> Response:
        nonlocal waiting
        query = request.query_params
        name = query.get("run", "")
        try:
            seen = int(query.get("seen", "0"))
            feed = (query["sig"], parse_options(query["opts"]), _held(query["held"])) if "held" in query else None
        except (ValueError, KeyError) as exc:
            return JSONResponse({"error": f"bad query: {exc}"}, status_code=400)
        if waiting >= long_polls_max:
            busy = {"error": f"{waiting} long polls are waiting: ask again later"}
            return JSONResponse(busy, status_code=503, headers={"Retry-After": str(max(1, round(refresh())))})
        ticker = tickers.get(name)
        if ticker is None:
            try:
                await to_thread.run_sync(store().view, name)
            except RunViewError:
                pass  # a run that cannot be shown: its tabs rerun every period and say why
            except (MetricsError, OSError) as exc:
                return JSONResponse({"error": run_refusal(name, exc)}, status_code=404)
            ticker = tickers.get(name)  # another request may have made it meanwhile
        if ticker is None:
            if len(tickers) > 1000:  # runs watched once: keep the ones being watched
                for stale in [key for key, value in tickers.items() if not value._waiting]:
                    del tickers[stale]
            ticker = tickers[name] = _Ticker(store, name, refresh())
        waiting += 1
        try:
            serial = await _unless_gone(request, ticker.newer_than(seen, long_poll_s))
        finally:
            waiting -= 1
        if serial is None:
            return Response(status_code=204)  # nobody is left to read it
        view = ticker.view  # no await since: the snapshot of ``serial``
        body: dict[str, Any] = {"serial": serial}
        if serial > seen and feed is not None:
            if view is None:
                body["rerun"] = True  # the run cannot be shown: the page says why
            else:
                drawn, options, held = feed
                if not await to_thread.run_sync(x_allowed, view, options.x):
                    return JSONResponse({"error": f"bad query: opts: x {options.x!r} is no x of this run"}, 400)
                key = (drawn, query["opts"], tuple(sorted(held.items())))
                body.update(
                    await answers.get(name, serial, key, lambda: _feed(view, options, alerts(name), drawn, held))
                )
        return JSONResponse(body)

    return Route(f"{base_path(base_url)}{CHANGES_PATH}", answer, methods=["GET"])


async def _unless_gone(request: Request, waited: Coroutine[Any, Any, int]) -> int | None:
    """``waited``'s result, or None once the client of ``request`` closed its connection first: a closed
    tab's long poll gives its place (``LONG_POLLS_MAX``) back at once, and a server stopping (which
    waits for the requests in flight) is not kept waiting by it."""
    result = asyncio.ensure_future(waited)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        result.cancel()  # nothing when it is done
    return result.result() if result.done() and not result.cancelled() else None


async def _client_gone(request: Request) -> None:
    """Returns once the client of ``request`` is gone: an ASGI server's ``receive`` gives a GET's
    empty body, then waits for the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def run_refusal(run: str, exc: BaseException) -> str:
    """Why run ``run`` cannot be answered, in words that name no server path: the store's errors
    name the runs root and the run's files, which a client has no business knowing."""
    if isinstance(exc, RunPathError):
        return f"run {run!r} is not inside the runs root"
    if isinstance(exc, RunViewError):
        return f"run {run!r} cannot be shown (its page says why)"
    if isinstance(exc, FileNotFoundError):
        return f"no run {run!r}"
    return f"run {run!r} cannot be read"


def _feed(view: RunView, options: ChartOptions, alerts: Sequence[str], drawn: str, held: dict[str, int]) -> dict:
    try:
        return feed_answer(view, options, alerts, drawn, held)
    except Exception:  # the rerun draws the page, and says what went wrong there
        _LOG.exception("live feed of %s", view.name)
        return {"rerun": True}


@cache
def _watch() -> object:
    return st.components.v2.component("metrics_live_watch", js=(_ASSETS / "live_watch.js").read_text(encoding="utf-8"))


def watched_hold() -> None:
    """At the start of a live fragment that ``live_watch`` reran: the figures the page says its
    charts hold (``chart_component.pages_hold``), which this run's charts extend.  Before the
    charts are built, and before ``live_watch``, which may be drawn after them."""
    state = st.session_state.get(WATCH_KEY)
    changed = state.get("changed") if hasattr(state, "get") else None
    if isinstance(changed, dict) and isinstance(changed.get("held"), dict):
        pages_hold(changed["held"])


def live_watch(
    name: str, view: RunView | None, *, refresh: float, options: ChartOptions, alerts: Sequence[str] = ()
) -> None:
    """In a live fragment without ``run_every`` (that called ``watched_hold`` first): show ``view``'s
    status line (none when None: the run could not be shown, and the page says why) and keep the
    page on run ``name``'s newest snapshot, the charts drawn with ``options`` and the run's firing
    ``alerts``: through the route's answers, or a rerun of the fragment when anything else changed
    (None: every ``refresh`` seconds)."""
    query = {"run": name, "seen": 0 if view is None else snapshot_serial(view)}
    data: dict[str, Any] = {"retry_ms": round(refresh * 1000)}
    if view is not None:
        signature = page_signature(view, options, alerts)
        query.update(sig=signature.layout, opts=options_query(options))
        data.update(details=signature.details, details_ms=round(DETAILS_S * 1000))
        data["status"], data["counts"] = status_line(view)
    data["url"] = f"{route_url(CHANGES_PATH)}?{urlencode(query)}"
    _watch()(key=WATCH_KEY, data=data, height="content")
