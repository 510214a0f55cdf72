"""The dashboard served as an ``st.App`` (app.py) with ``metrics_core.dashboard.server.serving`` in front
(first load): Streamlit's static files go out gzip-compressed and decode to Streamlit's
own bytes, a client that refuses gzip gets identity bytes, and the server still honours
.streamlit/config.toml, ``server.baseUrlPath`` and Ctrl-C as ``streamlit run`` did before."""

from __future__ import annotations

import gzip
import re
import signal
import urllib.request
from pathlib import Path

import pytest

from metrics_core.testing.live_server import ACCESS_TOKEN, Wire, dashboard, live_charts_drawn, wait_until
from tests.support import DESKTOP, REPO, append_records, base_record, small_run
from tests.support.dashboard import ONE_YEAR, STATIC


def largest_static_js() -> str:
    """The URL path of Streamlit's largest JavaScript bundle (its plotly chart in 1.67: 4.7 MB)."""
    largest = max((STATIC / "static" / "js").glob("*.js"), key=lambda p: p.stat().st_size)
    return "/" + largest.relative_to(STATIC).as_posix()


def get(url: str, accept_encoding: str | None, accept: str = "*/*") -> tuple[dict[str, str], bytes]:
    """``url``'s headers (lower-case names) and body as sent: urllib never decodes."""
    headers = {"Accept": accept, "Authorization": f"Bearer {ACCESS_TOKEN}"}
    headers |= {} if accept_encoding is None else {"Accept-Encoding": accept_encoding}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return {k.lower(): v for k, v in answer.headers.items()}, answer.read()


def served_runs(root: Path) -> None:
    """This module's runs in the shared dashboard's ``served_root`` (browser/conftest.py): a short run, ``small``."""
    small_run(root / "small" / "metrics.jsonl")


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


# Each page and what shows it drawn.  The sweep page of one run (runs sharing every key) says so;
# /sweep alone would chart every run of the shared root, whatever the other modules wrote there.
DRAWN = {
    "/": "[data-testid=stDataFrame]",
    "/run?run=small": ".main-svg",
    "/sessions?run=small": ".main-svg",
    "/compare?run=small": ".main-svg",
    "/run": "[data-testid=stSelectbox]",
    "/sweep?run=small": "[data-testid=stAlert]",
}


def test_a_page_loads_every_chunk_it_uses_from_its_html_and_finds_its_server_at_once(
    server: str, browser: object
) -> None:
    """In Chromium, each page on a first visit (side by side, a context each), after it has drawn:
    every JavaScript chunk it asked for was named in its HTML (none discovered one import at a time
    as the elements arrived), each was fetched once, and the page asked for the server's health
    once, at the base URL (a deep link used to ask /run/_stcore/health first, get a 404 and wait 100 ms)."""
    contexts = {path: browser.new_context(viewport=DESKTOP) for path in DRAWN}
    try:
        pages, requested = {}, {path: [] for path in DRAWN}
        for path, context in contexts.items():
            pages[path] = context.new_page()
            pages[path].on("request", lambda request, urls=requested[path]: urls.append(request.url))
            pages[path].goto(server + path, wait_until="commit")
        for path, page in pages.items():
            drawn = f"!!document.querySelector({DRAWN[path]!r})"
            wait_until(page, lambda page=page, drawn=drawn: page.evaluate(drawn), timeout=60)
        pages["/"].wait_for_timeout(1500)  # the rest of the pages' elements, and any chunk they would fetch late
        for path, urls in requested.items():
            chunks = [url.rsplit("/", 1)[1] for url in urls if "/static/js/" in url]
            _, html = get(server + path, None, accept="text/html")  # as served: the page adds preloads as it imports
            preloaded = preloaded_chunks(html.decode(), later=True)
            assert set(chunks) <= preloaded, (path, set(chunks) - preloaded)
            assert len(chunks) == len(set(chunks)) and len(chunks) > 60, (path, chunks)
            assert [url for url in urls if "/_stcore/health" in url] == [f"{server}/_stcore/health"], path
    finally:
        for context in contexts.values():
            context.close()


@pytest.mark.first_visit
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
        context = browser.new_context(viewport=DESKTOP)
        try:
            page = context.new_page()
            page.goto(f"{url}/run?run=small")
            wait_until(page, lambda: live_charts_drawn(page), timeout=60)
            title = page.title()
            nav = page.evaluate("Array.from(document.querySelectorAll('header a')).map(a => a.textContent)")
        finally:
            context.close()
    assert title == "Training metrics"
    names = ("Runs", "Run", "Sessions", "Compare", "Sweep")  # each after its icon's ligature text
    assert len(nav) == len(names) and all(text.endswith(name) for text, name in zip(nav, names, strict=True)), nav


def test_sigterm_still_saves_the_caches_of_what_was_parsed(tmp_path: Path, browser: object) -> None:
    """A service manager's SIGTERM: the run store still closes, so the columnar cache holds what the
    server parsed after its last save (uvicorn re-raises the signal after its shutdown, which skips
    atexit handlers; app.py's lifespan releases the store instead).  Without it the next start
    re-parses every record appended since the last save."""
    root, cache = tmp_path / "runs", tmp_path / "cache"
    run = root / "big" / "metrics.jsonl"
    append_records(run, *(base_record(step, train_loss=5.0 / step) for step in range(1, 60_001)))  # > min_records
    with dashboard(root, args=("--cache-dir", str(cache), "--refresh", "0.5")) as (url, process, log):
        context = browser.new_context(viewport=DESKTOP)
        try:
            page = context.new_page()
            page.goto(f"{url}/run?run=big")
            wait_until(page, lambda: live_charts_drawn(page), timeout=90)
            # the cold parse of 60,000 records, saved by the store's saver thread soon after: the cache
            # file, not the temporary one it is written to before the rename (".tmp-….mcc")
            done = lambda: [path for path in cache.glob("*.mcc") if not path.name.startswith(".")]  # noqa: E731
            (saved,) = wait_until(page, done, timeout=60)
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
        context = browser.new_context(viewport=DESKTOP)
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
        context = browser.new_context(viewport=DESKTOP)
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
        context = browser.new_context(viewport=DESKTOP)
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


# -- the Streamlit internals serving.py leans on: each test fails when an upgrade changes one ----------
