"""How the dashboard's server answers HTTP, around Streamlit's own routes (issue 11: first load).

Streamlit 1.67 serves its frontend (``/static/...``: ~3.3 MB of JavaScript and CSS on a first load of
a page) uncompressed on purpose: its gzip middleware would compress every response again and keep
nothing, so a herd of first loads after a deploy burns CPU the event loop needs.  Those files are
content-hashed and sent ``immutable, max-age=1 year``, so a gzip copy made once per file is valid for
the life of the process: ``StaticGzip`` compresses each one the first time it is asked for, keeps
the result in memory (at most the compressed size of Streamlit's static directory, ~5 MB; a first
load of a page uses ~1 MB of it) and answers every later request with it.  The CPU is spent once
per file and process (~10 ms for the largest, ``protobuf.js``); the browser receives ~1.8 MB instead
of ~3.9 MB.

Contract:

* Only ``GET`` requests for paths under ``/static/`` (after the ASGI ``root_path`` and
  ``server.baseUrlPath``) whose answer is a whole 200 of a compressible type (text, JavaScript,
  JSON, SVG) are touched; everything else, websockets included, passes through untouched.  A
  ``Range`` request passes through (its ``Content-Range`` describes identity bytes).
* A client whose ``Accept-Encoding`` does not allow gzip gets the identity bytes; every touched
  answer carries ``Vary: Accept-Encoding`` so a shared cache keeps the two apart.  Streamlit's own
  headers (``Cache-Control``, ``ETag``, ``Last-Modified``, ``Content-Type``) are kept;
  ``Content-Length`` is the length sent.
* A file whose gzip copy would not save at least 10 % is sent as is (and remembered as such).
* Nothing is written to disk: a restart compresses again, on first use.

``import metrics_core`` never imports this module: only app.py does, when ``streamlit run`` serves
the app through ``st.App``.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable
from typing import Any

from anyio import to_thread

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COMPRESSIBLE = ("text/", "application/javascript", "application/json", "image/svg+xml", "application/manifest+json")
GZIP_LEVEL = 9  # once per file, so the smallest output is worth the extra ~5 ms on the largest file
MIN_SAVING = 0.9  # keep the gzip copy only if it is at most 90 % of the identity bytes


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value allows gzip: ``gzip`` or ``*`` listed without ``q=0``."""
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            quality = params.strip().lower()
            if quality.startswith("q="):
                try:
                    return float(quality[2:]) > 0
                except ValueError:
                    return False
            return True
    return False


def route_path(scope: Scope, base_url: str) -> str:
    """The request path as Streamlit's router sees it: without the ASGI ``root_path`` (a mount or a
    proxy) and without ``server.baseUrlPath``, each removed only at a path-segment boundary."""
    path: str = scope.get("path", "")
    for prefix in (scope.get("root_path", ""), "/" + base_url.strip("/")):
        prefix = prefix.rstrip("/")
        if prefix and (path == prefix or path.startswith(prefix + "/")):
            path = path[len(prefix) :] or "/"
    return path


def _gzip(body: bytes) -> bytes | None:
    """``body`` gzip-compressed (no timestamp, so the bytes depend only on the input), or None when
    that does not save enough to be worth a decode in the browser."""
    compressed = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
    return compressed if len(compressed) <= MIN_SAVING * len(body) else None


class StaticGzip:
    """ASGI middleware: Streamlit's static files, gzip-compressed once per file and process (see the
    module docstring for what it touches and what it promises)."""

    def __init__(self, app: ASGIApp, *, base_url: str = "") -> None:
        self.app = app
        self.base_url = base_url
        # (path, ETag) -> the compression of that file, shared by concurrent first requests; done
        # tasks are the cache.  Keyed by ETag too, so a file that changed is compressed again.
        self._copies: dict[tuple[str, str], asyncio.Task[bytes | None]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not route_path(scope, self.base_url).startswith("/static/")
            or any(name == b"range" for name, _ in scope["headers"])
        ):
            await self.app(scope, receive, send)
            return
        wanted = any(name == b"accept-encoding" and accepts_gzip(value.decode("latin-1"))
                     for name, value in scope["headers"])  # fmt: skip
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if _compressible(message):
                    start = message  # held until the body is complete
                    return
            elif start is not None and message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await self._answer(scope, start, b"".join(chunks), wanted, send)
                return
            await send(message)

        await self.app(scope, receive, capture)

    async def _answer(self, scope: Scope, start: Message, body: bytes, wanted: bool, send: Send) -> None:
        headers = [(name, value) for name, value in start["headers"] if name not in (b"content-length", b"vary")]
        vary = [value for name, value in start["headers"] if name == b"vary"]
        headers.append((b"vary", b", ".join([*vary, b"Accept-Encoding"])))
        if wanted:
            etag = next((value.decode("latin-1") for name, value in start["headers"] if name == b"etag"), "")
            key = (scope["path"], etag)
            task = self._copies.get(key)
            if task is None:  # compressing ~1 MB takes ~10 ms: off the event loop
                task = self._copies[key] = asyncio.ensure_future(to_thread.run_sync(_gzip, body))
            compressed = await task
            if compressed is not None:
                body = compressed
                headers.append((b"content-encoding", b"gzip"))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _compressible(start: Message) -> bool:
    """A whole 200 answer of a text type that nothing has encoded yet."""
    if start["status"] != 200:
        return False
    headers = dict(start["headers"])
    content_type = headers.get(b"content-type", b"").decode("latin-1").lower()
    return b"content-encoding" not in headers and content_type.startswith(COMPRESSIBLE)
