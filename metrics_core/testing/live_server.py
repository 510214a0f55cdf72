"""A real `streamlit run app.py` on a free loopback port, a real headless Chromium, and the probes
the tests read a page with.

Shared by the browser tests and the benchmarks (neither imports the other).  Chromium is Debian's
(/usr/bin/chromium, installed by .ci/run), driven by Playwright without its own browser download.

Every server started here asks for one token, ``ACCESS_TOKEN`` (made once per process), as a
user's server asks for its own (``dashboard.server.access``); the browser ``chromium`` yields
sends it with every request of every context it opens (``anonymous_context`` opens one without),
and ``http_get`` sends it too, so a test reads a page as its owner would.  Chromium leaves that
header off a download started from a link, which the owner's browser makes with its session
cookie: ``sign_in`` gives a context the cookie first."""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from metrics_core.testing.wheel_venv import outside_checkout

ACCESS_TOKEN = secrets.token_urlsafe(16)  # the token of every server this process starts
REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

# In the page: whether a plotly chart is drawn and shown (plotly adds its .main-svg when it plots).
CHART_SHOWN_JS = """[...document.querySelectorAll('.js-plotly-plot .main-svg')]
    .some(svg => getComputedStyle(svg).visibility === 'visible')"""


def live_charts_drawn(page: object, count: int = 1) -> bool:
    """Whether Streamlit's page in ``page`` has drawn at least ``count`` live charts."""
    drawn = "[...document.querySelectorAll('.js-plotly-plot')].filter(g => g.querySelector('.main-svg')).length"
    return page.evaluate(drawn) >= count


# In the page: the plotly graph whose title is `title` (charts are real .js-plotly-plot divs).
GRAPH_JS = """(title) => {
  const graphs = [...document.querySelectorAll('.js-plotly-plot')];
  const graph = graphs.find(g => g.layout && g.layout.title.text === title);
  if (!graph) return null;
  return {
    traces: graph.data.map(t => ({name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || [])})),
    shapes: (graph.layout.shapes || []).map(s => ({x0: s.x0, type: s.type})),
    annotations: (graph.layout.annotations || []).map(a => a.text),
    xrange: graph.layout.xaxis.range ? Array.from(graph.layout.xaxis.range) : null,
    autorange: graph.layout.xaxis.autorange,
  };
}"""


