"""Clients that never finish a request cannot hold the server: a connection that has not sent a
request's headers within ``header_timeout`` seconds of opening (or of its last answer, kept
alive) is closed, and the open connections stay below the process's file-descriptor limit.

Why here: uvicorn, which ``streamlit run`` serves an ``st.App`` with, arms no timer until a first
answer is sent, and Streamlit passes it no limit, so a connection that sends half a request line
and then a byte now and then is held for ever; a co-tenant of the node who opens more of them than
the process may open files leaves it unable to accept anything, its health check included.  The
ASGI app never sees such a connection (it sees finished headers only), so the guard sits where the
connections are: on the HTTP protocol class uvicorn makes one of per connection (``served_protocol``),
whose ``connection_made``, ``data_received``, ``on_response_complete`` and ``connection_lost`` it
wraps while the server runs (``guarding``, entered by ``serving.lifespan``, which runs before the
server accepts a connection, and undone as it stops).

What it leans on (checked by ``tests/integration/test_serving_connection_guard.py`` on a uvicorn
server configured as Streamlit configures its own, which fails if an upgrade changes it): Streamlit
gives uvicorn no ``http`` choice, so uvicorn's ``"auto"`` class serves every connection; an
instance of it has ``transport``, ``cycle`` (the request being answered: a new object once a
request's headers are in, its ``response_complete`` set once answered) and ``connections``
(uvicorn's set of open connections, websockets included: an upgraded connection leaves it for its
websocket protocol), and calls ``on_response_complete`` after each answer.

The rules, in ``ConnectionGuard``:

* each connection waiting for headers has a timer; the timer closes it unless a request arrived
  (its ``cycle`` changed) or it became a websocket.  Bytes that arrive do not restart it.
* at the cap (``connection_cap`` of the soft ``RLIMIT_NOFILE``, which the server raises as it
  starts, ``raise_file_limit``), a new connection closes the oldest connection still
  waiting for headers, itself if it is the only one: a flood of unfinished requests pushes out
  its own oldest, never an answer in progress or a page's websocket, and a health check or a page
  still gets in.  What the server accepts at once, before the guard has seen it, comes out of the
  reserve: where the hard limit is low, a burst larger than the reserve can still leave the
  process without a free descriptor for a second (asyncio then pauses accepting).

``METRICS_SERVE_PLAIN=1`` serves without the guard (``serving``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import import_module

HEADER_TIMEOUT = 10.0  # seconds a connection may take to send a request's headers
MAX_CONNECTIONS = 4096  # open at once: far above one person's tabs, a bound on what a flood of them holds
FILE_LIMIT = 2 * MAX_CONNECTIONS  # the soft RLIMIT_NOFILE the server raises itself to, hard limit allowing
WRAPPED = ("connection_made", "data_received", "on_response_complete", "connection_lost")


def header_timeout(environ: Mapping[str, str]) -> float:
    """``METRICS_HEADER_TIMEOUT`` (seconds, > 0), else ``HEADER_TIMEOUT``; ``SystemExit`` naming the
    variable on anything else (a server that would not time out slow clients does not start)."""
    text = environ.get("METRICS_HEADER_TIMEOUT", "").strip()
    if not text:
        return HEADER_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds < math.inf):
        raise SystemExit(f"METRICS_HEADER_TIMEOUT must be a number of seconds above 0, not {text!r}")
    return seconds


def raise_file_limit(wanted: int = FILE_LIMIT) -> int | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to ``wanted`` where its hard limit allows (as a
    server that holds many connections should: the soft limit is often 1024) and return it;
    ``None`` where there is no such limit (Windows) or it is unlimited."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(file_limit: int) -> int:
    """The most connections a process that may hold ``file_limit`` file descriptors keeps open: a
    reserve of a quarter of them, at least 64, is kept for everything else it opens (run files, the
    cache, its watches) and for the connections the server accepts at once before the guard sees
    them; at most ``MAX_CONNECTIONS``."""
    return max(1, min(MAX_CONNECTIONS, file_limit - max(64, file_limit // 4)))


def served_protocol() -> type:
    """The class uvicorn serves each HTTP connection with when, as under Streamlit, it is given no
    ``http`` choice: its ``"auto"`` one (h11's, or httptools' when that is installed)."""
    from uvicorn.config import HTTP_PROTOCOLS

    module, _, name = HTTP_PROTOCOLS["auto"].partition(":")
    return getattr(import_module(module), name)


class ConnectionGuard:
    """The timers and the cap of one server (module docstring); its methods are called from the
    wrapped protocol methods, on the server's event loop."""

    def __init__(self, *, header_timeout: float = HEADER_TIMEOUT, file_limit: int | None = None) -> None:
        """``file_limit``: the file descriptors the process may hold, None for no cap (``connection_cap``);
        ``guarding`` sets it as the server starts (``raise_file_limit``) when it is None."""
        self.header_timeout = header_timeout
        self.set_file_limit(file_limit)
        # Each connection waiting for headers, oldest first: its transport, the request it had
        # when it began to wait, and its timer.
        self.waiting: dict[object, tuple[asyncio.BaseTransport, object, asyncio.TimerHandle]] = {}
        self.closed = 0  # connections closed for taking too long or to stay under the cap

    def set_file_limit(self, file_limit: int | None) -> None:
        self.file_limit = file_limit
        self.cap = None if file_limit is None else connection_cap(file_limit)

    def made(self, protocol: object, transport: asyncio.BaseTransport) -> None:
        """A connection opened: it waits for headers; at the cap, the oldest that waits is closed."""
        self._wait(protocol, transport)
        if self.cap is not None and len(protocol.connections) > self.cap:
            while self.waiting:
                oldest = next(iter(self.waiting))
                if self._still_waiting(oldest):
                    self._close(oldest)
                    return
                self._stop(oldest)

    def received(self, protocol: object, cycle: object) -> None:
        """Bytes arrived and were parsed, ``cycle`` being the request before: headers in (a new
        request) or a websocket now: it no longer waits."""
        if protocol in self.waiting and (protocol.cycle is not cycle or protocol not in protocol.connections):
            self._stop(protocol)

    def responded(self, protocol: object, transport: asyncio.BaseTransport) -> None:
        """An answer was sent in full and the connection is kept alive: it waits for the next
        request's headers (unless a pipelined one is being answered already)."""
        cycle = protocol.cycle
        if not transport.is_closing() and (cycle is None or cycle.response_complete):
            self._wait(protocol, transport)

    def lost(self, protocol: object) -> None:
        self._stop(protocol)

    def _wait(self, protocol: object, transport: asyncio.BaseTransport) -> None:
        self._stop(protocol)
        timer = asyncio.get_running_loop().call_later(self.header_timeout, self._expire, protocol)
        self.waiting[protocol] = (transport, protocol.cycle, timer)

    def _still_waiting(self, protocol: object) -> bool:
        transport, cycle, _ = self.waiting[protocol]
        return protocol.cycle is cycle and protocol in protocol.connections and not transport.is_closing()

    def _expire(self, protocol: object) -> None:
        if protocol in self.waiting:
            if self._still_waiting(protocol):
                self._close(protocol)
            else:
                self._stop(protocol)

    def _close(self, protocol: object) -> None:
        transport, _, _ = self.waiting[protocol]
        self._stop(protocol)
        self.closed += 1
        transport.close()

    def _stop(self, protocol: object) -> None:
        entry = self.waiting.pop(protocol, None)
        if entry is not None:
            entry[2].cancel()


