"""Helpers of the dashboard tests of more than one tier: runs roots, hostile run names, Streamlit's
static files and an ASGI app answering like its static route, and the store's view compared with
one built from scratch."""

from __future__ import annotations

import asyncio
import base64
import random
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import pandas as pd
from starlette.requests import Request
from starlette.routing import Route
from streamlit import file_util

from metrics_core.dashboard.server.asgi_gzip import StaticGzip
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.snapshot import EVENTS, build_view
from metrics_core.read.run_reader import RunReader
from tests.support import append_records, base_record

# Run names, config keys and values that markdown, HTML or a link would interpret.
HOSTILE_NAMES = [
    "**bold**",
    "[x](https://evil.example)",
    "<img src=x onerror=alert(1)>",
    '<a href="https://evil.example">x</a>',
    "[Log in again](https://evil.example/login)",
    "`code` _em_ ~~strike~~ $x^2$ :red[red] :material/home: https://evil.example www.evil.example a@evil.example",
    "# heading\n- item\r\n> quote",
    "&lt;b&gt;entity&lt;/b&gt; &amp;",
]


def make_runs(root: Path, *names: str) -> None:
    for name in names:
        append_records(root / name / "metrics.jsonl", *(base_record(s, train_loss=1.0 / s) for s in (10, 20)))


def make_run(directory: Path) -> None:
    append_records(directory / "metrics.jsonl", base_record(1))


STATIC = Path(file_util.get_static_dir())


ONE_YEAR = "public, immutable, max-age=31536000"  # what Streamlit sends for its hashed bundles


def full_view(store: RunStore, name: str) -> object:
    """The O(n) oracle: ``name``'s snapshot built from scratch by a fresh reader."""
    reader = RunReader(store.root / name)
    reader.refresh()
    return build_view(name, reader, "live")


def assert_same_view(view: object, oracle: object) -> None:
    assert view.records == oracle.records and view.sessions == oracle.sessions
    for event in EVENTS:
        pd.testing.assert_frame_equal(view.frames[event], oracle.frames[event])
        np.testing.assert_array_equal(view.superseded[event], oracle.superseded[event])
    np.testing.assert_array_equal(view.redone_by, oracle.redone_by)


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


class Sent(list):
    """An ASGI ``send`` that keeps what it was given: the response's start, then its body messages."""

    async def __call__(self, message: dict) -> None:
        self.append(message)

    def body(self) -> bytes:
        return b"".join(message.get("body", b"") for message in self[1:])


async def fetch(middleware: StaticGzip, path: str) -> tuple[dict[bytes, bytes], bytes]:
    sent = Sent()
    scope = {"type": "http", "method": "GET", "path": path, "headers": [(b"accept-encoding", b"gzip")]}
    await middleware(scope, None, sent)
    return dict(sent[0]["headers"]), sent.body()


async def route_get(
    route: Route, path: str, *, gone: asyncio.Event | None = None, **query: object
) -> tuple[int, bytes]:
    """``GET path?query`` answered by ``route``'s endpoint as an ASGI server calls it, the answer
    sent: its ``receive`` gives the request's empty body, then waits until the client is ``gone``
    (never, without it)."""
    sent_body = False

    async def receive() -> dict:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await (gone or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": urlencode(query).encode()}
    response = await route.endpoint(Request(scope, receive))
    sent = Sent()
    await response(scope, receive, sent)
    return sent[0]["status"], sent.body()
