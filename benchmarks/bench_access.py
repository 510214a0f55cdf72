"""What the access check costs a request: the same ASGI requests through ``AccessGuard`` and
straight to the app behind it, alternated in rounds in one process; prints each kind's cost per
request and the guard's share.  Goal: at most a millisecond a request (docs/PERFORMANCE.md).

The last kinds are a Bearer request from a loopback connection while another client waits after
wrong tokens: the guard asks the kernel whose connection it is (``clients.loopback_peers``), by its
socket diagnostics and, for comparison, by reading its socket table.  ``--sockets N`` first opens N
loopback connections (2N sockets), as on a busy head node.

Run: python benchmarks/bench_access.py [--requests 20000] [--rounds 5] [--sockets 0]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.dashboard.clients import wrong_tokens
from metrics_core.dashboard.clients.browser_sessions import BrowserSessions
from metrics_core.dashboard.clients.loopback_peers import listed_uid
from metrics_core.dashboard.clients.wrong_tokens import GuessLimit
from metrics_core.dashboard.server.access import Access, AccessGuard

TOKEN = "t" * 43  # the length of a made-up token
ACCESS = Access(token=TOKEN, loopback=True)
SESSIONS = BrowserSessions()
SESSION = SESSIONS.new()  # what a browser's cookie holds once it has opened the printed URL
BROWSER_HEADERS = [  # what Chromium sends with a page's request once it holds the cookie
    (b"host", b"127.0.0.1:8501"),
    (b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/156.0 Safari/537.36"),
    (b"accept", b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
    (b"accept-encoding", b"gzip, deflate, br, zstd"),
    (b"accept-language", b"en-US,en;q=0.9"),
    (
        b"cookie",
        b"_streamlit_xsrf=2|5c54be80|7623f94606079fe668e129467786ce02|1796298683; metrics_session_8501="
        + SESSION.encode(),
    ),
    (b"sec-fetch-mode", b"navigate"),
]
KINDS = {
    "page with the cookie": {"path": "/run", "query_string": b"run=a&x=step", "headers": BROWSER_HEADERS},
    "api with a Bearer header": {
        "path": "/api/changes",
        "query_string": b"run=a&seq=10",
        "headers": [(b"host", b"127.0.0.1:8501"), (b"authorization", b"Bearer " + TOKEN.encode())],
    },
    "refused: no token": {"path": "/run", "query_string": b"run=a", "headers": BROWSER_HEADERS[:-2]},
}


async def app(scope: dict, receive: object, send: object) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def timed(handler: object, scope: dict, requests: int) -> float:
    """Seconds per request of ``handler`` on ``scope``."""

    async def send(message: dict) -> None:
        return None

    async def receive() -> dict:
        return {"type": "http.request"}

    start = time.perf_counter()
    for _ in range(requests):
        await handler(scope, receive, send)
    return (time.perf_counter() - start) / requests


def busy_node(connections: int) -> list[socket.socket]:
    """``connections`` loopback connections held open (both ends: 2 sockets each), and one more,
    the last pair, whose client end the waiting kinds' requests come from."""
    wanted = 2 * connections + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    held = [listener]
    for _ in range(connections + 1):
        held.append(socket.create_connection(listener.getsockname()))
        held.append(listener.accept()[0])
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sockets", type=int, default=0, help="loopback connections to open first")
    args = parser.parse_args()
    held = busy_node(args.sockets)
    print(f"{Path('/proc/net/tcp').read_text().count(chr(10)) - 1} sockets in /proc/net/tcp")
    guarded = AccessGuard(app, access=ACCESS, sessions=SESSIONS)
    waiting = GuessLimit(first=3600.0, longest=3600.0)
    for _ in range(waiting.free + 1):
        waiting.wrong("uid:4242")  # another user, waiting for an hour: every token's sender is asked for
    asked = AccessGuard(app, access=ACCESS, sessions=SESSIONS, guesses=waiting)
    connection = {"client": held[-1].getpeername(), "server": held[-1].getsockname()}  # the accepted end's view
    print(f"{'request':<44}{'bare app':>12}{'guarded':>12}{'guard adds':>14}")
    worst = 0.0
    kinds = [(kind, fields, guarded, args.requests) for kind, fields in KINDS.items()]
    bearer = {**KINDS["api with a Bearer header"], **connection}
    kinds.append(("Bearer, a client waits: diagnostics asked", bearer, asked, args.requests // 10))
    kinds.append(("Bearer, a client waits: the table read", bearer, asked, max(args.requests // 1000, 10)))
    for kind, fields, handler, requests in kinds:
        scope = {"type": "http", "method": "GET", "scheme": "http", "server": ("127.0.0.1", 8501), **fields}
        if kind.endswith("table read"):  # the fallback where the diagnostics are refused
            wrong_tokens.peer_uid = listed_uid
        bare, guard = [], []
        for _ in range(args.rounds):  # alternated, so drift hits both alike
            bare.append(asyncio.run(timed(app, scope, requests)))
            guard.append(asyncio.run(timed(handler, scope, requests)))
        added = statistics.median(guard) - statistics.median(bare)
        worst = max(worst, statistics.median(guard)) if handler is guarded else worst
        print(
            f"{kind:<44}{statistics.median(bare) * 1e6:>10.1f}µs{statistics.median(guard) * 1e6:>10.1f}µs"
            f"{added * 1e6:>12.1f}µs"
        )
    print(
        f"slowest guarded request of a page or a client when no one waits: {worst * 1e6:.1f} µs, "
        f"{worst / 1e-3:.1%} of the 1 ms goal"
    )


if __name__ == "__main__":
    main()
