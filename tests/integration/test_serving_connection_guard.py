"""The connection guard (``server.connection_guard``) on a real uvicorn server, configured as
Streamlit configures the one it serves an ``st.App`` with, over real loopback sockets; and the
uvicorn behaviour it leans on, each test failing if an upgrade changes it (the served protocol
class, its ``cycle``, its ``connections``, a websocket leaving them)."""

from __future__ import annotations

import asyncio
import inspect
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from streamlit.web.server.starlette import starlette_server

from metrics_core.dashboard.server.connection_guard import (
    ConnectionGuard,
    connection_cap,
    guarding,
    header_timeout,
    served_protocol,
)

SLOW_ANSWER = 1.5  # seconds the app takes to answer /slow: longer than the header timeouts below


async def app(scope: dict, receive, send) -> None:
    """Answers any path at once, ``/slow`` after ``SLOW_ANSWER``; accepts any websocket and keeps it."""
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(SLOW_ANSWER)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def streamlit_config(**overrides: object) -> uvicorn.Config:
    """A uvicorn ``Config`` of ``app`` with the options Streamlit gives its own (``overrides`` over them)."""
    options = {**starlette_server._get_uvicorn_config_kwargs(), "lifespan": "off", "log_config": None, **overrides}
    return uvicorn.Config(app, host="127.0.0.1", **options)


@contextmanager
def guarded_server(guard: ConnectionGuard) -> Iterator[int]:
    """A uvicorn server of ``app`` on a free loopback port, its connections watched by ``guard``
    (uvicorn's own keep-alive timeout far away): yield its port, then stop it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    server = uvicorn.Server(streamlit_config(timeout_keep_alive=600))
    with guarding(guard):
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.01)
            yield listener.getsockname()[1]
        finally:
            server.should_exit = True
            thread.join(30)
            listener.close()


def connect(port: int, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(data)
    return sock


def answer(sock: socket.socket, request: bytes) -> bytes:
    """Send ``request`` and read its answer (headers and the 2-byte body)."""
    sock.sendall(request)
    received = b""
    while not received.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(4096)
        assert chunk, f"closed before the answer: {received!r}"
        received += chunk
    return received


def closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (end of stream or reset; it
    stays closed for the next call)."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            try:
                if sock.recv(4096) == b"":
                    return True
            except ConnectionError:
                return True
    return False


def open_websocket(port: int) -> socket.socket:
    sock = connect(port)
    sock.sendall(
        b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(4096)
        assert chunk, "websocket refused"
        received += chunk
    assert received.startswith(b"HTTP/1.1 101"), received
    return sock


def test_streamlit_serves_with_uvicorns_auto_protocol_the_guard_wraps() -> None:
    """Streamlit gives uvicorn no ``http`` choice, so each connection is an instance of uvicorn's
    ``"auto"`` class (``served_protocol``), which has every method the guard wraps."""
    assert "http" not in starlette_server._get_uvicorn_config_kwargs()
    assert inspect.signature(uvicorn.Config).parameters["http"].default == "auto"
    config = streamlit_config()
    config.load()
    assert config.http_protocol_class is served_protocol()
    for name in ("connection_made", "data_received", "on_response_complete", "connection_lost"):
        assert callable(getattr(served_protocol(), name))


def test_the_guard_closes_connections_that_wait_for_headers_and_nothing_else() -> None:
    """Header timeout 0.5 s: a silent connection, one trickling an unfinished request and one kept
    alive after an answer are closed; an answer the app takes longer than that to give arrives,
    and a websocket stays open.  The class is as it was once the guard is left."""
    guard = ConnectionGuard(header_timeout=0.5)
    plain = {name: served_protocol().__dict__.get(name) for name in ("connection_made", "connection_lost")}
    with guarded_server(guard) as port:
        websocket = open_websocket(port)
        silent = connect(port)
        trickling = connect(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        for _ in range(50):  # a byte every tenth of a second does not keep it open
            if closed(trickling, 0.1):
                break
            trickling.sendall(b"x")
        kept = connect(port)
        assert answer(kept, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 200")
        slow = connect(port)
        started = time.monotonic()
        assert answer(slow, b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started >= SLOW_ANSWER
        assert closed(silent, 5) and closed(trickling, 5) and closed(kept, 5)
        assert not closed(websocket, 0.2)
        assert answer(slow, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 200")
        assert guard.closed >= 3
        for sock in (websocket, silent, trickling, kept, slow):
            sock.close()
    assert {name: served_protocol().__dict__.get(name) for name in plain} == plain


def test_at_the_cap_the_oldest_connection_waiting_for_headers_makes_way() -> None:
    """A cap of 6 connections (a file limit of 70 less its reserve of 64): with a websocket and five
    silent connections open, each new connection closes the oldest silent one, never the
    websocket, and a request on a new connection is answered."""
    assert connection_cap(70) == 6 and connection_cap(1024) == 768 and connection_cap(10**6) == 4096
    guard = ConnectionGuard(header_timeout=600, file_limit=70)
    with guarded_server(guard) as port:
        websocket = open_websocket(port)
        silent = [connect(port) for _ in range(5)]
        assert not any(closed(sock, 0.1) for sock in silent)
        silent += [connect(port), connect(port)]
        assert closed(silent[0], 5) and closed(silent[1], 5)
        assert not any(closed(sock, 0.1) for sock in silent[2:])
        newcomer = connect(port)
        assert answer(newcomer, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 200")
        assert closed(silent[2], 5) and not closed(websocket, 0.1)
        for sock in (websocket, newcomer, *silent):
            sock.close()


def test_the_header_timeout_is_read_from_the_environment() -> None:
    assert header_timeout({}) == 10.0 and header_timeout({"METRICS_HEADER_TIMEOUT": "2.5"}) == 2.5
    for wrong in ("0", "-1", "soon", "inf", "nan"):
        try:
            header_timeout({"METRICS_HEADER_TIMEOUT": wrong})
        except SystemExit as refusal:
            assert "METRICS_HEADER_TIMEOUT" in str(refusal)
        else:
            raise AssertionError(f"METRICS_HEADER_TIMEOUT={wrong} accepted")
