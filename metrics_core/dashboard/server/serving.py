"""How the dashboard is served: everything app.py adds around Streamlit's own serving, fenced here.

``app_options(app.py)`` are the keyword arguments of the ``st.App`` that ``streamlit run app.py``
serves.  ``METRICS_SERVE_PLAIN=1`` is the one switch that turns all of this module off: the app is
then served exactly as Streamlit serves it (the lifespan only runs the app's shutdown), and every
page still works, only slower on a first load.  What each part does, and the Streamlit behaviour
it leans on (each has a test in ``tests/test_serving.py`` that fails when a Streamlit upgrade
changes it):

* ``StaticGzip`` (``asgi_gzip``): Streamlit's content-hashed static files (``/static/...``) and
  the published plotly.js go out gzip-compressed, each compressed once per process, made ahead of
  the first request for what a first page load asks for (``static_files``).  Streamlit serves them
  uncompressed on purpose: its own gzip would compress every answer again.  Leans on: Streamlit's
  static directory (``streamlit.file_util.get_static_dir``, its ``index.html``) and its
  ``immutable`` answers for hashed bundles.
* ``PreloadHints``: the page's HTML (Streamlit's index.html) gets ``BASE_URL_SCRIPT`` where the
  page's directory is the base URL (so a deep link does not probe its own path for the server
  first), ``modulepreload`` tags for the lazily loaded chunks of the elements that page draws
  (``PAGE_ELEMENTS``, ``chunk_preloads``) and plotly.js run early on chart pages
  (``plotly_head_tags``).  The edited HTML keeps Streamlit's ``no-cache`` and loses its ``ETag``
  and ``Last-Modified`` (they describe the file, not the answer).  Leans on: the undocumented
  ``window.__streamlit.BACKEND_BASE_URL``, the chunk file names ``<Element>.<hash>.js`` and their
  static imports, and the ``data-test-script-state`` attribute of Streamlit's root.
* ``csv_route`` (``downloads``): a chart's CSV at a URL of its own, so the run page's live charts
  carry a link instead of a download widget rebuilt on every refresh; ``changes_route``
  (``live_push``): a run's tabs rerun their live fragment when the run changed, not every refresh
  period.  Leans on: ``st.App``'s public ``routes`` only.
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

``import metrics_core`` never imports this module: only app.py does, when ``streamlit run`` serves
the app through ``st.App``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gzip
import html
import importlib
import json
import os
import re
import socket
import stat
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import streamlit as st
from anyio import to_thread
from starlette.middleware import Middleware
from streamlit import config
from streamlit.runtime.pages_manager import PagesManager

from metrics_core.dashboard.alerting import run_alerts
from metrics_core.dashboard.downloads import csv_route
from metrics_core.dashboard.live.chart_component import PLOTLY_ASSETS, plotly_file, plotly_url
from metrics_core.dashboard.live.push import changes_route
from metrics_core.dashboard.server.asgi_gzip import (
    ASGIApp,
    GzipCopies,
    Message,
    Receive,
    Scope,
    Send,
    StaticGzip,
    accepts_gzip,
    header,
    held,
    route_path,
    send_whole,
    without,
)
from metrics_core.dashboard.server.routes import serving_routes
from metrics_core.dashboard.settings import open_alerter, open_store, settings
from metrics_core.errors import MetricsError

# A chunk's static imports, as Streamlit's bundler writes them: `from"./x.js"` or `import"./x.js"` (not
# `import("./x.js")`, which loads lazily).
_STATIC_IMPORT = re.compile(r'(?:\bfrom|\bimport)\s*"\./([\w.\-]+\.js)"')


# Streamlit's page finds its server by trying the page's own path first: a deep link such as
# /run?run=x asks /run/_stcore/health, gets a 404, backs off and tries /.  The page's directory
# is the server's base URL (Streamlit's own tags are relative to it, "./static/..."); naming it
# in ``window.__streamlit`` (read once by Streamlit's bundle as it starts) leaves one candidate.
# A value the page already has (an embedding host's) is kept.
BASE_URL_SCRIPT = (
    '<script>window.__streamlit = Object.assign({BACKEND_BASE_URL: new URL(".", location.href).href}, '
    "window.__streamlit);</script>"
)


class PreloadHints:
    """ASGI middleware: the page's HTML with ``BASE_URL_SCRIPT`` (where the page's directory is the
    base URL) and the tags ``head(page)`` returns, the first before Streamlit's own scripts and
    preloads, the second at the end of its ``<head>``, where ``page`` is the first segment of the
    route path ("" for the main page; see the module docstring)."""

    def __init__(self, app: ASGIApp, *, head: Callable[[str], tuple[str, str]], base_url: str = "") -> None:
        self.app = app
        self._head = head
        self.base_url = base_url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or "text/html" not in header(scope["headers"], b"accept")
        ):
            await self.app(scope, receive, send)
            return
        wanted = accepts_gzip(header(scope["headers"], b"accept-encoding"))
        route = route_path(scope, self.base_url)
        # The page's directory is the base URL only for / (with its slash) and /<page>.
        at_base = route.count("/") == 1 and (route != "/" or scope["path"].endswith("/"))
        first, last = self._head(route.strip("/").partition("/")[0])
        first = ((BASE_URL_SCRIPT if at_base else "") + first).encode()

        async def answer(start: Message, body: bytes) -> None:
            head, end, rest = body.partition(b"</head>")
            before = head.find(b"<script")  # Streamlit's first script, after its meta tags
            before = len(head) if before < 0 else before
            body = head[:before] + first + head[before:] + last.encode() + end + rest
            headers = without(start["headers"], b"content-length", b"etag", b"last-modified", b"vary")
            headers.append((b"vary", b"Accept-Encoding"))
            if wanted:
                body = gzip.compress(body, compresslevel=6, mtime=0)  # a small page: cheap per request
                headers.append((b"content-encoding", b"gzip"))
            await send_whole(send, start, headers, body)

        # Asked without Accept-Encoding, Streamlit answers identity bytes, which can be edited.
        inner = {**scope, "headers": without(scope["headers"], b"accept-encoding")}
        await self.app(inner, receive, held(send, _html, answer))


def _static_dir() -> Path:
    from streamlit import file_util

    return Path(file_util.get_static_dir())


def _index_files() -> list[str]:
    """The scripts and styles Streamlit's index.html names, as paths under its static directory."""
    return re.findall(r"\./(static/(?:js|css)/[^\"]+)\"", (_static_dir() / "index.html").read_text(encoding="utf-8"))


