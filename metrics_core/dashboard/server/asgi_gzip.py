"""ASGI middleware that answers immutable static files gzip-compressed, each compressed once per
process, for a server that sends them uncompressed (Streamlit's, behind ``serving.py``).

Contract of ``StaticGzip``:

* Only ``GET`` requests for canonical paths (``canonical``: no ``//``, ``.`` or ``..`` segment, which
  the inner app may serve as the same file) under its prefixes (after the ASGI ``root_path`` and the
  server's base URL path) whose answer is a whole 200 of a compressible type (``COMPRESSIBLE``)
  and immutable (``Cache-Control: immutable``, or under a ``hashed`` prefix: a file whose URL
  carries its content hash, in its name or its query) are touched; everything else, websockets included, passes through
  untouched.  A ``Range`` request passes through (its ``Content-Range`` describes identity bytes).
* A client whose ``Accept-Encoding`` does not allow gzip gets the identity bytes; every touched
  answer carries ``Vary: Accept-Encoding`` so a shared cache keeps the two apart.  The inner
  app's ``Cache-Control``, ``ETag`` (made weak when the body is compressed), ``Last-Modified`` and
  ``Content-Type`` are kept; ``Content-Length`` is the length sent.
* A file whose gzip copy would not save ``MIN_SAVING`` is sent as is (and remembered as such).
* Nothing is written to disk: a restart compresses again.  The copies live in a ``GzipCopies``,
  at most one per file and process and ``COPIES_MAX_BYTES`` in all (least recently asked for
  dropped first), which a server can fill ahead of any request (``prewarm``).

Nothing here imports a web framework beyond the ASGI types.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import posixpath
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COMPRESSIBLE = ("text/", "application/javascript", "application/json", "image/svg+xml", "application/manifest+json")
GZIP_LEVEL = 9  # once per file and process: the smallest output is worth the slowest level
IMMUTABLE = b"public, max-age=31536000, immutable"
MIN_SAVING = 0.9  # keep the gzip copy only if it is at most 90 % of the identity bytes
# What the copies may hold in all: several times Streamlit's whole static directory compressed, so
# only a server asked for files no page loads ever drops one.
COPIES_MAX_BYTES = 64 << 20


def canonical(path: str) -> bool:
    """Whether ``path`` is the one spelling of the file it names: absolute, with no empty, ``.`` or
    ``..`` segment and no trailing slash.  A static server answers ``/static//js/a.js`` and
    ``/static/./js/a.js`` with the file of ``/static/js/a.js``; a copy per spelling would let a
    client fill the server's memory with copies of one file."""
    return path.startswith("/") and not path.startswith("//") and posixpath.normpath(path) == path


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value allows gzip: ``gzip`` listed without ``q=0``, else ``*``
    listed without ``q=0`` (an explicit ``gzip`` entry wins over ``*``; a bad q-value refuses)."""
    qualities: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        quality = params.strip().lower()
        try:
            qualities.setdefault(coding.strip().lower(), float(quality[2:]) if quality.startswith("q=") else 1.0)
        except ValueError:
            qualities.setdefault(coding.strip().lower(), 0.0)
    return qualities.get("gzip", qualities.get("*", 0.0)) > 0


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


class GzipCopies:
    """The gzip copies ``StaticGzip`` answers with, one per file and process: made by the first
    request that needs one, or ahead of any request by ``prewarm``.  Keyed by route path (without
    the base URL) and size: only immutable answers get here, whose URLs carry a hash of their
    content, so no file changes under its route while a process runs (``compressible``; a made-up
    path, which Streamlit answers with its index.html, is never compressed nor kept; nor is a
    non-``canonical`` spelling).  At most ``max_bytes`` of copies are kept, the least recently asked
    for dropped first.  Safe across threads: a request waits for a copy being made rather than make
    it again; a copy that failed is forgotten, so the next request tries again."""

    def __init__(self, *, max_bytes: int = COPIES_MAX_BYTES) -> None:
        self._lock = threading.Lock()
        self._made: OrderedDict[tuple[str, int], Future[bytes | None]] = OrderedDict()
        self._sizes: dict[tuple[str, int], int] = {}  # of the copies made: what they hold
        self._max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self._made)

    async def copy(self, route: str, body: bytes) -> bytes | None:
        """The gzip copy of ``body``, the answer for ``route``, made off the event loop if no one
        has.  A client that goes away meanwhile cancels its own wait, never the
        shared compression."""
        key = (route, len(body))
        made, mine = self._claim(key)
        if mine:
            asyncio.get_running_loop().run_in_executor(None, self._make, key, made, lambda: body)
        return await asyncio.shield(asyncio.wrap_future(made))

    def prewarm(self, files: Iterable[tuple[str, Path]]) -> None:
        """Make the copies of ``files`` (route path, file) in this thread, in their order, skipping
        those made or being made; a file that cannot be read is left to its first request."""
        for route, path in files:
            with contextlib.suppress(OSError):
                key = (route, path.stat().st_size)
                made, mine = self._claim(key)
                if mine:
                    self._make(key, made, path.read_bytes)

    def _claim(self, key: tuple[str, int]) -> tuple[Future[bytes | None], bool]:
        """The copy of ``key``, and whether the caller is the one to make it."""
        with self._lock:
            made = self._made.get(key)
            if made is not None:
                self._made.move_to_end(key)
                return made, False
            made = self._made[key] = Future()
            return made, True

    def _make(self, key: tuple[str, int], made: Future[bytes | None], body: Callable[[], bytes]) -> None:
        try:
            compressed = _gzip(body())
        except BaseException as exc:  # handed to every waiting request; the next one tries again
            with self._lock:
                self._made.pop(key, None)
            made.set_exception(exc)
            return
        with self._lock:
            self._sizes[key] = len(compressed or b"")
            while sum(self._sizes.values()) > self._max_bytes and len(self._sizes) > 1:
                oldest = next(held for held in self._made if held in self._sizes and held != key)
                del self._made[oldest], self._sizes[oldest]
        made.set_result(compressed)


class StaticGzip:
    """ASGI middleware: the immutable files under ``prefixes`` (route paths), gzip-compressed once per
    file and process (see the module docstring for what it touches and what it promises)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        base_url: str = "",
        prefixes: Sequence[str] = ("/static/",),
        hashed: Sequence[str] = (),
        copies: GzipCopies | None = None,
    ) -> None:
        self.app = app
        self.base_url = base_url
        self.prefixes = tuple(prefixes)
        # Route path prefixes of files whose URLs carry a hash of their content although the inner
        # app serves them without "immutable" and compresses them again for every request it is
        # asked gzip for: asked without Accept-Encoding, compressed here once, and marked
        # immutable, so a browser keeps them without asking again.
        self.hashed = tuple(hashed)
        self.copies = GzipCopies() if copies is None else copies  # shared with the lifespan's prewarm

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope, self.base_url)
        hashed = path.startswith(self.hashed)  # False for no prefixes
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not (hashed or path.startswith(self.prefixes))
            or not canonical(path)
            or any(name == b"range" for name, _ in scope["headers"])
        ):
            await self.app(scope, receive, send)
            return
        wanted = accepts_gzip(header(scope["headers"], b"accept-encoding"))

        async def answer(start: Message, body: bytes) -> None:
            headers = without(start["headers"], b"content-length", b"vary")
            if hashed:
                headers = [*without(headers, b"cache-control"), (b"cache-control", IMMUTABLE)]
            vary = [value for name, value in start["headers"] if name == b"vary"]
            headers.append((b"vary", b", ".join([*vary, b"Accept-Encoding"])))
            if wanted:
                etag = dict(start["headers"]).get(b"etag", b"")
                compressed = await self.copies.copy(path, body)
                if compressed is not None:
                    body = compressed
                    # Streamlit's strong ETag and byte ranges describe the identity bytes, not these.
                    headers = without(headers, b"etag", b"accept-ranges")
                    if etag:
                        headers.append((b"etag", etag if etag.startswith(b"W/") else b"W/" + etag))
                    headers.append((b"content-encoding", b"gzip"))
            await send_whole(send, start, headers, body)

        if hashed:  # asked without Accept-Encoding, the inner app answers identity bytes, compressed here once
            inner = {**scope, "headers": without(scope["headers"], b"accept-encoding")}
            await self.app(inner, receive, held(send, functools.partial(compressible, immutable=True), answer))
        else:
            await self.app(scope, receive, held(send, compressible, answer))


