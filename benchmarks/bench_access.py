"""What the access check costs a request: the same ASGI requests through ``AccessGuard`` and
straight to the app behind it, alternated in rounds in one process; prints each kind's cost per
request and the guard's share.  Goal: at most a millisecond a request (docs/PERFORMANCE.md).

Run: python benchmarks/bench_access.py [--requests 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.dashboard.clients.browser_sessions import BrowserSessions
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    guarded = AccessGuard(app, access=ACCESS, sessions=SESSIONS)
    print(f"{'request':<28}{'bare app':>12}{'guarded':>12}{'guard adds':>14}")
    worst = 0.0
    for kind, fields in KINDS.items():
        scope = {"type": "http", "method": "GET", "scheme": "http", "server": ("127.0.0.1", 8501), **fields}
        bare, guard = [], []
        for _ in range(args.rounds):  # alternated, so drift hits both alike
            bare.append(asyncio.run(timed(app, scope, args.requests)))
            guard.append(asyncio.run(timed(guarded, scope, args.requests)))
        added = statistics.median(guard) - statistics.median(bare)
        worst = max(worst, statistics.median(guard))
        print(
            f"{kind:<28}{statistics.median(bare) * 1e6:>10.1f}µs{statistics.median(guard) * 1e6:>10.1f}µs"
            f"{added * 1e6:>12.1f}µs"
        )
    print(f"slowest guarded request: {worst * 1e6:.1f} µs, {worst / 1e-3:.1%} of the 1 ms goal")


if __name__ == "__main__":
    main()
