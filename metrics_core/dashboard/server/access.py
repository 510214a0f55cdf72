"""Who may use the dashboard: a token by default, and Host and Origin checks, as ASGI middleware.

A head node is shared: a server on 127.0.0.1 keeps out the network, not the other users of the
node.  So, as Jupyter does, the server makes a random token at start (or takes ``METRICS_TOKEN``)
and prints the URL that carries it; a request carrying the token (``?token=…`` or an
``Authorization: Bearer …`` header) gets an HttpOnly, SameSite=Strict cookie, and from then on the
browser is let in by the cookie alone.  Every page, the websocket, every route of the server's own
and anything else that can show run data refuses a request without one of the three, with a short
page that says how to get in.  What holds no data stays open: Streamlit's static bundle (the same
bytes every installation serves) and its health check.  ``METRICS_TOKEN=''`` turns the token off,
for a deployment behind an authenticating proxy; binding beyond loopback without a token is
refused (``refuse_open_bind``).

Two checks stand whatever the token says:

* **Host** (DNS rebinding): on a server bound to loopback, a request whose ``Host`` is not a
  loopback name or address is refused: a page on ``evil.example`` rebound to 127.0.0.1 would
  otherwise read the routes as same-origin.
* **Origin** on the websocket: a browser page of another origin cannot open the dashboard's
  websocket, whatever cookies the browser holds.

The cookie is named after the port the server listens on (``metrics_token_8501``, read off each
connection: Streamlit may move to the next free port at start), so two dashboards of one user on
one host keep a cookie each.  The check is a few dictionary and string operations per
request, no I/O.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from urllib.parse import parse_qsl, unquote_plus, urlencode

from metrics_core.dashboard.server.asgi_gzip import ASGIApp, Receive, Scope, Send, route_path

TOKEN_VARIABLE = "METRICS_TOKEN"
COOKIE_PREFIX = "metrics_token_"
OPEN_PREFIXES = ("/static/",)  # Streamlit's frontend bundle: the same files in every installation
OPEN_PATHS = frozenset({"/_stcore/health", "/favicon.ico"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})

REFUSED_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Training metrics: token needed</title>
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:40em;margin:4em auto;padding:0 1em;color:#222}}
code{{background:#f3f3f3;padding:0 .3em}}</style></head><body>
<h1>This dashboard needs its access token</h1>
<p>{reason}</p>
<p>Open the address the server printed when it started: it ends in <code>?token=…</code>.
The browser keeps the token in a cookie, so you need it once per browser.
If someone else started this dashboard, ask them for the address.</p>{again}
</body></html>
"""
# A link followed from another site does not carry a SameSite=Strict cookie; the same link opened
# from this page does.
AGAIN = """
<p>Opened this dashboard in this browser before? A link from another site (a chat, a mail) does not
carry its cookie: <a href="{url}">open this page again</a>.</p>"""


def server_token(environ: Mapping[str, str]) -> str:
    """The token this server asks for: ``METRICS_TOKEN`` when it is set (``''``: no token, access
    control off), else a new random one (32 bytes, URL-safe)."""
    if TOKEN_VARIABLE in environ:
        return environ[TOKEN_VARIABLE].strip()
    return secrets.token_urlsafe(32)


@functools.lru_cache(maxsize=64)  # a browser sends the same Host every time; bounded whatever is sent
def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    host = host.strip().lower().rstrip(".")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """The name or address of a ``Host`` header value, without its port (``[::1]:8501`` -> ``::1``)."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def refuse_open_bind(address: str, token: str) -> str | None:
    """Why a server bound to ``address`` with ``token`` must not start, or None: listening beyond
    loopback (``--host``, ``server.address``; an empty address is every interface) with access
    control off would hand every run to the network."""
    if token or (address and is_loopback(address)):
        return None
    where = address or "every interface"
    return (
        f"refusing to listen on {where} with access control off ({TOKEN_VARIABLE}=''): "
        f"set {TOKEN_VARIABLE} to a secret, or listen on 127.0.0.1 and tunnel with ssh -L"
    )


def access_url(address: str, port: int, base_url: str, token: str) -> str:
    """The URL to open, printed at start: loopback when the server listens there or everywhere."""
    host = "127.0.0.1" if not address or address in ("0.0.0.0", "::") or is_loopback(address) else address
    if ":" in host:
        host = f"[{host}]"
    base = "/" + base_url.strip("/") if base_url.strip("/") else ""
    query = f"?{urlencode({'token': token})}" if token else ""
    return f"http://{host}:{port}{base}/{query}"


@dataclass(frozen=True)
class Access:
    """What ``AccessGuard`` enforces: ``token`` (``''``: none), and whether the server listens on
    loopback only (then ``Host`` must name loopback)."""

    token: str
    loopback: bool

    def host_allowed(self, host: str) -> bool:
        """A request's ``Host`` value: any when listening beyond loopback, else loopback names only."""
        return not self.loopback or is_loopback(host_name(host))

    def carries_token(self, headers: Mapping[str, str], query: Mapping[str, str], cookie: str) -> bool:
        """Whether a request proves it knows the token: the cookie named ``cookie``, a Bearer header
        or ``?token=``."""
        if not self.token:
            return True
        offered = (
            _cookie(headers.get("cookie", ""), cookie),
            _bearer(headers.get("authorization", "")),
            query.get("token"),
        )
        return any(value is not None and _same(value, self.token) for value in offered)


