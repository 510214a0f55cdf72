"""The dashboard served as an ``st.App`` (app.py) with ``metrics_core.dashboard.server.serving`` in front
(first load): Streamlit's static files go out gzip-compressed and decode to Streamlit's
own bytes, a client that refuses gzip gets identity bytes, and the server still honours
.streamlit/config.toml, ``server.baseUrlPath`` and Ctrl-C as ``streamlit run`` did before."""

from __future__ import annotations

import asyncio
import base64
import gzip
import http.client
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest
from streamlit import file_util
from streamlit.runtime.pages_manager import PagesManager

from metrics_core.dashboard.downloads import CSV_PATH, own_routes
from metrics_core.dashboard.live import chart_component
from metrics_core.dashboard.live.chart_component import PLOTLY_COMPONENT, plotly_source
from metrics_core.dashboard.live.push import CHANGES_PATH, base_path
from metrics_core.dashboard.server import asgi_gzip, page_head, serving
from metrics_core.dashboard.server.asgi_gzip import GzipCopies, StaticGzip, accepts_gzip, route_path
from metrics_core.dashboard.server.page_head import BASE_URL_SCRIPT, PreloadHints, chunk_preloads, static_files
from metrics_core.dashboard.server.serving import lifespan, tcp_no_delay
from tests.live_server import Wire, dashboard, live_charts_drawn, wait_until
from tests.support import REPO, append_records, base_record, small_run

STATIC = Path(file_util.get_static_dir())
ONE_YEAR = "public, immutable, max-age=31536000"  # what Streamlit sends for its hashed bundles


def largest_static_js() -> str:
    """The URL path of Streamlit's largest JavaScript bundle (its plotly chart in 1.67: 4.7 MB)."""
    largest = max((STATIC / "static" / "js").glob("*.js"), key=lambda p: p.stat().st_size)
    return "/" + largest.relative_to(STATIC).as_posix()


def get(url: str, accept_encoding: str | None, accept: str = "*/*") -> tuple[dict[str, str], bytes]:
    """``url``'s headers (lower-case names) and body as sent: urllib never decodes."""
    headers = {"Accept": accept} | ({} if accept_encoding is None else {"Accept-Encoding": accept_encoding})
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return {k.lower(): v for k, v in answer.headers.items()}, answer.read()


def served_runs(root: Path) -> None:
    """``served_root`` (conftest) for this module: a short run, ``small``."""
    small_run(root / "small" / "metrics.jsonl")


@pytest.mark.parametrize(
    ("header", "expected"),
    [("gzip, deflate, br, zstd", True), ("br;q=1.0, GZIP;q=0.5", True), ("*", True), ("gzip;q=0", False),
     ("identity", False), ("", False), ("deflate, br", False), ("gzip;q=x", False), ("*;q=0, gzip", True),
     ("gzip;q=0, *", False)],
)  # fmt: skip
def test_accepts_gzip_reads_accept_encoding_with_its_q_values(header: str, expected: bool) -> None:
    """gzip listed and not refused with q=0, else * so listed: an explicit gzip entry wins over *."""
    assert accepts_gzip(header) is expected


# ~4 MB of text that compresses to ~75 %: gzip -9 takes ~0.1 s, long enough to walk away during it.
BUNDLE = base64.b64encode(random.Random(7).randbytes(3 << 20))
IMMUTABLE = [(b"content-type", b"application/javascript"), (b"cache-control", ONE_YEAR.encode()),
             (b"etag", b'"abc-Def"'), (b"accept-ranges", b"bytes")]  # fmt: skip