@functools.cache
def _chunks(names: tuple[str, ...]) -> tuple[str, ...]:
    """Streamlit's lazily loaded chunks ``<name>.<hash>.js`` and every chunk they import statically,
    transitively, except those Streamlit's index.html already names."""
    folder = _static_dir() / "static" / "js"
    named = {path.rpartition("/")[2] for path in _index_files()}
    pending = sorted(path.name for name in names for path in folder.glob(f"{name}.*.js"))
    found: list[str] = []
    while pending:
        name = pending.pop(0)
        if name in found or name in named or not (folder / name).is_file():
            continue
        found.append(name)
        pending.extend(_STATIC_IMPORT.findall((folder / name).read_text(encoding="utf-8", errors="replace")))
    return tuple(found)


@functools.cache
def chunk_preloads(names: tuple[str, ...], *, without: tuple[str, ...] = ()) -> str:
    """``<link rel="modulepreload">`` tags for Streamlit's lazily loaded chunks ``<name>.<hash>.js``
    and every chunk they import statically, transitively (Chromium preloads only the module named,
    and each import found only as the module is parsed costs a round trip), except those Streamlit's
    index.html already preloads and those of the elements ``without``; relative like Streamlit's own
    (so they hold under a base URL path); none for a name this Streamlit does not ship."""
    skip = set(_chunks(without))
    kept = [name for name in _chunks(names) if name not in skip]
    return "".join(f'<link rel="modulepreload" crossorigin href="./static/js/{name}">' for name in kept)


def when_in_page(selector: str, function: str, *, idle: bool = False, attribute: str | None = None) -> str:
    """A ``<script>`` tag that calls the JavaScript ``function`` once an element matching ``selector``
    is in the page (``attribute``: one whose change can make it match), in a task of its own, or when
    the browser is next idle."""
    watch = f', attributeFilter: ["{attribute}"]' if attribute else ""
    later = "(window.requestIdleCallback || setTimeout)" if idle else "setTimeout"
    return (
        "<script>(() => {"
        " const observer = new MutationObserver(() => {"
        f" if (!document.querySelector({json.dumps(selector)})) return;"
        " observer.disconnect();"
        f" {later}({function});"
        " });"
        f" observer.observe(document, {{ subtree: true, childList: true{watch} }});"
        " })();</script>"
    )