def guard_connections(environ: Mapping[str, str]) -> ConnectionGuard:
    """The guard of a server started with ``environ``: its header timeout (``header_timeout``); its
    cap is set as the server starts (``guarding``)."""
    return ConnectionGuard(header_timeout=header_timeout(environ))


@contextmanager
def guarding(guard: ConnectionGuard | None, protocol_class: type | None = None) -> Iterator[None]:
    """While inside, every connection of ``protocol_class`` (``served_protocol()``) made is watched
    by ``guard``; nothing when ``guard`` is None.  The class's methods are as they were after."""
    if guard is None:
        yield
        return
    if guard.file_limit is None:
        guard.set_file_limit(raise_file_limit())
    cls = served_protocol() if protocol_class is None else protocol_class
    own = {name: cls.__dict__[name] for name in WRAPPED if name in cls.__dict__}
    made, received, responded, lost = (getattr(cls, name) for name in WRAPPED)

    def connection_made(self: object, transport: asyncio.BaseTransport) -> None:
        made(self, transport)
        guard.made(self, transport)

    def data_received(self: object, data: bytes) -> None:
        cycle = self.cycle
        received(self, data)
        guard.received(self, cycle)

    def on_response_complete(self: object) -> None:
        responded(self)
        guard.responded(self, self.transport)

    def connection_lost(self: object, exc: Exception | None) -> None:
        guard.lost(self)
        lost(self, exc)

    wrappers = (connection_made, data_received, on_response_complete, connection_lost)
    for name, wrapper in zip(WRAPPED, wrappers, strict=True):
        setattr(cls, name, wrapper)
    try:
        yield
    finally:
        for name in WRAPPED:
            if name in own:
                setattr(cls, name, own[name])
            else:
                with contextlib.suppress(AttributeError):
                    delattr(cls, name)