# In the page: each st.dataframe under `selector` as rows of cell texts (glide-data-grid keeps an
# accessible <table> of its visible cells beside the canvas it draws).
GRID_JS = """(selector) => [...document.querySelectorAll(selector + ' [data-testid=stDataFrame]')].map(frame =>
  [...frame.querySelectorAll('table tr')].map(row => [...row.querySelectorAll('th, td')].map(c => c.textContent)))"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def streamlit_app(app: Path, *args: str, command_prefix: Sequence[str] = (), repo: Path = REPO) -> Iterator[str]:
    """``streamlit run app -- *args`` on a free loopback port, importing the code of the tree ``repo``
    (a benchmark's baseline may be another tree): yield its base URL, then stop it.
    ``command_prefix``: what the server runs under (``support.without_permission_override()``)."""
    port = free_port()
    command = [
        *command_prefix,
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--",
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": str(repo), "METRICS_TOKEN": ACCESS_TOKEN}
    with served(command, port, cwd=repo, env=env, what=str(app)) as (url, _):
        yield url


@contextmanager
def served(
    command: Sequence[str], port: int, *, cwd: Path, env: dict[str, str], what: str
) -> Iterator[tuple[str, IO[bytes]]]:
    """Run the server ``command`` listening on loopback ``port``: yield its base URL and its log (stdout
    and stderr) once it answers, then stop it."""
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:  # not a pipe: nobody drains it while the server runs
        process = subprocess.Popen(
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            wait_for_http(f"{url}/_stcore/health", process, log, what=what)
            yield url, log
        finally:
            kill_group(process)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` and every process it started (its own session, ``start_new_session``), and
    reap it.  Not SIGTERM: once a tab has connected, uvicorn's graceful shutdown waits for its
    connections to close, with no time limit, so a terminated server outlives its caller by whatever
    the caller's wait allows; no caller reads what a server does on its way out (a test of a graceful
    stop signals the server itself and waits for it)."""
    with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextmanager
def installed_dashboard(venv: Path, runs_root: Path, *args: str, cwd: Path) -> Iterator[tuple[str, IO[bytes]]]:
    """``metrics-dashboard --runs runs_root --port <free> *args`` of the installed package in ``venv``,
    started in ``cwd`` with nothing of this checkout on its path: yield its base URL and log, then stop it."""
    port = free_port()
    command = [str(venv / "bin" / "metrics-dashboard"), "--runs", str(runs_root), "--port", str(port), *args]
    env = outside_checkout({**os.environ, "METRICS_TOKEN": ACCESS_TOKEN})
    with served(command, port, cwd=cwd, env=env, what="metrics-dashboard") as server:
        yield server


def wait_for_http(url: str, process: subprocess.Popen, log: IO[bytes], *, what: str, timeout: float = 60) -> None:
    """Until ``url`` answers 200; fail with the server's ``log`` if ``process`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"{what} did not start:\n{log.read().decode(errors='replace')}") from None
            time.sleep(0.2)


@contextmanager
def streamlit_server(
    runs_root: Path, *extra: str, refresh: float = 1.0, command_prefix: Sequence[str] = ()
) -> Iterator[str]:
    """Start the dashboard on ``runs_root``; yield its base URL; stop it."""
    args = ("--runs", str(runs_root), "--refresh", str(refresh), *extra)
    with streamlit_app(REPO / "app.py", *args, command_prefix=command_prefix) as url:
        yield url


class TokenBrowser:
    """A Playwright browser whose contexts and pages send ``Authorization: Bearer <token>`` with
    every request, the websocket's included: the owner's browser, for a test that reads pages.
    Anything else is the browser's own."""

    def __init__(self, browser: object, token: str) -> None:
        self.browser = browser
        self.token = token

    def _options(self, options: dict) -> dict:
        headers = {"Authorization": f"Bearer {self.token}", **options.pop("extra_http_headers", {})}
        return {**options, "extra_http_headers": headers}

    def new_context(self, **options: object) -> object:
        return self.browser.new_context(**self._options(options))

    def new_page(self, **options: object) -> object:
        return self.browser.new_page(**self._options(options))

    def anonymous_context(self, **options: object) -> object:
        """A context that carries no token: a stranger's browser."""
        return self.browser.new_context(**options)

    def __getattr__(self, name: str) -> object:
        return getattr(self.browser, name)


def sign_in(page: object, url: str, token: str = ACCESS_TOKEN) -> None:
    """Open the printed URL of the server at ``url`` in the browser context of ``page`` (a request, no
    page drawn): the context holds that server's session cookie, as the owner's browser does."""
    answer = page.request.get(f"{url}/?token={token}", max_redirects=0)
    assert answer.status == 303 and "set-cookie" in answer.headers, (answer.status, answer.headers)


@contextmanager
def chromium(token: str = ACCESS_TOKEN) -> Iterator[TokenBrowser]:
    """A headless Debian Chromium under Playwright, sending ``token`` (``TokenBrowser``)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield TokenBrowser(browser, token)
        finally:
            browser.close()


def http_get(url: str, *, headers: Mapping[str, str] = {}, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    """GET ``url`` with the token (``ACCESS_TOKEN``; ``headers`` may replace it): the status, the
    headers (lower-case names) and the body, whatever the status."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {ACCESS_TOKEN}", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def wait_until(page: object, predicate, timeout: float = 20.0, interval: float = 0.05) -> object:
    """Poll ``predicate()`` until it returns something truthy; return it, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        page.wait_for_timeout(interval * 1000)
    raise AssertionError(f"condition not met within {timeout} s")


class Wire:
    """What Chromium received for one page, counted from CDP network events: every HTTP response's
    encodedDataLength (headers and body as received, 0 for a cache hit) and every websocket frame
    received (payload bytes)."""

    def __init__(self, context: object, page: object) -> None:
        self.urls: dict[str, str] = {}
        self.http: dict[str, int] = {}  # url -> bytes received
        self.cached: set[str] = set()  # urls answered from the disk or memory cache
        self.frames = 0
        cdp = context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.on("Network.requestWillBeSent", lambda e: self.urls.__setitem__(e["requestId"], e["request"]["url"]))
        cdp.on("Network.requestServedFromCache", lambda e: self.cached.add(self.urls.get(e["requestId"], "")))
        cdp.on("Network.responseReceived", self._response)
        cdp.on("Network.loadingFinished", self._finished)
        cdp.on("Network.webSocketFrameReceived", self._frame)

    def _response(self, event: dict) -> None:
        if event["response"].get("fromDiskCache") or event["response"].get("fromPrefetchCache"):
            self.cached.add(event["response"]["url"])

    def _finished(self, event: dict) -> None:
        url = self.urls.get(event["requestId"], "")
        if url.startswith("http"):  # blob: and data: URLs never touch the network
            self.http[url] = self.http.get(url, 0) + int(event["encodedDataLength"])

    def _frame(self, event: dict) -> None:
        frame = event["response"]
        payload = frame["payloadData"]
        self.frames += len(base64.b64decode(payload)) if frame["opcode"] == 2 else len(payload.encode())

    def reset(self) -> None:
        self.http.clear()
        self.cached.clear()
        self.frames = 0

    @property
    def total(self) -> int:
        return sum(self.http.values()) + self.frames


def popover_text(page: object, label: str, timeout: float = 30.0) -> str:
    """Click the page's button that opens a panel (``st.popover``) whose label holds ``label``, once
    it is there, and return the text of the panel it opens (drawn only when open).  Clicked again
    until the panel is there: a click while Streamlit still mounts the page can be lost."""
    button = page.locator("[data-testid=stPopoverButton]", has_text=label).first
    panel = page.locator("[data-testid=stPopoverBody]").first

    def opened() -> bool:
        if panel.count():
            return True
        if button.count():
            button.click(timeout=timeout * 1000)
            page.wait_for_timeout(500)
        return panel.count() > 0

    wait_until(page, opened, timeout=timeout, interval=0.2)
    return panel.inner_text()


@contextmanager
def dashboard(
    runs_root: Path, *flags: str, args: Sequence[str] = (), env: Mapping[str, str] = {}
) -> Iterator[tuple[str, subprocess.Popen, IO[bytes]]]:
    """README command 1 with Streamlit ``flags`` and the dashboard's ``args``, on a free port, with
    ``env`` over this process's environment (``METRICS_TOKEN`` is ``ACCESS_TOKEN`` unless ``env``
    sets it): yield its URL, process and log (the shared fixture waits on
    /_stcore/health, which moves under a base URL path)."""
    port = free_port()
    base = next((flags[i + 1] for i, flag in enumerate(flags) if flag == "--server.baseUrlPath"), "")
    url = f"http://127.0.0.1:{port}" + (f"/{base}" if base else "")
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                "app.py",
                "--server.port",
                str(port),
                *flags,
                "--",
                "--runs",
                str(runs_root),
                *args,
            ],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "METRICS_TOKEN": ACCESS_TOKEN, **env, "PYTHONPATH": str(REPO)},
        )
        try:
            wait_for_http(f"{url}/_stcore/health", process, log, what="app.py")
            yield url, process, log
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


# In the page: the runs table's row names (its run links) in drawn order (the grid draws only the rows
# in its view, and a few beyond), how many rows it holds (its header is one of aria-rowcount), and
# the canvas it is drawn on.
RUN_ROWS_JS = """() => {
  const frame = document.querySelector('[data-testid=stDataFrame]');
  const grid = frame && frame.querySelector('table[aria-rowcount]');
  if (!grid || !frame.querySelector('canvas')) return {names: [], rows: 0};
  const box = frame.querySelector('canvas').getBoundingClientRect();
  return {names: [...frame.querySelectorAll('tbody tr')].map(r => r.querySelector('td').textContent),
          rows: +grid.getAttribute('aria-rowcount') - 1,
          x: box.x, y: box.y, height: box.height};
}"""


GRID_ROW_PX = 35  # glide-data-grid's header and row height in Streamlit's default theme


def row_point(page: object, name: str, x_offset: float) -> tuple[float, float]:
    """Where run ``name``'s row is drawn on the runs table's canvas, ``x_offset`` px from its left edge
    (a header row, then the rows, all ``GRID_ROW_PX`` high, the table scrolled to its top; the row
    marker column is ~34 px)."""
    table = wait_until(page, lambda: (t := page.evaluate(RUN_ROWS_JS)) and f"run?run={name}" in t["names"] and t)
    return table["x"] + x_offset, table["y"] + GRID_ROW_PX * (table["names"].index(f"run?run={name}") + 1.5)


def list_only(page: object, pattern: str, names: Sequence[str]) -> None:
    """Type ``pattern`` in the runs page's "Filter runs" box and wait until the table lists exactly
    the runs ``names``.  A shared root holds other tests' runs: unfiltered, a run may sit below the
    rows the grid draws (it draws only those in view), and the swept-key columns are those of every
    run listed.  The wait is on the grid's row count as well as the names drawn: unfiltered, the grid
    may draw just these runs at its top, the others below its view."""
    box = page.get_by_label("Filter runs", exact=True)
    box.fill(pattern)
    box.press("Enter")
    expected = sorted(f"run?run={name}" for name in names)

    def listed() -> bool:
        table = page.evaluate(RUN_ROWS_JS)
        return table["rows"] == len(expected) and sorted(table["names"]) == expected

    wait_until(page, listed, timeout=30)


def click(page: object, x: float, y: float) -> None:
    """A person's click: the pointer arrives (the grid underlines a link under a hovering pointer), then presses."""
    page.mouse.move(x - 8, y)
    page.mouse.move(x, y, steps=4)
    page.wait_for_timeout(150)
    page.mouse.click(x, y)


# In the page: the status cell's text of each row of the runs table (an empty list until it is drawn).
ROW_STATUSES_JS = """() => [...document.querySelectorAll('[data-testid=stDataFrame] tbody tr')]
  .map(r => r.querySelectorAll('td')[1].textContent)"""


@contextmanager
def listening(command: list[str], port: int, what: str) -> Iterator[None]:
    """``command`` running until the block ends, once it accepts connections on ``port`` (at most 30 s)."""
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, f"{what} exited at start"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{what} did not listen within 30 s"
                time.sleep(0.1)
        yield
    finally:
        server.kill()
        server.wait()