def after_first_run(script: str) -> str:
    """A ``<script>`` tag that runs the JavaScript ``script`` once the page's first script run has
    finished (Streamlit marks its root ``data-test-script-state="notRunning"``) and the browser is
    idle: for what the reader's next page needs, done while they read this one.  If Streamlit stops
    marking its root so, the script never runs and the next page fetches what it needs itself."""
    finished = "[data-testid=stApp][data-test-script-state=notRunning]"
    return when_in_page(finished, f"() => {{ {script} }}", idle=True, attribute="data-test-script-state")


def static_files(names: tuple[str, ...]) -> list[tuple[str, Path]]:
    """What a first page load asks of Streamlit's static directory and ``GzipCopies`` keeps, as (route
    path, file): the scripts and styles of its index.html, then the chunks of the elements ``names``
    (as ``chunk_preloads`` names them)."""
    static = _static_dir()
    paths = [*_index_files(), *(f"static/js/{name}" for name in _chunks(names))]
    return [(f"/{path}", static / path) for path in paths]


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
) -> Callable[[object], AbstractAsyncContextManager[None]]:
    """An ``st.App`` lifespan: at start, if ``warm``, in a daemon thread, does what Streamlit does once
    in the first script run of a process (``warm_first_script_run``) and imports every module the top level of
    ``scripts`` imports (read with ``ast``, not run; a module that fails to import is left for the
    page to report), runs ``prewarm`` in another (the gzip copies of a first page load's files: zlib
    leaves the interpreter lock to the imports) and, if ``no_delay``, turns Nagle's algorithm off on
    the server's listening socket (``tcp_no_delay``: the socket is bound before the lifespan starts,
    and no connection is accepted before it has); if ``navigation_only``, keeps Streamlit out of its
    legacy folder-of-pages mode before any session; if ``own_routes``, pages use this module's routes
    (``server_routes``) while it serves; at shutdown, runs ``shutdown`` in a worker thread (see the module
    docstring)."""
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
        try:
            with serving_routes(own_routes):
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


def _html(start: Message) -> bool:
    return start["status"] == 200 and dict(start["headers"]).get(b"content-type", b"").startswith(b"text/html")


# -- plotly.js in the page's head ---------------------------------------------------------------------

# ``window.__metricsRunPlotly`` runs plotly.js once per page from its content-hashed URL, answered
# immutable (``StaticGzip(hashed=[PLOTLY_ASSETS])``), so the browser keeps the file and its compiled
# code; the chart runtime (assets/live_chart.js) calls it when a chart page is reached without a
# reload and takes the promise over.  Without it (plain serving) the runtime loads plotly.js itself.
_PLOTLY_RUNNER = """(() => {
  const src = PLOTLY_URL;
  window.__metricsRunPlotly = () => {
    window.__metricsPlotly = window.__metricsPlotly || new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = src;
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => reject(new Error(`${src}: not run`));
      document.head.appendChild(script);
    });
  };
})();"""


def plotly_head_tags(*, chart_page: bool) -> str:
    """Tags for a page's ``<head>``: ``window.__metricsRunPlotly``; on a chart page a preload of
    plotly.js and its run as soon as Streamlit's React root is up (while Streamlit waits for its
    websocket and first script run), on another its run once the page is drawn and idle
    (``after_first_run``: the reader's next page usually has charts); "" where Streamlit does not
    serve plotly.js as a file (then it rides in the loader element)."""
    url = plotly_url()
    if url is None:
        return ""
    runner = _PLOTLY_RUNNER.replace("PLOTLY_URL", json.dumps(url).replace("</", "<\\/"))
    if not chart_page:
        return f"<script>{runner}</script>" + after_first_run("window.__metricsRunPlotly();")
    early = when_in_page("[data-testid=stApp]", "window.__metricsRunPlotly")
    return f'<link rel="preload" as="script" href="{html.escape(url)}"><script>{runner}</script>{early}'


