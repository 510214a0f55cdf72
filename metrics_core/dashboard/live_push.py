"""A live page reruns when its run changed, not every refresh period: the server says when.

A fragment with ``run_every`` reruns in every tab every refresh period, whether or not the run
changed: a script run, every element built, sent and compressed, per tab, twice a second, for a
run that appends a record a minute.  Where the server serves ``changes_route`` (``server_routes``),
the run page's live fragment has no ``run_every``; it mounts ``live_watch`` instead, an element
that draws nothing and asks the route, "has the run changed since the snapshot this tab drew?"
(a long poll: the answer comes when it has, or after ``LONG_POLL_S`` to ask again), and reruns the
fragment (a component trigger, Streamlit's public way) when it has.

Which snapshot a tab drew is its serial (``snapshot_serial``): a number per ``RunView`` object,
increasing with each new one (``RunStore.view`` returns the same object while nothing changed).
Per run, one ``_Ticker`` asks the store for the run's view ``POLLS_PER_REFRESH`` times per refresh
period while any tab waits, and wakes every waiting tab when it gets a newer one: twenty idle tabs
cost those few ``store.view`` calls between them (a ``stat`` at most, when nothing changed), and
nothing per tab; a record waits a quarter of a period on average to be noticed, not half of one.
A run the store cannot show gets a new serial at each poll, so its tabs rerun every period (the
watch pauses a period after each trigger), as they did, and say why.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import Callable
from functools import cache
from pathlib import Path
from urllib.parse import urlencode

import streamlit as st
from anyio import to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from metrics_core.dashboard.live_chart import base_path
from metrics_core.dashboard.server_routes import route_url
from metrics_core.dashboard.store import RunStore, RunView
from metrics_core.errors import MetricsError

CHANGES_PATH = "/api/changes"  # outside Streamlit's reserved prefixes
WATCH_KEY = "metrics_live_watch"  # the element draws nothing: widgets.CALM_CSS hides it
POLLS_PER_REFRESH = 2
LONG_POLL_S = 20.0  # an unchanged run is answered after this long; the page asks again
_ASSETS = Path(__file__).parent / "assets"

_serials: weakref.WeakKeyDictionary[RunView, int] = weakref.WeakKeyDictionary()
_serial_lock = threading.Lock()
_counter = itertools.count(1)


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
                    serial = snapshot_serial(await to_thread.run_sync(self._store().view, self._name))
                except (MetricsError, OSError):
                    serial = next(_counter)  # the page says why, and tries again next period
                if serial > self.serial:
                    self.serial = serial
                    self._newer.set()
                    self._newer = asyncio.Event()
                await asyncio.sleep(self._refresh / POLLS_PER_REFRESH)
        finally:
            self._task = None


def changes_route(
    store: Callable[[], RunStore],
    refresh: Callable[[], float],
    *,
    base_url: str = "",
    long_poll_s: float = LONG_POLL_S,
) -> Route:
    """``GET /api/changes?run=<name>&seen=<serial>``: ``{"serial": n}`` once the run's serial is
    larger than ``seen``, or after ``long_poll_s`` (``n`` then is not larger)."""
    tickers: dict[str, _Ticker] = {}

    async def answer(request: Request) -> Response:
        name = request.query_params.get("run", "")
        try:
            seen = int(request.query_params.get("seen", "0"))
        except ValueError:
            return JSONResponse({"error": "seen is not a number"}, status_code=400)
        ticker = tickers.get(name)
        if ticker is None:
            if len(tickers) > 1000:  # names asked for once: keep the ones being watched
                for stale in [key for key, value in tickers.items() if not value._waiting]:
                    del tickers[stale]
            ticker = tickers[name] = _Ticker(store, name, refresh())
        return JSONResponse({"serial": await ticker.newer_than(seen, long_poll_s)})

    return Route(f"{base_path(base_url)}{CHANGES_PATH}", answer, methods=["GET"])


@cache
def _watch() -> object:
    return st.components.v2.component("metrics_live_watch", js=(_ASSETS / "live_watch.js").read_text(encoding="utf-8"))


def live_watch(name: str, view: RunView | None, *, refresh: float) -> None:
    """In a live fragment without ``run_every``: rerun it when run ``name`` has a snapshot newer
    than ``view`` (None: the run could not be shown; ask again every ``refresh`` seconds)."""
    seen = 0 if view is None else snapshot_serial(view)
    url = f"{route_url(CHANGES_PATH)}?{urlencode({'run': name, 'seen': seen})}"
    _watch()(key=WATCH_KEY, data={"url": url, "retry_ms": round(refresh * 1000)}, height="content")
