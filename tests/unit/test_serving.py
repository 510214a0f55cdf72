"""The serving layer without a server: gzip of Streamlit's static files, preload hints, base URL
paths, the lifespan's imports, and the Streamlit internals it leans on."""

from __future__ import annotations

import asyncio
import gzip
import re
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest

from metrics_core.dashboard.downloads import CSV_PATH, own_routes
from metrics_core.dashboard.live import chart_component
from metrics_core.dashboard.live.chart_component import PLOTLY_COMPONENT, plotly_source
from metrics_core.dashboard.live.push import CHANGES_PATH, base_path
from metrics_core.dashboard.server import asgi_gzip, page_head, serving
from metrics_core.dashboard.server.asgi_gzip import GzipCopies, StaticGzip, accepts_gzip, route_path
from metrics_core.dashboard.server.page_head import BASE_URL_SCRIPT, PreloadHints, chunk_preloads, static_files
from metrics_core.dashboard.server.serving import lifespan
from tests.support import run_async
from tests.support.dashboard import BUNDLE, IMMUTABLE, STATIC, Sent, fetch, static_app


@pytest.mark.parametrize(
    ("header", "expected"),
    [("gzip, deflate, br, zstd", True), ("br;q=1.0, GZIP;q=0.5", True), ("*", True), ("gzip;q=0", False),
     ("identity", False), ("", False), ("deflate, br", False), ("gzip;q=x", False), ("*;q=0, gzip", True),
     ("gzip;q=0, *", False)],
)  # fmt: skip
def test_accepts_gzip_reads_accept_encoding_with_its_q_values(header: str, expected: bool) -> None:
    """gzip listed and not refused with q=0, else * so listed: an explicit gzip entry wins over *."""
    assert accepts_gzip(header) is expected


def test_a_client_gone_while_its_bundle_is_compressed_does_not_break_that_bundle() -> None:
    """A tab closed during the first (shared) compression of a file cancels its own request only
    (Starlette cancels a response's task group when its client goes): the next request gets the
    gzip copy, with a weak ETag and no byte ranges (they describe the identity bytes)."""
    middleware = StaticGzip(static_app(IMMUTABLE))

    async def scenario() -> tuple[dict[bytes, bytes], bytes]:
        async with anyio.create_task_group() as requests:  # as Starlette runs a response: cancelled on disconnect
            requests.start_soon(fetch, middleware, "/static/js/index.js")
            while not middleware.copies:  # the shared compression has started
                await asyncio.sleep(0)
            requests.cancel_scope.cancel()
        return await fetch(middleware, "/static/js/index.js")

    headers, body = run_async(scenario())
    assert headers[b"content-encoding"] == b"gzip" and gzip.decompress(body) == BUNDLE
    assert headers[b"etag"] == b'W/"abc-Def"' and b"accept-ranges" not in headers
    assert headers[b"content-length"] == str(len(body)).encode()


def test_made_up_static_paths_are_neither_compressed_nor_kept() -> None:
    """Streamlit answers an unknown /static/ path with its index.html (no-cache): such answers pass
    through, so made-up paths cannot make the server compress and keep a copy each."""
    middleware = StaticGzip(static_app([(b"content-type", b"text/html"), (b"cache-control", b"no-cache")]))
    for number in range(20):
        headers, body = run_async(fetch(middleware, f"/static/x{number}.js"))
        assert b"content-encoding" not in headers and body == BUNDLE
    assert len(middleware.copies) == 0


def test_hashed_component_assets_are_compressed_once_and_marked_immutable() -> None:
    """A file under a ``hashed`` prefix (plotly.js, which Streamlit serves with "Cache-Control:
    public" alone and would gzip again per request) is asked from Streamlit without
    Accept-Encoding, compressed here once for every request, and marked immutable; another
    component path passes through as Streamlit answers it."""
    asked: list[list] = []
    inner = static_app([(b"content-type", b"text/javascript"), (b"cache-control", b"public")])

    async def app(scope: dict, receive: object, send: object) -> None:
        asked.append(scope["headers"])
        await inner(scope, receive, send)

    middleware = StaticGzip(app, hashed=["/_stcore/bidi-components/c.x/plotly-"])
    for _ in range(3):
        headers, body = run_async(fetch(middleware, "/_stcore/bidi-components/c.x/plotly-0123.min.js"))
        assert headers[b"content-encoding"] == b"gzip" and gzip.decompress(body) == BUNDLE
        assert headers[b"cache-control"] == b"public, max-age=31536000, immutable"
    assert len(middleware.copies) == 1 and all(b"accept-encoding" not in dict(h) for h in asked)
    headers, body = run_async(fetch(middleware, "/_stcore/bidi-components/c.x/chart.js"))
    assert headers[b"cache-control"] == b"public" and b"content-encoding" not in headers and body == BUNDLE