# -- the app's pages ----------------------------------------------------------------------------------

# The lazily loaded chunks of the Streamlit elements each page draws (by url_path; "" is the runs
# page), preloaded with the page's HTML instead of discovered as its elements arrive.
# BidiComponent mounts the plotly.js loader and the charts.
# fmt: off
PAGE_ELEMENTS = {
    "": ("DataFrame", "Multiselect", "TextInput", "TextArea", "Html"),
    "run": ("BidiComponent", "Html", "Selectbox", "Slider", "Checkbox", "Radio", "PageLink", "DownloadButton",
            "TextInput", "rehype-raw"),
    "sessions": ("BidiComponent", "Html", "Metric", "DataFrame", "ButtonGroup", "Slider", "PageLink",
                 "DownloadButton", "Selectbox", "remark-emoji"),
    "compare": ("BidiComponent", "Html", "Multiselect", "TextInput", "ButtonGroup", "Checkbox", "Slider"),
}
# fmt: on
CHART_PAGES = ("run", "sessions", "compare")
_ALL_ELEMENTS = tuple(dict.fromkeys(name for names in PAGE_ELEMENTS.values() for name in names))
_CHART_ELEMENTS = tuple(dict.fromkeys(name for page in CHART_PAGES for name in PAGE_ELEMENTS[page]))


def page_head(page: str) -> tuple[str, str]:
    """The tags for the start and the end of ``page``'s head (``PreloadHints``): its plotly.js and
    element chunks; on a page without charts (the runs page, where a reader starts), once it is
    drawn and idle, the chart pages' chunks too.  Chart pages do not prepare the others: that would
    add to every chart page's first load."""
    own = PAGE_ELEMENTS.get(page, ())
    plotly = plotly_head_tags(chart_page=page in CHART_PAGES)
    if page in CHART_PAGES:
        return "", plotly + chunk_preloads(own)
    others = chunk_preloads(_CHART_ELEMENTS, without=own)
    return "", plotly + chunk_preloads(own) + after_first_run(
        f"document.head.insertAdjacentHTML('beforeend', {json.dumps(others)});"
    )


def serve_plain(environ: Mapping[str, str]) -> bool:
    """The switch: ``METRICS_SERVE_PLAIN=1`` serves the app exactly as Streamlit serves it."""
    return environ.get("METRICS_SERVE_PLAIN") == "1"


def app_options(script: str | Path, *, shutdown: Callable[[], None], environ: Mapping[str, str] = os.environ) -> dict:
    """The keyword arguments of app.py's ``st.App``: this module's middleware and lifespan for
    ``script`` (whose pages live in ``pages/`` beside it), or, when ``serve_plain``, a lifespan that
    only runs ``shutdown`` as the server stops (it runs either way)."""
    if serve_plain(environ):
        return {"lifespan": lifespan([], shutdown, warm=False, no_delay=False, navigation_only=False, own_routes=False)}
    copies = GzipCopies()

    def prewarm() -> None:
        """Each page's head tags (finding the chunks they preload reads Streamlit's chunk files), and
        the gzip copies of what a first load of any page asks for: Streamlit's boot, the pages'
        element chunks, plotly.js."""
        for page in PAGE_ELEMENTS:
            page_head(page)
        plotly = plotly_file()
        copies.prewarm([*static_files(_ALL_ELEMENTS), *([plotly] if plotly else [])])

    base_url = st.get_option("server.baseUrlPath") or ""
    return {
        "lifespan": lifespan(sorted(Path(script).with_name("pages").glob("*.py")), shutdown, prewarm=prewarm),
        "middleware": [
            Middleware(StaticGzip, base_url=base_url, hashed=[PLOTLY_ASSETS], copies=copies),
            Middleware(PreloadHints, base_url=base_url, head=page_head),
        ],
        "routes": [
            csv_route(lambda: open_store(settings()), base_url=base_url),
            changes_route(lambda: open_store(settings()), lambda: settings().refresh, _run_alerts, base_url=base_url),
        ],
    }


def _run_alerts(run: str) -> tuple[str, ...]:
    """The alerts firing for ``run``, as its page shows them (none when alerts are off)."""
    try:
        return run_alerts(open_alerter(settings()), run)
    except MetricsError:
        return ()
