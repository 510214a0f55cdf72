"""How the dashboard is served: everything app.py adds around Streamlit's own serving, fenced here.

``app_options(app.py)`` are the keyword arguments of the ``st.App`` that ``streamlit run app.py``
serves.  ``METRICS_SERVE_PLAIN=1`` is the one switch that turns all of this off: the app is then
served exactly as Streamlit serves it (the lifespan only runs the app's shutdown, no routes of
the server's own, no middleware but the access check, ``access``, which is not a fast path and
never switched off with it), and every page still works, only slower on a first load.  This
package (``serving``, ``page_head``, ``asgi_gzip``, ``connection_guard``) is the only place that imports a private
Streamlit module or names a path Streamlit serves (``tests/unit/test_layers.py`` checks it).  What each
part does, and the Streamlit behaviour it leans on (each has a test in ``tests/*/test_serving*.py``
that fails when a Streamlit upgrade changes it):

* ``StaticGzip`` (``asgi_gzip``): Streamlit's content-hashed static files (``/static/...``) and
  the published plotly.js go out gzip-compressed, each compressed once per process, made ahead of
  the first request for what a first page load asks for (``page_head.static_files``).  Streamlit
  serves them uncompressed on purpose: its own gzip would compress every answer again.  Leans on:
  Streamlit's static directory and its ``immutable`` answers for hashed bundles.
* ``PreloadHints`` and ``plotly_url`` (``page_head``): the page's head tags, and where Streamlit
  serves plotly.js; what they lean on is in that module's docstring.
* the server's own routes (``downloads.own_routes``: a chart's CSV, a run's changes) under paths
  Streamlit does not serve (``STREAMLIT_PATHS``); pages ask ``routes_served`` and, where they are
  not served (plain serving, ``AppTest``), do without them: a download button instead of a CSV
  link, a fragment rerun every refresh period instead of one per change of the run.  Leans on:
  ``st.App``'s public ``routes`` only.
* ``ConnectionGuard`` (``connection_guard``): a connection that does not send a request's headers
  in time is closed, and open connections stay under a cap below the process's file limit.  Leans
  on: the uvicorn protocol class Streamlit serves connections with (its module docstring says what).
* ``lifespan``: as the server starts, imports what the pages import and does Streamlit's
  once-per-process first-run work (``warm_first_script_run``: its emoji catalog, the private
  ``delta_generator._maybe_print_use_warning``) in a background thread, and makes the gzip copies
  a first page load asks for; keeps Streamlit out of its legacy folder-of-pages mode (the private
  ``PagesManager.uses_pages_directory``: an app with a ``pages/`` folder beside it starts in that
  mode until the first ``st.navigation`` call, so a deep link as the first request after a start
  would run that page alone, outside app.py's navigation; served plain, that first deep link
  does); turns Nagle's algorithm off on the listening socket
  (``tcp_no_delay``: Streamlit binds it with ``proto`` 0, so asyncio never sets ``TCP_NODELAY`` on
  its connections, and each kept-alive answer, written as headers then body, waits for a delayed
  ACK).  As it stops it runs the app's shutdown: under
  uvicorn, SIGTERM and Ctrl-C end the process by raising the signal again after the shutdown, so
  ``atexit`` handlers never run and this is the last Python code that does.
* ``exit_within``: the server ends when told to, whatever it is computing.  uvicorn stops
  gracefully on SIGTERM: it waits, with no time limit, for every open connection to finish its
  answer, then runs the shutdown (the stores close).  An answer that waits for a long computation
  in a worker thread (a first view of a huge run), or a close that waits for a lock such a thread
  holds, would keep the process alive as long as that computation takes.  While the server
  serves, a handler in front of uvicorn's passes the signal on and starts a daemon thread that
  ends the process ``STOP_DEADLINE_S`` later if it still runs, with a shell's status for a killed
  child (128 + the signal).  Python runs signal handlers in the main thread between bytecodes,
  which the event loop's thread reaches while workers compute (the interpreter lock is handed
  over every few milliseconds).  Leans on: uvicorn installing its handlers before the lifespan
  starts, and running the lifespan in the main thread.

``import metrics_core`` never imports this module: only app.py does, when ``streamlit run`` serves
the app through ``st.App``, and the pages, for ``routes_served`` and ``plotly_url``.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import streamlit as st
from anyio import to_thread
from starlette.middleware import Middleware
from starlette.routing import BaseRoute
from streamlit import config
from streamlit.runtime.pages_manager import PagesManager

from metrics_core.dashboard.server.access import (
    Access,
    AccessGuard,
    access_url,
    is_loopback,
    refuse_open_bind,
    server_token,
)
from metrics_core.dashboard.server.asgi_gzip import GzipCopies, StaticGzip
from metrics_core.dashboard.server.connection_guard import ConnectionGuard, guard_connections, guarding
from metrics_core.dashboard.server.page_head import (
    ALL_ELEMENTS,
    PAGE_ELEMENTS,
    PLOTLY_ASSETS,
    PreloadHints,
    page_head,
    plotly_file,
    static_files,
)

# The path prefixes Streamlit serves itself: the server's own routes stay outside them.
STREAMLIT_PATHS = ("/_stcore/", "/static/", "/media/", "/component/", "/app/static/")
_served: list[bool] = []  # [True] while this process serves its own routes


@contextmanager
def serving_routes(served: bool) -> Iterator[None]:
    """While inside, ``routes_served()`` is ``served`` (the server's lifespan)."""
    _served[:] = [True] if served else []
    try:
        yield
    finally:
        _served.clear()


def routes_served() -> bool:
    """Whether this process serves the dashboard's own routes now (``app_options``' ``routes``)."""
    return bool(_served)


def tcp_no_delay(port: int) -> int:
    """Set ``TCP_NODELAY`` on this process's listening TCP sockets bound to ``port`` (the connections
    they accept inherit it; see the module docstring for why); return how many were set.  Found
    among the process's open file descriptors: Streamlit keeps its listening socket to itself.  A
    platform without ``/proc/self/fd`` or ``/dev/fd`` (Windows) is left as it is."""
    folder = next((Path(name) for name in ("/proc/self/fd", "/dev/fd") if Path(name).is_dir()), None)
    if folder is None:
        return 0
    changed = 0
    for entry in os.listdir(folder):
        try:
            fd = int(entry)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            duplicate = os.dup(fd)
        except (ValueError, OSError):  # not a number, or closed since it was listed
            continue
        try:
            sock = socket.socket(fileno=duplicate)  # family and type read from the descriptor
        except OSError:
            os.close(duplicate)
            continue
        # Closing ``sock`` closes the duplicate only; the option belongs to the socket both name.
        with sock, contextlib.suppress(OSError):
            if (
                sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.type == socket.SOCK_STREAM
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                and sock.getsockname()[1] == port
            ):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                changed += 1
    return changed


def lifespan(
    scripts: Sequence[Path],
    shutdown: Callable[[], None],
    *,
    warm: bool = True,
    no_delay: bool = True,
    navigation_only: bool = True,
    prewarm: Callable[[], None] | None = None,
    own_routes: bool = True,
    announce: Callable[[], str] | None = None,
    guard: ConnectionGuard | None = None,
) -> Callable[[object], AbstractAsyncContextManager[None]]:
    """An ``st.App`` lifespan: at start, if ``warm``, in a daemon thread, does what Streamlit does once
    in the first script run of a process (``warm_first_script_run``) and imports every module the top level of
    ``scripts`` imports (read with ``ast``, not run; a module that fails to import is left for the
    page to report), runs ``prewarm`` in another (the gzip copies of a first page load's files: zlib
    leaves the interpreter lock to the imports) and, if ``no_delay``, turns Nagle's algorithm off on
    the server's listening socket (``tcp_no_delay``: the socket is bound before the lifespan starts,
    and no connection is accepted before it has); if ``navigation_only``, keeps Streamlit out of its
    legacy folder-of-pages mode before any session; if ``own_routes``, pages use this module's routes
    (``routes_served``) while it serves; ``guard`` watches every connection while it serves
    (``connection_guard.guarding``); prints ``announce()`` (the URL to open) once it listens; at
    shutdown, runs ``shutdown`` in a worker thread (see the module docstring); whatever a thread is
    computing, the process ends at most ``STOP_DEADLINE_S`` after SIGTERM or SIGINT."""
    modules = sorted({name for script in scripts for name in _imported(script)})

    def run() -> None:
        warm_first_script_run()
        for module in modules:
            with contextlib.suppress(Exception):  # the page that imports it shows the error
                importlib.import_module(module)

    @asynccontextmanager
    async def serve(_app: object) -> AsyncIterator[None]:
        if navigation_only:
            PagesManager.uses_pages_directory = False
        if no_delay:
            tcp_no_delay(config.get_option("server.port"))
        if warm:
            threading.Thread(target=run, name="warm-imports", daemon=True).start()
        if prewarm is not None:
            threading.Thread(target=prewarm, name="warm-gzip", daemon=True).start()
        if announce is not None:
            print(announce(), flush=True)
        with exit_within():  # in front of uvicorn's handlers: a stop that hangs is cut (``exit_within``)
            try:
                with serving_routes(own_routes), guarding(guard):
                    yield
            finally:
                await to_thread.run_sync(shutdown)  # a store's close waits for its loader

    return serve


def warm_first_script_run() -> None:
    """Do now, off any page view, the work Streamlit does once per process in the first script run:
    import its emoji catalog (``st.set_page_config`` with an emoji page icon imports it, a large
    module) and decide whether to warn that the app was started without ``streamlit run`` (the
    first element of a process calls ``inspect.stack()``, slow, and prints nothing under a server).
    The check is a private function of Streamlit's: if it is gone, the first page view pays for it
    as before."""
    from streamlit import delta_generator, emojis  # noqa: F401 - imported for the side effect

    warn_once = getattr(delta_generator, "_maybe_print_use_warning", None)
    if callable(warn_once):
        with contextlib.suppress(Exception):
            warn_once()


def _imported(script: Path) -> list[str]:
    tree = ast.parse(script.read_text(encoding="utf-8"))
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def serve_plain(environ: Mapping[str, str]) -> bool:
    """The switch: ``METRICS_SERVE_PLAIN=1`` serves the app exactly as Streamlit serves it."""
    return environ.get("METRICS_SERVE_PLAIN") == "1"


def app_options(
    script: str | Path,
    *,
    shutdown: Callable[[], None],
    routes: Callable[[str], Sequence[BaseRoute]] = lambda base_url: [],
    environ: Mapping[str, str] = os.environ,
) -> dict:
    """The keyword arguments of app.py's ``st.App``: this package's middleware and lifespan for
    ``script`` (whose pages live in ``pages/`` beside it) and the server's own ``routes(base_url)``
    (``downloads.own_routes``), or, when ``serve_plain``, a lifespan that only runs ``shutdown`` as
    the server stops (it runs either way).  The access check (``access_guard``) comes first either way."""
    base_url = st.get_option("server.baseUrlPath") or ""
    guard, announce = access_guard(environ, base_url)
    if serve_plain(environ):
        plain = lifespan(
            [], shutdown, warm=False, no_delay=False, navigation_only=False, own_routes=False, announce=announce
        )
        return {"lifespan": plain, "middleware": [guard]}
    copies = GzipCopies()

    def prewarm() -> None:
        """Each page's head tags (finding the chunks they preload reads Streamlit's chunk files), and
        the gzip copies of what a first load of any page asks for: Streamlit's boot, the pages'
        element chunks, plotly.js."""
        for page in PAGE_ELEMENTS:
            page_head(page)
        plotly = plotly_file()
        copies.prewarm([*static_files(ALL_ELEMENTS), *([plotly] if plotly else [])])

    pages = sorted(Path(script).with_name("pages").glob("*.py"))
    return {
        "lifespan": lifespan(pages, shutdown, prewarm=prewarm, announce=announce, guard=guard_connections(environ)),
        "middleware": [
            guard,
            Middleware(StaticGzip, base_url=base_url, hashed=[PLOTLY_ASSETS], copies=copies),
            Middleware(PreloadHints, base_url=base_url, head=page_head),
        ],
        "routes": list(routes(base_url)),
    }


def access_guard(environ: Mapping[str, str], base_url: str) -> tuple[Middleware, Callable[[], str]]:
    """The access check every request passes first (``access.AccessGuard``), in plain serving too,
    and the line the server prints once it listens: the URL to open, with its token (made then:
    Streamlit may move to the next free port), the only one printed: Streamlit's own welcome lines,
    whose URLs lack the token, are off (``logger.hideWelcomeMessage`` in .streamlit/config.toml, read
    before app.py is imported; tests/integration/test_serving_processes.py checks it).  ``SystemExit``
    with one line when ``METRICS_TOKEN`` is refused (``server_token``) or the server would listen
    beyond loopback with no token."""
    address = str(config.get_option("server.address") or "")
    token = server_token(environ)
    refusal = refuse_open_bind(address, token)
    if refusal is not None:
        raise SystemExit(refusal)

    def announce() -> str:
        url = access_url(address, int(config.get_option("server.port")), base_url, token)
        return f"Open the dashboard: {url}" + ("" if token else " (no access token: METRICS_TOKEN=off)")

    access = Access(token=token, loopback=bool(address) and is_loopback(address))
    return Middleware(AccessGuard, access=access, base_url=base_url), announce


STOP_DEADLINE_S = 8.0  # after SIGTERM: within a scheduler's usual grace period (10 s and more)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def exit_within(seconds: float = STOP_DEADLINE_S, signals: Sequence[signal.Signals] = SIGNALS) -> Iterator[bool]:
    """While inside, any of ``signals`` ends the process ``seconds`` later unless it ended before;
    the handlers installed on entry still run first, and are put back on exit.  Only the main
    thread may install signal handlers: elsewhere (a server a test runs in a thread) nothing is
    installed, and the value is False."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    started = threading.Event()
    replaced = {number: signal.getsignal(number) for number in signals}
    for number, previous in replaced.items():
        if previous is not signal.SIG_IGN:
            signal.signal(number, _handler(previous, seconds, started))
    try:
        yield True
    finally:
        for number, previous in replaced.items():
            signal.signal(number, previous)


def _handler(previous: Any, seconds: float, started: threading.Event) -> Callable[[int, FrameType | None], None]:
    def received(number: int, frame: FrameType | None) -> None:
        if not started.is_set():
            started.set()
            threading.Thread(target=_end, args=(number, seconds), name="stop deadline", daemon=True).start()
        if callable(previous):
            previous(number, frame)
        else:  # the default action: nothing graceful was installed to wait for
            _end(number, 0.0)

    return received


def _end(number: int, seconds: float) -> None:
    time.sleep(seconds)
    name = signal.Signals(number).name
    os.write(sys.stderr.fileno(), f"still running {seconds:g} s after {name}: exiting now\n".encode())
    os._exit(128 + number)  # no thread is waited for, no atexit handler runs: what SIGKILL would do, sooner