def test_prewarmed_copies_answer_the_first_request_under_any_base_url(tmp_path: Path) -> None:
    """A copy made ahead of any request (``GzipCopies.prewarm``, as the lifespan does) answers the
    first request for that route, under a base URL path too: what goes out is the prewarmed
    compression (the file on disk here differs from the app's answer, same size: names carry their
    content's hash, so a route and a size identify a copy)."""
    on_disk = tmp_path / "index.js"
    on_disk.write_bytes(BUNDLE.swapcase())
    copies = GzipCopies()
    copies.prewarm([("/static/js/index.js", on_disk), ("/static/js/gone.js", tmp_path / "gone.js")])
    assert len(copies) == 1  # a file that cannot be read is left to its first request
    middleware = StaticGzip(static_app(IMMUTABLE), base_url="metrics", copies=copies)
    headers, body = run_async(fetch(middleware, "/metrics/static/js/index.js"))
    assert headers[b"content-encoding"] == b"gzip" and gzip.decompress(body) == BUNDLE.swapcase()
    assert len(copies) == 1


def test_a_request_waits_for_the_copy_being_prewarmed_instead_of_compressing_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that arrives while the warm-up thread compresses its file gets that copy, compressed
    once; a compression that failed is forgotten, and the next request makes the copy."""
    calls: list[int] = []
    started, release = threading.Event(), threading.Event()
    real_gzip = asgi_gzip._gzip

    def slow_gzip(body: bytes) -> bytes | None:
        calls.append(len(body))
        started.set()
        release.wait(10)
        return real_gzip(body)

    monkeypatch.setattr(asgi_gzip, "_gzip", slow_gzip)
    on_disk = tmp_path / "index.js"
    on_disk.write_bytes(BUNDLE)
    copies = GzipCopies()
    warm = threading.Thread(target=copies.prewarm, args=([("/static/js/index.js", on_disk)],))
    warm.start()
    started.wait(10)

    async def request_then_release() -> tuple[dict[bytes, bytes], bytes]:
        waiting = asyncio.ensure_future(fetch(StaticGzip(static_app(IMMUTABLE), copies=copies), "/static/js/index.js"))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # it waits for the copy being made
        release.set()
        return await waiting

    headers, body = run_async(request_then_release())
    warm.join(10)
    assert gzip.decompress(body) == BUNDLE and calls == [len(BUNDLE)]

    def failing(body: bytes) -> bytes | None:
        raise MemoryError("no room for a copy")

    monkeypatch.setattr(asgi_gzip, "_gzip", failing)
    copies.prewarm([("/static/js/other.js", on_disk)])
    assert len(copies) == 1  # forgotten
    monkeypatch.setattr(asgi_gzip, "_gzip", real_gzip)
    headers, body = run_async(fetch(StaticGzip(static_app(IMMUTABLE), copies=copies), "/static/js/other.js"))
    assert headers[b"content-encoding"] == b"gzip" and gzip.decompress(body) == BUNDLE


def test_static_files_are_streamlits_boot_then_the_chunks_of_the_elements() -> None:
    """What the lifespan compresses ahead of requests: every script and style index.html names, then
    the chunks ``chunk_preloads`` names for the elements, each an existing file at its route."""
    files = static_files(("BidiComponent",))
    routes = [route for route, _ in files]
    index = [
        f"/static/{kind}/{name}"
        for kind, name in re.findall(r'\./static/(js|css)/([^"]+)"', (STATIC / "index.html").read_text())
    ]
    chunks = re.findall(r'href="\./static/js/([^"]+)"', chunk_preloads(("BidiComponent",)))
    assert routes == [*index, *(f"/static/js/{name}" for name in chunks)] and chunks
    assert all(path.is_file() and path == STATIC / route.lstrip("/") for route, path in files)


def test_route_path_drops_the_mount_and_the_base_url_at_segment_boundaries() -> None:
    """The path Streamlit's router sees, under a proxy's root_path and server.baseUrlPath alike."""
    assert route_path({"path": "/static/js/a.js"}, "") == "/static/js/a.js"
    assert route_path({"path": "/metrics/static/js/a.js"}, "/metrics/") == "/static/js/a.js"
    assert route_path({"path": "/p/metrics/static/a.js", "root_path": "/p"}, "metrics") == "/static/a.js"
    assert route_path({"path": "/metricsx/static/a.js"}, "metrics") == "/metricsx/static/a.js"
    assert route_path({"path": "/metrics"}, "metrics") == "/"


def test_base_path_is_the_base_url_as_a_path_prefix() -> None:
    """What the app's own routes and the plotly.js URL start with, however the option is written."""
    written = ("", "/", "metrics", "/metrics/", "a//b/")
    assert [base_path(value) for value in written] == ["", "", "/metrics", "/metrics", "/a/b"]


