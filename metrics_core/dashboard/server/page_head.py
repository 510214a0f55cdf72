"""What the page's HTML gets from the server, and where Streamlit serves plotly.js: fenced here
with the rest of Streamlit's internals (``serving``'s docstring lists them and the switch).

* ``PreloadHints``: the page's HTML (Streamlit's index.html) gets ``BASE_URL_SCRIPT`` where the
  page's directory is the base URL (so a deep link does not probe its own path for the server
  first), ``modulepreload`` tags for the lazily loaded chunks of the elements that page draws
  (``PAGE_ELEMENTS``, ``chunk_preloads``) and plotly.js run early on chart pages
  (``plotly_head_tags``).  The edited HTML keeps Streamlit's ``no-cache`` and loses its ``ETag``
  and ``Last-Modified`` (they describe the file, not the answer).  Leans on: the undocumented
  ``window.__streamlit.BACKEND_BASE_URL``, the chunk file names ``<Element>.<hash>.js`` and their
  static imports, the ``data-test-script-state`` attribute of Streamlit's root, and Streamlit's
  static directory (``streamlit.file_util.get_static_dir``, its ``index.html``).
* ``plotly_url``: the URL of the vendored plotly.js, which Streamlit serves as a file of the
  components-v2 component ``chart_component.PLOTLY_COMPONENT`` (its ``asset_dir``, declared in
  ``metrics_core/pyproject.toml``) under ``ASSET_ROUTE``.  Leans on: the private
  ``get_bidi_component_manager`` (whether Streamlit found this copy's manifest) and that route.
  The pages hand the URL to ``chart_component.load_plotly``.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import html
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import streamlit as st
from streamlit.components.v2.get_bidi_component_manager import get_bidi_component_manager

from metrics_core.dashboard.live.chart_component import PLOTLY_COMPONENT, plotly_source
from metrics_core.dashboard.live.push import base_path
from metrics_core.dashboard.server.asgi_gzip import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    accepts_gzip,
    header,
    held,
    route_path,
    send_whole,
    without,
)

_LOG = logging.getLogger(__name__)
ASSET_ROUTE = f"/_stcore/bidi-components/{PLOTLY_COMPONENT}/"  # where Streamlit serves a component's asset_dir
# Route path prefix of plotly.js, whose URL carries its content hash (plotly_url).
PLOTLY_ASSETS = f"{ASSET_ROUTE}plotly-"


@functools.cache
def plotly_url() -> str | None:
    """The URL of the cacheable plotly.js, its content hash in the query, or None when Streamlit does not
    serve this package's ``vendor/`` (it found no manifest of this copy of the package)."""
    root = get_bidi_component_manager().get_component_path(PLOTLY_COMPONENT)
    if root is None or Path(root).resolve() != plotly_source().parent.resolve():
        _LOG.warning("%s has no asset_dir here: plotly.js is sent inline with every page load", PLOTLY_COMPONENT)
        return None
    prefix = base_path(str(st.get_option("server.baseUrlPath") or ""))
    version = hashlib.sha256(plotly_source().read_bytes()).hexdigest()[:16]
    return f"{prefix}{ASSET_ROUTE}{plotly_source().name}?v={version}"


def plotly_file() -> tuple[str, Path] | None:
    """plotly.js as (route path without the base URL, file), for the server to compress ahead of its
    first request; None where Streamlit does not serve it as a file."""
    return None if plotly_url() is None else (f"{ASSET_ROUTE}{plotly_source().name}", plotly_source())


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

PAGE_ELEMENTS = {
    "": (
        "DataFrame",
        "Multiselect",
        "TextInput",
        "TextArea",
        "Html",
        "Selectbox",
        "ButtonGroup",
        "Checkbox",
        "PageLink",
    ),
    "run": (
        "BidiComponent",
        "Html",
        "Selectbox",
        "Slider",
        "Checkbox",
        "Radio",
        "PageLink",
        "DownloadButton",
        "TextInput",
        "rehype-raw",
    ),
    "sessions": (
        "BidiComponent",
        "Html",
        "Metric",
        "DataFrame",
        "ButtonGroup",
        "Slider",
        "PageLink",
        "DownloadButton",
        "Selectbox",
        "remark-emoji",
    ),
    "compare": (
        "BidiComponent",
        "Html",
        "Multiselect",
        "TextInput",
        "Selectbox",
        "Radio",
        "ButtonGroup",
        "Checkbox",
        "Slider",
        "DataFrame",
    ),
    "sweep": ("BidiComponent", "Html", "Selectbox", "ButtonGroup", "PageLink", "DataFrame"),
}

CHART_PAGES = ("run", "sessions", "compare", "sweep")
ALL_ELEMENTS = tuple(dict.fromkeys(name for names in PAGE_ELEMENTS.values() for name in names))
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