def held(send: Send, wanted: Callable[[Message], bool], answer: Callable[[Message, bytes], Awaitable[None]]) -> Send:
    """A ``send`` that passes a response through unless ``wanted(start message)``; a wanted one is
    held until its body is complete and handed to ``answer(start, body)`` instead."""
    start: Message | None = None
    chunks: list[bytes] = []

    async def held(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start" and wanted(message):
            start = message
        elif start is not None and message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                await answer(start, b"".join(chunks))
        else:
            await send(message)

    return held


async def send_whole(send: Send, start: Message, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> str:
    return next((value.decode("latin-1") for key, value in headers if key == name), "").lower()


def without(headers: Sequence[tuple[bytes, bytes]], *names: bytes) -> list[tuple[bytes, bytes]]:
    return [(key, value) for key, value in headers if key not in names]


def compressible(start: Message, *, immutable: bool = False) -> bool:
    """A whole 200 answer of a text type that nothing has encoded yet, for a content-hashed file
    (``Cache-Control: immutable``, or ``immutable`` known by its path: one copy is valid for the
    life of the process)."""
    headers = dict(start["headers"])
    kind = headers.get(b"content-type", b"").decode("latin-1").lower()
    immutable = immutable or b"immutable" in headers.get(b"cache-control", b"").lower()
    return start["status"] == 200 and immutable and b"content-encoding" not in headers and kind.startswith(COMPRESSIBLE)
