"""What clients that never finish their request headers can do to a served dashboard: nothing
lasting.  A co-tenant of the node opens hundreds of loopback connections, each sending the start
of a request and then a byte now and then, never the blank line that ends the headers (no token
needed: the access check only ever sees finished headers).  The server must keep answering its
health check at once, close each of them once the header timeout passes, and not run out of file
descriptors: it raises its soft ``RLIMIT_NOFILE`` to what the hard one allows and keeps its
connections below it (``server.connection_guard``; the cap itself is tested on a plain uvicorn
server in ``test_serving_connection_guard.py``).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrics_core.testing.live_server import streamlit_server

SLOW_CLIENTS = 300  # what the server must shrug off
FILE_LIMIT = "256:1024"  # the server's RLIMIT_NOFILE, soft:hard: 300 clients need more than the soft one
HEADER_TIMEOUT = 2.0  # seconds, METRICS_HEADER_TIMEOUT: short, so the test waits little
HEALTH_DEADLINE = 1.0  # seconds the health check may take with every slow client connected


def health_answers(url: str) -> bool:
    """Whether ``/_stcore/health`` answers 200 within ``HEALTH_DEADLINE``."""
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=HEALTH_DEADLINE) as answer:
            return answer.status == 200
    except OSError:
        return False


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (read ready: end of stream or reset; an answer it
    sent first is read and passed over)."""
    try:
        return sock.recv(4096) == b""
    except ConnectionError:
        return True


@pytest.fixture
def slow_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The dashboard on an empty root, with a ``HEADER_TIMEOUT`` and the file limits ``FILE_LIMIT``."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("METRICS_HEADER_TIMEOUT", str(HEADER_TIMEOUT))
    with streamlit_server(root, command_prefix=["prlimit", f"--nofile={FILE_LIMIT}", "--"]) as url:
        yield url


def test_unfinished_headers_neither_stop_health_nor_stay_open(slow_server: str) -> None:
    """``SLOW_CLIENTS`` connections that never finish a request, more than the server's soft file
    limit leaves room for (one in 30 sends its headers and then a body that never ends, answered
    403 without the token): health answers within ``HEALTH_DEADLINE`` with all of them connected,
    every one of them is closed by the server once the header timeout passes although each keeps
    sending bytes, and the server still answers health afterwards."""
    host, port = slow_server.removeprefix("http://").split(":")
    assert host == "127.0.0.1"
    clients: list[socket.socket] = []
    with selectors.DefaultSelector() as selector:
        try:
            for number in range(SLOW_CLIENTS):
                sock = socket.create_connection((host, int(port)), timeout=5)
                clients.append(sock)
                if number % 30:
                    sock.sendall(f"GET /?n={number} HTTP/1.1\r\nHost: {host}:{port}\r\nX-Slow: ".encode())
                else:  # headers in, a body that never ends: refused (no token), then kept alive
                    sock.sendall(
                        f"POST /?n={number} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 1000000\r\n\r\n".encode()
                    )
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ)
            opened = time.monotonic()
            assert health_answers(slow_server), f"no health answer within {HEALTH_DEADLINE} s"
            open_ones = set(clients)
            deadline = opened + HEADER_TIMEOUT + 10
            while open_ones and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=0.3):
                    if closed_by_server(key.fileobj):
                        selector.unregister(key.fileobj)
                        open_ones.discard(key.fileobj)
                for sock in open_ones:  # a byte now and then: the timeout holds however they trickle
                    with contextlib.suppress(OSError):  # closed meanwhile: the next select says so
                        sock.send(b"x")
            assert not open_ones, f"{len(open_ones)} of {SLOW_CLIENTS} unfinished requests still open"
            assert health_answers(slow_server)
        finally:
            for sock in clients:
                sock.close()