def static_app(headers: list[tuple[bytes, bytes]]) -> object:
    """An ASGI app answering every GET with ``BUNDLE`` and ``headers``, as Streamlit's static route does."""

    async def app(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": BUNDLE, "more_body": False})

    return app


async def fetch(middleware: StaticGzip, path: str) -> tuple[dict[bytes, bytes], bytes]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": [(b"accept-encoding", b"gzip")]}
    await middleware(scope, None, send)
    return dict(sent[0]["headers"]), b"".join(message.get("body", b"") for message in sent[1:])


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

    headers, body = asyncio.run(scenario())
    assert headers[b"content-encoding"] == b"gzip" and gzip.decompress(body) == BUNDLE
    assert headers[b"etag"] == b'W/"abc-Def"' and b"accept-ranges" not in headers
    assert headers[b"content-length"] == str(len(body)).encode()


def test_made_up_static_paths_are_neither_compressed_nor_kept() -> None:
    """Streamlit answers an unknown /static/ path with its index.html (no-cache): such answers pass
    through, so made-up paths cannot make the server compress and keep a copy each."""
    middleware = StaticGzip(static_app([(b"content-type", b"text/html"), (b"cache-control", b"no-cache")]))
    for number in range(20):
        headers, body = asyncio.run(fetch(middleware, f"/static/x{number}.js"))
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
        headers, body = asyncio.run(fetch(middleware, "/_stcore/bidi-components/c.x/plotly-0123.min.js"))
        assert headers[b"content-encoding"] == b"gzip" and gzip.decompress(body) == BUNDLE
        assert headers[b"cache-control"] == b"public, max-age=31536000, immutable"
    assert len(middleware.copies) == 1 and all(b"accept-encoding" not in dict(h) for h in asked)
    headers, body = asyncio.run(fetch(middleware, "/_stcore/bidi-components/c.x/chart.js"))
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
    headers, body = asyncio.run(fetch(middleware, "/metrics/static/js/index.js"))
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

    headers, body = asyncio.run(request_then_release())
    warm.join(10)
    assert gzip.decompress(body) == BUNDLE and calls == [len(BUNDLE)]

    def failing(body: bytes) -> bytes | None:
        raise MemoryError("no room for a copy")

    monkeypatch.setattr(asgi_gzip, "_gzip", failing)
    copies.prewarm([("/static/js/other.js", on_disk)])
    assert len(copies) == 1  # forgotten
    monkeypatch.setattr(asgi_gzip, "_gzip", real_gzip)
    headers, body = asyncio.run(fetch(StaticGzip(static_app(IMMUTABLE), copies=copies), "/static/js/other.js"))
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

    asyncio.run(start_and_stop())
    deadline = time.monotonic() + 20
    while not {"warm_probe_a", "warm_probe_z"} <= sys.modules.keys() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert {"warm_probe_a", "warm_probe_z"} <= sys.modules.keys()
    for name in ("warm_probe_a", "warm_probe_z"):
        monkeypatch.delitem(sys.modules, name)


def test_warm_first_script_run_does_streamlits_once_per_process_work() -> None:
    """In a fresh interpreter: the emoji catalog (imported by the first ``set_page_config`` with an
    emoji icon) is loaded, and the bare-execution warning is decided, so no page view does either."""
    code = """
import sys
from streamlit import delta_generator
assert "streamlit.emojis" not in sys.modules and not delta_generator._use_warning_has_been_displayed
from metrics_core.dashboard.server.serving import warm_first_script_run
warm_first_script_run()
assert "streamlit.emojis" in sys.modules and delta_generator._use_warning_has_been_displayed
print("warm")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "warm", result.stderr


def test_tcp_no_delay_reaches_the_connections_of_the_listener_on_that_port_only() -> None:
    """Sockets bound like Streamlit binds its own (``proto`` 0, which asyncio leaves with Nagle on):
    the listener on the given port gets TCP_NODELAY and the connections it accepts inherit it; a
    listener on another port and a connected socket are left alone."""

    def listener() -> socket.socket:
        sock = socket.socket(socket.AF_INET)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        return sock

    with listener() as ours, listener() as other:
        assert tcp_no_delay(ours.getsockname()[1]) == 1
        for server_side, expected in ((ours, 1), (other, 0)):
            with socket.create_connection(server_side.getsockname()) as client:
                accepted, _ = server_side.accept()
                with accepted:
                    assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == expected
                assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        assert ours.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)  # still listening, still open


def preloaded_chunks(html: str, *, later: bool = False) -> set[str]:
    """The /static/js/ files a page's <head> names (its script and every modulepreload), Streamlit's own
    and ours; ``later``: also those its script preloads once the page is drawn (the other pages')."""
    head = html.split("</head>")[0]
    now = set(re.findall(r'(?:href|src)="\./static/js/([^"]+)"', head))
    return now | set(re.findall(r'href=\\"\./static/js/([^"\\]+)\\"', head)) if later else now


def test_the_page_html_names_its_base_url_and_the_chunks_of_its_elements(server: str) -> None:
    """Every page path's HTML (gzipped or not, as asked, with a true Content-Length, no-cache and no
    ETag) names the server's base URL for Streamlit and preloads its own elements' chunks beyond
    Streamlit's: the run page the chunk that mounts the charts, the runs page the table's; chart
    pages also download and run plotly.js."""
    index = preloaded_chunks((STATIC / "index.html").read_text())
    for path, chunk in (("/", "DataFrame."), ("/run?run=small", "BidiComponent."), ("/sessions", "Metric.")):
        for encoding in ("gzip", None):
            headers, body = get(server + path, encoding, accept="text/html")
            assert headers.get("content-encoding") == encoding and int(headers["content-length"]) == len(body)
            assert headers["cache-control"] == "no-cache" and "etag" not in headers
            html = (gzip.decompress(body) if encoding else body).decode()
            head = html.split("</head>")[0]
            assert "BACKEND_BASE_URL" in head
            assert any(name.startswith(chunk) for name in preloaded_chunks(html) - index), (path, chunk)
            preload = '<link rel="preload" as="script" href="/_stcore/bidi-components/metrics-core.plotly/plotly-'
            assert "window.__metricsRunPlotly = " in head  # every page can run plotly.js from its URL
            assert (preload in head) is ("setTimeout(window.__metricsRunPlotly)" in head) is (path != "/"), path
            # once drawn, the runs page runs plotly.js and preloads the chart pages' chunks; chart pages
            # prepare nothing more (their first load stays as measured in test_browser_bytes)
            assert ("{ window.__metricsRunPlotly(); }" in head) is (path == "/"), path
            later = preloaded_chunks(html, later=True) - preloaded_chunks(html)
            assert any(name.startswith("BidiComponent.") for name in later) is (path == "/"), (path, later)
            assert bool(later) is (path == "/"), (path, later)


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
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        def tags(page: str) -> tuple[str, str]:
            return f"<meta name=first content={page!r}>", f"<meta name=last content={page!r}>"

        middleware = PreloadHints(index, head=tags, base_url=base_url)
        await middleware({"type": "http", "method": "GET", "path": path, "headers": [(b"accept", b"text/html")]},
                         None, send)  # fmt: skip
        return sent[1]["body"].decode().split("</head>")[0]

    cases = [("/", "", "", True), ("/run", "", "run", True), ("/m/run", "m", "run", True), ("/m/", "m", "", True),
             ("/m", "m", "", False), ("/a/b", "", "a", False)]  # fmt: skip
    for path, base_url, page, named in cases:
        head = asyncio.run(head_of(path, base_url))
        first, last = f"<meta name=first content={page!r}>", f"<meta name=last content={page!r}>"
        start = "<meta charset=utf-8><title>x</title>" + (BASE_URL_SCRIPT if named else "") + first
        assert head == f"<html><head>{start}<script>st()</script>{last}", path


@pytest.mark.parametrize("path", ["/", "/run?run=small", "/sessions?run=small", "/compare?run=small", "/run"])
def test_a_page_loads_every_chunk_it_uses_from_its_html_and_finds_its_server_at_once(
    server: str, page: object, path: str
) -> None:
    """In Chromium, after the page has drawn: every JavaScript chunk it asked for was named in its
    HTML (none discovered one import at a time as the elements arrived), each was fetched once,
    and the page asked for the server's health once, at the base URL (a deep link used to ask
    /run/_stcore/health first, get a 404 and wait 100 ms)."""
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(server + path)
    drawn = {"/": "[data-testid=stDataFrame]", "/run": "[data-testid=stSelectbox]"}.get(path, ".main-svg")
    wait_until(page, lambda: page.evaluate(f"!!document.querySelector({drawn!r})"), timeout=60)
    page.wait_for_timeout(1500)  # the rest of the page's elements, and any chunk they would fetch late
    chunks = [url.rsplit("/", 1)[1] for url in requested if "/static/js/" in url]
    _, html = get(server + path, None, accept="text/html")  # as served: the page adds preloads as it imports
    preloaded = preloaded_chunks(html.decode(), later=True)
    assert set(chunks) <= preloaded, set(chunks) - preloaded
    assert len(chunks) == len(set(chunks)) and len(chunks) > 60
    assert [url for url in requested if "/_stcore/health" in url] == [f"{server}/_stcore/health"]


def test_static_bundles_arrive_gzip_encoded_and_decode_to_streamlits_bytes(server: str, page: object) -> None:
    """A first load of /run in Chromium: every static JS/CSS file over 1 KB came gzip-encoded, and
    what the browser decoded is byte for byte the file in Streamlit's static directory."""
    responses = []
    page.on("response", lambda response: responses.append(response))
    page.goto(f"{server}/run?run=small")
    wait_until(page, lambda: live_charts_drawn(page), timeout=60)
    bundles = [r for r in responses if "/static/" in r.url and r.url.endswith((".js", ".css"))]
    checked = 0
    for response in bundles:
        local = STATIC / response.url.split("/", 3)[3]
        if local.stat().st_size < 1000:
            continue
        assert response.headers.get("content-encoding") == "gzip", response.url
        assert response.body() == local.read_bytes(), response.url
        checked += 1
    assert checked >= 20  # index.js, protobuf.js, react-dom, the lazily loaded widget chunks...


def test_a_client_that_refuses_gzip_gets_identity_bytes_with_streamlits_headers(server: str) -> None:
    """The same bundle without gzip in Accept-Encoding (absent, identity, gzip;q=0) is the file as is;
    with gzip it is that file compressed; both carry Streamlit's cache header, a true Content-Length
    and Vary: Accept-Encoding."""
    path = largest_static_js()
    original = (STATIC / path.lstrip("/")).read_bytes()
    for refusal in (None, "identity", "gzip;q=0"):
        headers, body = get(server + path, refusal)
        assert "content-encoding" not in headers and body == original, refusal
        assert headers["cache-control"] == ONE_YEAR and headers["vary"] == "Accept-Encoding"
        assert int(headers["content-length"]) == len(original)
    headers, body = get(server + path, "gzip, deflate, br, zstd")
    assert headers["content-encoding"] == "gzip" and gzip.decompress(body) == original
    assert headers["cache-control"] == ONE_YEAR and headers["vary"] == "Accept-Encoding"
    assert int(headers["content-length"]) == len(body) < len(original) / 2
    fonts = sorted((STATIC / "static" / "media").glob("*.woff2"))
    headers, body = get(f"{server}/static/media/{fonts[0].name}", "gzip")  # already compressed: untouched
    assert "content-encoding" not in headers and body == fonts[0].read_bytes()
    headers, _ = get(f"{server}/_stcore/health", "gzip")  # not a static file: Streamlit's answer as is
    assert "vary" not in headers


def test_the_st_app_server_honours_the_projects_config(server: str, page: object) -> None:
    """.streamlit/config.toml still applies under st.App: the port listens on 127.0.0.1 only, the
    session's config says toolbarMode viewer and no usage stats, and the websocket is compressed."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from streamlit.proto.NewSession_pb2 import Config

    port = int(server.rsplit(":", 1)[1])
    listening = [
        fields[1]
        for table in ("/proc/net/tcp", "/proc/net/tcp6")
        for fields in (line.split() for line in Path(table).read_text().splitlines()[1:])
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port  # 0A: LISTEN
    ]
    assert listening == [f"0100007F:{port:04X}"]  # 127.0.0.1 only: not 0.0.0.0, not ::
    sessions = []

    def frames(socket: object) -> None:
        def keep(payload: bytes | str) -> None:
            if isinstance(payload, bytes):
                message = ForwardMsg.FromString(payload)
                if message.HasField("new_session"):
                    sessions.append(message.new_session)

        socket.on("framereceived", keep)

    page.on("websocket", frames)
    handshakes = []
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.on("Network.webSocketHandshakeResponseReceived", lambda event: handshakes.append(event["response"]))
    page.goto(f"{server}/run?run=small")
    wait_until(page, lambda: sessions and handshakes, timeout=60)
    extensions = {k.lower(): v for k, v in handshakes[0]["headers"].items()}.get("sec-websocket-extensions", "")
    assert extensions.startswith("permessage-deflate")
    assert sessions[0].config.toolbar_mode == Config.ToolbarMode.VIEWER
    assert not sessions[0].config.gather_usage_stats


def test_ctrl_c_stops_the_server_without_a_traceback(served_root: Path) -> None:
    """SIGINT (Ctrl-C in the terminal of README command 1) ends `streamlit run app.py` within seconds and
    with no traceback in its output.  Its status is 1 ("Aborted!") under st.App: after its graceful
    shutdown uvicorn raises the signal again, and click reports the KeyboardInterrupt (0 and
    "Stopping..." before st.App); either is accepted."""
    with dashboard(served_root) as (url, process, log):
        get(url + largest_static_js(), "gzip")  # the middleware has compressed something
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) in (0, 1)
        log.seek(0)
        output = log.read().decode(errors="replace")
    assert "Traceback" not in output, output


def test_a_deep_link_as_the_first_request_runs_through_the_navigation(served_root: Path, browser: object) -> None:
    """The first page view after a start is /run?run=small: it is the app's Run page (page title and
    top navigation from app.py), not pages/run.py alone in Streamlit's legacy folder-of-pages
    mode, which Streamlit enters for an app with a folder named ``pages/`` beside it."""
    assert (REPO / "pages").is_dir()
    with dashboard(served_root) as (url, _, _):
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        try:
            page = context.new_page()
            page.goto(f"{url}/run?run=small")
            wait_until(page, lambda: live_charts_drawn(page), timeout=60)
            title = page.title()
            nav = page.evaluate("Array.from(document.querySelectorAll('header a')).map(a => a.textContent)")
        finally:
            context.close()
    assert title == "Training metrics"
    names = ("Runs", "Run", "Sessions", "Compare")  # each after its icon's ligature text
    assert len(nav) == len(names) and all(text.endswith(name) for text, name in zip(nav, names, strict=True)), nav


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


def test_sigterm_still_saves_the_caches_of_what_was_parsed(tmp_path: Path, browser: object) -> None:
    """A service manager's SIGTERM: the run store still closes, so the columnar cache holds what the
    server parsed after its last save (uvicorn re-raises the signal after its shutdown, which skips
    atexit handlers; app.py's lifespan releases the store instead).  Without it the next start
    re-parses every record appended since the last save."""
    root, cache = tmp_path / "runs", tmp_path / "cache"
    run = root / "big" / "metrics.jsonl"
    append_records(run, *(base_record(step, train_loss=5.0 / step) for step in range(1, 60_001)))  # > min_records
    with dashboard(root, args=("--cache-dir", str(cache), "--refresh", "0.5")) as (url, process, log):
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        try:
            page = context.new_page()
            page.goto(f"{url}/run?run=big")
            wait_until(page, lambda: live_charts_drawn(page), timeout=90)
            (saved,) = cache.glob("*.mcc")  # the cold parse of 60,000 records was saved at once
            after_load = saved.stat().st_mtime_ns
            append_records(run, *(base_record(step, train_loss=0.01) for step in range(60_001, 60_011)))
            graph = "document.querySelector('.js-plotly-plot')"  # the live chart, once drawn
            last_x = f"{graph} ? Math.max(...{graph}.data.map(t => Math.max(...(t.x || [])))) : 0"
            wait_until(page, lambda: page.evaluate(last_x) >= 60_010, timeout=30)  # the server read them
        finally:
            context.close()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        log.seek(0)
        output = log.read().decode(errors="replace")
    assert "Traceback" not in output, output
    assert saved.stat().st_mtime_ns > after_load, "SIGTERM left the cache behind the records the server parsed"


def test_base_url_path_still_serves_the_page_and_compressed_bundles(served_root: Path, browser: object) -> None:
    """server.baseUrlPath=metrics: the run page draws its chart under /metrics/, finds its server
    there at once (the base URL named in the page is /metrics/, not the page's own path), and the
    bundles under /metrics/static/ come gzip-encoded."""
    with dashboard(served_root, "--server.baseUrlPath", "metrics") as (url, _, _):
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        try:
            page = context.new_page()
            responses = []
            page.on("response", lambda response: responses.append(response))
            page.goto(f"{url}/run?run=small")
            wait_until(page, lambda: live_charts_drawn(page), timeout=60)
        finally:
            context.close()
        headers, body = get(url + largest_static_js(), "gzip")
    assert [r.url for r in responses if "/_stcore/health" in r.url] == [f"{url}/_stcore/health"]
    bundles = [r for r in responses if "/metrics/static/js/" in r.url]
    assert bundles and all(r.status == 200 for r in bundles)
    large = [r for r in bundles if (STATIC / r.url.split("/metrics/", 1)[1]).stat().st_size > 1000]
    assert large and all(r.headers.get("content-encoding") == "gzip" for r in large)
    assert headers["content-encoding"] == "gzip"
    assert gzip.decompress(body) == (STATIC / largest_static_js().lstrip("/")).read_bytes()


# In the page, before its scripts: who set window.Plotly (the running script's URL) and whether the
# plotly.js loader element was in the page by then.
PLOTLY_SETTER = """
let plotly;
Object.defineProperty(window, "Plotly", {
  configurable: true, get: () => plotly,
  set: (value) => {
    plotly = value;
    window.__plotlySetBy = { src: document.currentScript && document.currentScript.src,
                             loader: !!document.querySelector(".st-key-metrics_plotly_loader") };
  },
});
"""


@pytest.mark.parametrize("plain", [False, True], ids=["served", "plain"])
def test_plotly_js_runs_from_its_url_before_the_charts_arrive_or_from_a_cached_blob_when_plain(
    served_root: Path, browser: object, monkeypatch: pytest.MonkeyPatch, plain: bool
) -> None:
    """Served by app.py, plotly.js runs from a <script> of its content-hashed URL (so the browser
    keeps its compiled code): on a run page reached from the runs page without a reload, and on one
    loaded directly, where it has run before the loader element that used to start it is in the
    page; the second time it comes from the HTTP cache.  Served plainly by Streamlit (no cache
    lifetime on the file), the loader fetches it from the cache and runs it from a blob URL.
    Either way the charts draw."""
    if plain:
        monkeypatch.setenv("METRICS_SERVE_PLAIN", "1")
    with dashboard(served_root) as (url, _, _):
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        try:
            context.add_init_script(PLOTLY_SETTER)
            page = context.new_page()
            wire = Wire(context, page)
            page.goto(url + "/")
            wait_until(page, lambda: page.evaluate("!!document.querySelector('[data-testid=stDataFrame]')"), timeout=60)
            # What a click on a run's link does in this tab (widgets.SAME_TAB_JS): no reload.
            page.evaluate("""() => { history.pushState(null, "", "run?run=small");
                                     window.dispatchEvent(new PopStateEvent("popstate")); }""")  # fmt: skip
            wait_until(page, lambda: live_charts_drawn(page), timeout=60)
            setters = [page.evaluate("window.__plotlySetBy")]
            plotly_bytes = [sum(n for u, n in wire.http.items() if "/metrics-core.plotly/plotly-" in u)]
            wire.reset()
            page.goto(f"{url}/run?run=small")
            wait_until(page, lambda: live_charts_drawn(page), timeout=60)
            setters.append(page.evaluate("window.__plotlySetBy"))
            plotly_bytes.append(sum(n for u, n in wire.http.items() if "/metrics-core.plotly/plotly-" in u))
        finally:
            context.close()
    asset = f"{url}/_stcore/bidi-components/metrics-core.plotly/plotly-"
    if plain:
        assert all(setter["src"].startswith("blob:") for setter in setters), setters
    else:
        assert all(setter["src"].startswith(asset) for setter in setters), setters
        assert not setters[1]["loader"], setters  # a direct load runs it before the loader arrives
    assert plotly_bytes[0] > 300_000 and plotly_bytes[1] == 0, plotly_bytes  # 396 KB gzipped, then cached


def test_the_runs_page_once_drawn_prepares_the_chart_pages(served_root: Path, browser: object) -> None:
    """The runs page, once its first script run is done and the browser idle, runs plotly.js and
    preloads the chart pages' element chunks: a click to a run then fetches no script at all, and
    the run's chart draws with the plotly.js that was already running."""
    with dashboard(served_root) as (url, _, _):
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        try:
            page = context.new_page()
            requested: list[str] = []
            page.on("request", lambda request: requested.append(request.url))
            page.goto(url + "/")
            wait_until(page, lambda: page.evaluate("!!document.querySelector('[data-testid=stDataFrame]')"), timeout=60)
            wait_until(page, lambda: page.evaluate("!!window.Plotly"), timeout=30)
            wait_until(page, lambda: any("/static/js/BidiComponent." in u for u in requested), timeout=30)
            page.wait_for_timeout(1000)  # the rest of the preloads
            before = len(requested)
            page.evaluate("""() => { window.__plotlyBefore = window.Plotly;
                                     history.pushState(null, "", "run?run=small");
                                     window.dispatchEvent(new PopStateEvent("popstate")); }""")  # fmt: skip
            wait_until(page, lambda: live_charts_drawn(page), timeout=60)
            page.wait_for_timeout(1500)  # the rest of the run page's elements
            same_plotly = page.evaluate("window.Plotly === window.__plotlyBefore")
        finally:
            context.close()
    after_click = [u for u in requested[before:] if "/static/js/" in u or "/metrics-core.plotly/" in u]
    assert after_click == [] and same_plotly


def test_serve_plain_leaves_streamlits_answers_as_they_are(served_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """METRICS_SERVE_PLAIN=1 (a proxy in front compresses): bundles go out as Streamlit sends them,
    and the HTML has no added hint."""
    monkeypatch.setenv("METRICS_SERVE_PLAIN", "1")
    with dashboard(served_root) as (url, _, _):
        headers, body = get(url + largest_static_js(), "gzip")
        _, html = get(url + "/", None, accept="text/html")
    assert "content-encoding" not in headers and "vary" not in headers
    assert body == (STATIC / largest_static_js().lstrip("/")).read_bytes()
    assert b"BidiComponent" not in html


def test_serve_plain_is_one_switch_that_turns_every_part_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """With METRICS_SERVE_PLAIN=1 app.py's ``st.App`` gets no middleware and a lifespan that only
    runs the app's shutdown: no warm-up touching Streamlit's privates, no socket option; served,
    it gets the gzip and head-tag middleware and the lifespan does its start-up work."""
    touched: list[str] = []
    monkeypatch.setattr(serving, "warm_first_script_run", lambda: touched.append("warm"))
    monkeypatch.setattr(serving, "tcp_no_delay", lambda port: touched.append("no_delay") or 0)
    closed: list[bool] = []

    async def start_and_stop_lifespan(options: dict) -> None:
        async with options["lifespan"](object()):
            pass

    def start_and_stop(options: dict) -> None:  # in a thread: a browser test's event loop may be running here
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, start_and_stop_lifespan(options)).result()

    plain = serving.app_options(
        REPO / "app.py", shutdown=lambda: closed.append(True), environ={"METRICS_SERVE_PLAIN": "1"}
    )
    assert list(plain) == ["lifespan"]
    monkeypatch.setattr(PagesManager, "uses_pages_directory", True)
    start_and_stop(plain)
    time.sleep(0.2)  # a warm-up thread, had one started
    assert closed == [True] and touched == [] and PagesManager.uses_pages_directory is True
    served = serving.app_options(REPO / "app.py", shutdown=lambda: closed.append(True), environ={})
    assert [item.cls for item in served["middleware"]] == [StaticGzip, PreloadHints]
    start_and_stop({"lifespan": serving.lifespan([], lambda: None)})
    assert PagesManager.uses_pages_directory is False
    deadline = time.monotonic() + 10
    while "warm" not in touched and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(touched) == ["no_delay", "warm"]


# -- the Streamlit internals serving.py leans on: each test fails when an upgrade changes one ----------


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
    """Streamlit's own manifest scan (here a checkout; tests/test_install.py a wheel) gives
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


@pytest.mark.parametrize("plain", [False, True], ids=["served", "plain"])
def test_streamlits_connections_keep_nagle_on_unless_served(
    runs_root: Path, monkeypatch: pytest.MonkeyPatch, plain: bool
) -> None:
    """Streamlit binds its listening socket with ``proto`` 0, so its connections keep Nagle's
    algorithm on and every kept-alive answer waits for a delayed ACK; ``tcp_no_delay`` turns it
    off.  If plain Streamlit stops stalling, it sets TCP_NODELAY itself: drop ``tcp_no_delay``."""
    if plain:
        monkeypatch.setenv("METRICS_SERVE_PLAIN", "1")
    with dashboard(runs_root) as (url, _, _):
        host, port = url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        times = []
        try:
            for _ in range(8):
                start = time.perf_counter()
                connection.request("GET", "/_stcore/health")
                answer = connection.getresponse()
                answer.read()
                times.append(time.perf_counter() - start)
        finally:
            connection.close()
    stalled = min(times[1:]) >= 0.030
    assert stalled is plain, times
