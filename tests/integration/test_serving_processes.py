"""The serving layer against real sockets and a real server: the warm first script run, TCP_NODELAY
on the listener's connections, METRICS_SERVE_PLAIN as one switch, and Nagle's stalls."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.runtime.pages_manager import PagesManager

from metrics_core.dashboard.server import serving
from metrics_core.dashboard.server.access import AccessGuard
from metrics_core.dashboard.server.asgi_gzip import StaticGzip
from metrics_core.dashboard.server.page_head import PreloadHints
from metrics_core.dashboard.server.serving import tcp_no_delay
from metrics_core.testing.live_server import ACCESS_TOKEN, dashboard, free_port
from tests.support import REPO, run_async


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


def test_serve_plain_is_one_switch_that_turns_every_part_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """With METRICS_SERVE_PLAIN=1 app.py's ``st.App`` gets no middleware but the access check and a
    lifespan that only runs the app's shutdown: no warm-up touching Streamlit's privates, no socket
    option; served, it gets the gzip and head-tag middleware behind the access check and the
    lifespan does its start-up work."""
    touched: list[str] = []
    monkeypatch.setattr(serving, "warm_first_script_run", lambda: touched.append("warm"))
    monkeypatch.setattr(serving, "tcp_no_delay", lambda port: touched.append("no_delay") or 0)
    closed: list[bool] = []

    async def start_and_stop_lifespan(options: dict) -> None:
        async with options["lifespan"](object()):
            pass

    def start_and_stop(options: dict) -> None:
        run_async(start_and_stop_lifespan(options))

    plain = serving.app_options(
        REPO / "app.py", shutdown=lambda: closed.append(True), environ={"METRICS_SERVE_PLAIN": "1"}
    )
    assert list(plain) == ["lifespan", "middleware"]
    assert [item.cls for item in plain["middleware"]] == [AccessGuard]
    monkeypatch.setattr(PagesManager, "uses_pages_directory", True)
    start_and_stop(plain)
    time.sleep(0.2)  # a warm-up thread, had one started
    assert closed == [True] and touched == [] and PagesManager.uses_pages_directory is True
    served = serving.app_options(REPO / "app.py", shutdown=lambda: closed.append(True), environ={})
    assert [item.cls for item in served["middleware"]] == [AccessGuard, StaticGzip, PreloadHints]
    start_and_stop({"lifespan": serving.lifespan([], lambda: None)})
    assert PagesManager.uses_pages_directory is False
    deadline = time.monotonic() + 10
    while "warm" not in touched and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(touched) == ["no_delay", "warm"]


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


def test_the_only_url_the_server_prints_is_the_one_to_open_with_its_token_last(runs_root: Path) -> None:
    """The last line a starting server prints is the URL that lets a browser in, or says there is
    no token; it is the first and only URL in its output: none of Streamlit's own welcome lines
    ("Local URL: http://localhost:8501", which answers 403 without the token: the app's
    .streamlit/config.toml hides them), and no line about which copy of the code runs."""
    said = []
    for _ in range(2):
        with dashboard(runs_root, env={"METRICS_TOKEN": "off"} if said else {}) as (url, _, log):
            deadline = time.monotonic() + 30
            while True:
                log.seek(0)
                text = log.read().decode(errors="replace")
                if "Open the dashboard" in text or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            said.append((url, text))
    (url, text), (open_url, open_text) = said
    assert text.strip().splitlines()[-1] == f"Open the dashboard: {url}/?token={ACCESS_TOKEN}"
    assert open_text.strip().splitlines()[-1] == f"Open the dashboard: {open_url}/ (no access token: METRICS_TOKEN=off)"
    assert re.findall(r"https?://\S+", text) == [f"{url}/?token={ACCESS_TOKEN}"], text
    assert re.findall(r"https?://\S+", open_text) == [f"{open_url}/"], open_text
    assert "URL:" not in text + open_text and "metrics_core" not in text + open_text, text + open_text


def test_listening_everywhere_without_a_token_is_refused_in_one_line(runs_root: Path) -> None:
    """``--server.address 0.0.0.0`` with ``METRICS_TOKEN=off`` ends the server at start, saying why."""
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(free_port()),
               "--server.address", "0.0.0.0", "--", "--runs", str(runs_root)]  # fmt: skip
    env = {**os.environ, "METRICS_TOKEN": "off", "PYTHONPATH": str(REPO)}
    ended = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert ended.returncode != 0
    said = ended.stdout + ended.stderr
    assert "refusing to listen on 0.0.0.0 with access control off (METRICS_TOKEN=off)" in said, said