def test_lifespan_imports_what_the_scripts_import_without_running_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lifespan imports every top-level import of the scripts in a thread; a module that fails
    to import does not stop the others; the scripts themselves never run."""
    (tmp_path / "warm_probe_a.py").write_text("VALUE = 1\n")
    (tmp_path / "warm_probe_broken.py").write_text("raise ImportError('broken on purpose')\n")
    (tmp_path / "warm_probe_z.py").write_text("VALUE = 2\n")
    page = tmp_path / "page.py"
    page.write_text("import warm_probe_broken\nfrom warm_probe_a import VALUE\nimport warm_probe_z\n"
                    "raise SystemExit('a page must not run')\n")  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))

    async def start_and_stop() -> None:
        async with lifespan([page], lambda: None)(object()):
            pass

    run_async(start_and_stop())
    deadline = time.monotonic() + 20
    while not {"warm_probe_a", "warm_probe_z"} <= sys.modules.keys() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert {"warm_probe_a", "warm_probe_z"} <= sys.modules.keys()
    for name in ("warm_probe_a", "warm_probe_z"):
        monkeypatch.delitem(sys.modules, name)


def test_the_base_url_is_named_only_where_the_page_directory_is_the_base() -> None:
    """``/`` and ``/<page>`` (under a base URL path too) get BASE_URL_SCRIPT and their page's tags;
    a nested path such as ``/a/b``, whose directory is not the base URL, gets its page's tags only
    (Streamlit redirects ``/run/`` to ``/run`` itself).  The base URL and a page's first tags come
    before Streamlit's first script, after its meta tags; its last tags at the end of the head."""
    html = b"<html><head><meta charset=utf-8><title>x</title><script>st()</script></head><body></body></html>"

    async def index(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": html, "more_body": False})

    async def head_of(path: str, base_url: str = "") -> str:
        sent = Sent()

        def tags(page: str) -> tuple[str, str]:
            return f"<meta name=first content={page!r}>", f"<meta name=last content={page!r}>"

        middleware = PreloadHints(index, head=tags, base_url=base_url)
        await middleware({"type": "http", "method": "GET", "path": path, "headers": [(b"accept", b"text/html")]},
                         None, sent)  # fmt: skip
        return sent[1]["body"].decode().split("</head>")[0]

    cases = [("/", "", "", True), ("/run", "", "run", True), ("/m/run", "m", "run", True), ("/m/", "m", "", True),
             ("/m", "m", "", False), ("/a/b", "", "a", False)]  # fmt: skip
    for path, base_url, page, named in cases:
        head = run_async(head_of(path, base_url))
        first, last = f"<meta name=first content={page!r}>", f"<meta name=last content={page!r}>"
        start = "<meta charset=utf-8><title>x</title>" + (BASE_URL_SCRIPT if named else "") + first
        assert head == f"<html><head>{start}<script>st()</script>{last}", path


def test_streamlit_still_starts_an_app_with_a_pages_folder_in_its_legacy_mode() -> None:
    """The internal the lifespan sets: ``PagesManager.uses_pages_directory``, decided from a
    ``pages/`` folder beside the main script, makes a script run take the legacy path until
    ``st.navigation`` clears it.  If Streamlit drops the mode, drop ``navigation_only``."""
    import inspect

    from streamlit.commands import navigation
    from streamlit.runtime import pages_manager
    from streamlit.runtime.scriptrunner import script_runner

    assert hasattr(pages_manager.PagesManager, "uses_pages_directory")
    assert '/ "pages"' in inspect.getsource(pages_manager.PagesManager)
    assert "if PagesManager.uses_pages_directory:" in inspect.getsource(script_runner)
    assert "PagesManager.uses_pages_directory = False" in inspect.getsource(navigation)


def test_streamlits_static_directory_holds_the_index_and_bundles_it_names() -> None:
    """``streamlit.file_util.get_static_dir`` (not public API) is the directory Streamlit serves under
    /static/, whose index.html names its boot scripts and styles as ``./static/js|css/...``: what
    ``static_files`` prewarms and ``chunk_preloads`` leaves out."""
    named = page_head._index_files()
    assert any(path.startswith("static/js/index.") for path in named), named
    assert all((STATIC / path).is_file() for path in named)


def test_every_element_the_pages_preload_is_a_chunk_this_streamlit_ships() -> None:
    """``PAGE_ELEMENTS`` names Streamlit's lazily loaded chunks ``<Element>.<hash>.js`` (a bundler
    naming, not an API): a name this Streamlit no longer ships would silently preload nothing."""
    folder = STATIC / "static" / "js"
    missing = [
        name for names in page_head.PAGE_ELEMENTS.values() for name in names if not list(folder.glob(f"{name}.*.js"))
    ]
    assert missing == [], f"Streamlit renamed or merged these chunks: update page_head.PAGE_ELEMENTS: {missing}"


def test_the_chunks_static_imports_read_as_the_bundler_writes_them() -> None:
    """``_STATIC_IMPORT`` finds the chunks a chunk imports (``from"./x.js"``): the chunks of the
    run page's elements, followed transitively, are more than the elements' own files."""
    own = [
        path.name for name in page_head.PAGE_ELEMENTS["run"] for path in (STATIC / "static" / "js").glob(f"{name}.*.js")
    ]
    assert len(page_head._chunks(page_head.PAGE_ELEMENTS["run"])) > len(own)


def test_streamlits_bundle_still_reads_the_base_url_and_marks_its_script_state() -> None:
    """Two undocumented hooks of Streamlit's bundle: it reads ``window.__streamlit.BACKEND_BASE_URL``
    (``BASE_URL_SCRIPT``), and marks its root ``data-test-script-state="notRunning"`` once a script
    run is over (``after_first_run``)."""
    bundles = (STATIC / "static" / "js").glob("*.js")
    text = "".join(path.read_text(encoding="utf-8", errors="replace") for path in bundles)
    assert "BACKEND_BASE_URL" in text
    assert "data-test-script-state" in text and "`notRunning`" in text


def test_streamlit_serves_the_chart_assets_directory() -> None:
    """Streamlit's own manifest scan (here a checkout; tests/integration/test_install.py a wheel) gives
    metrics-core.plotly the directory of the vendored plotly.js."""
    from streamlit.components.v2.component_manager import BidiComponentManager

    manager = BidiComponentManager()
    manager.discover_and_register_components(start_file_watching=False)
    root = manager.get_component_path(PLOTLY_COMPONENT)
    assert root is not None and Path(root).resolve() == plotly_source().parent.resolve()


def test_the_component_manager_still_answers_where_a_components_assets_are() -> None:
    """``page_head.plotly_url`` asks Streamlit's bidi component manager (a private module) where it
    serves the ``asset_dir`` the package's manifest (metrics_core/pyproject.toml) declares for
    ``metrics-core.plotly``; the browser tests check that the page then runs plotly.js from that URL."""
    import tomllib
    from streamlit.components.v2.get_bidi_component_manager import get_bidi_component_manager

    assert callable(get_bidi_component_manager().get_component_path)
    project = tomllib.loads((Path(chart_component.__file__).parents[2] / "pyproject.toml").read_text())
    [declared] = project["tool"]["streamlit"]["component"]["components"]
    assert f"{project['project']['name']}.{declared['name']}" == PLOTLY_COMPONENT
    assert declared["asset_dir"] == "dashboard/vendor"


def test_plotly_js_is_served_at_its_content_hashed_asset_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """``plotly_url`` is the vendored file under ``ASSET_ROUTE`` (the route Streamlit serves a
    component's ``asset_dir`` at), under the base URL, its content hash in the query; the gzip
    middleware treats it as immutable (``PLOTLY_ASSETS``).  The browser tests fetch it."""
    from streamlit.components.v2.component_manager import BidiComponentManager

    manager = BidiComponentManager()  # as a running server's: it scanned the installed manifests
    manager.discover_and_register_components(start_file_watching=False)
    monkeypatch.setattr(page_head, "get_bidi_component_manager", lambda: manager)
    monkeypatch.setattr(page_head.st, "get_option", lambda name: "/metrics/" if name == "server.baseUrlPath" else None)
    page_head.plotly_url.cache_clear()
    try:
        url = page_head.plotly_url()
    finally:
        page_head.plotly_url.cache_clear()
    assert url is not None and url.startswith(f"/metrics{page_head.ASSET_ROUTE}plotly-basic.min.js?v=")
    assert url.removeprefix("/metrics").startswith(page_head.PLOTLY_ASSETS)
    assert page_head.plotly_file() == (f"{page_head.ASSET_ROUTE}plotly-basic.min.js", plotly_source())


def test_the_servers_own_routes_are_outside_the_paths_streamlit_serves() -> None:
    """The CSV and changes routes (``downloads.own_routes``) are under none of ``STREAMLIT_PATHS``."""
    paths = [route.path for route in own_routes("")]
    assert sorted(paths) == sorted([CHANGES_PATH, CSV_PATH])
    assert not [path for path in paths if path.startswith(serving.STREAMLIT_PATHS)]