def cookie_name(scope: Scope) -> str:
    """The token's cookie for the port a request came in on (the listening socket's)."""
    server = scope.get("server") or ("", 0)
    return f"{COOKIE_PREFIX}{server[1]}"


def _same(offered: str, token: str) -> bool:
    return hmac.compare_digest(offered.encode(errors="replace"), token.encode())


def _cookie(header: str, name: str) -> str | None:
    for item in header.split(";"):
        key, sep, value = item.strip().partition("=")
        if sep and key == name:
            return value.strip('"')
    return None


def _bearer(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _headers(scope: Scope) -> dict[str, str]:
    """A request's headers, lower-case names; a repeated header keeps its first value."""
    headers: dict[str, str] = {}
    for key, value in scope.get("headers", ()):
        headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
    return headers


class AccessGuard:
    """ASGI middleware: refuses what ``Access`` does not allow (module docstring); lets the rest
    through, setting the token's cookie on an answer to a request that carried the token another
    way.  A page visit with ``?token=`` is redirected to the same URL without it, so the token
    does not stay in the address bar, the history or a link copied from it."""

    def __init__(self, app: ASGIApp, *, access: Access, base_url: str = "") -> None:
        self.app = app
        self.access = access
        self.base_url = base_url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if not self.access.host_allowed(headers.get("host", "")):
            await self._refuse(scope, send, "This server answers only to addresses of this machine (its Host check).")
            return
        if kind == "websocket" and not _same_origin(headers):
            await send({"type": "websocket.close", "code": 1008})
            return
        path = route_path(scope, self.base_url)
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        raw_query = scope.get("query_string", b"").decode("latin-1")
        pairs = parse_qsl(raw_query, keep_blank_values=True) if "token" in raw_query else ()
        query = {key: value for key, value in pairs if key == "token"}
        cookie = cookie_name(scope)
        if not self.access.carries_token(headers, query, cookie):
            if query:
                await self._refuse(scope, send, "The token it was given is not this server's.")
            else:
                here = scope.get("root_path", "") + scope.get("path", "/") + (f"?{raw_query}" if raw_query else "")
                navigation = "text/html" in headers.get("accept", "")  # a browser opening a page
                await self._refuse(scope, send, "No token came with it.", again=here if navigation else "")
            return
        if not self.access.token or _cookie(headers.get("cookie", ""), cookie) is not None:
            await self.app(scope, receive, send)  # the cookie is there (and right): nothing to add
            return
        if kind == "http" and scope.get("method") == "GET" and query:
            await self._redirect_without_token(scope, send, raw_query)
            return
        await self.app(scope, receive, self._with_cookie(scope, send))

    def _set_cookie(self, scope: Scope) -> tuple[bytes, bytes]:
        secure = "; Secure" if scope.get("scheme") in ("https", "wss") else ""
        value = f"{cookie_name(scope)}={self.access.token}; Path=/; HttpOnly; SameSite=Strict{secure}"
        return b"set-cookie", value.encode("latin-1")

    def _with_cookie(self, scope: Scope, send: Send) -> Send:
        cookie = self._set_cookie(scope)

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), cookie]}
            await send(message)

        return sending

    async def _redirect_without_token(self, scope: Scope, send: Send, raw_query: str) -> None:
        rest = "&".join(item for item in raw_query.split("&") if unquote_plus(item.partition("=")[0]) != "token")
        location = scope.get("root_path", "") + scope.get("path", "/") + (f"?{rest}" if rest else "")
        headers = [(b"location", location.encode("latin-1", errors="replace")), self._set_cookie(scope)]
        await send({"type": "http.response.start", "status": 303, "headers": [*headers, (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(self, scope: Scope, send: Send, reason: str, again: str = "") -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        link = AGAIN.format(url=escape(again)) if again and scope.get("method") == "GET" else ""
        body = REFUSED_PAGE.format(reason=escape(reason), again=link).encode()
        headers = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _same_origin(headers: Mapping[str, str]) -> bool:
    """A websocket's ``Origin`` names the server it connects to (``Host``); a client that sends no
    ``Origin`` is not a browser page, and the token decides for it."""
    origin = headers.get("origin")
    if origin is None:
        return True
    scheme, sep, rest = origin.partition("://")
    return bool(sep) and scheme in ("http", "https") and rest.lower() == headers.get("host", "").lower()
