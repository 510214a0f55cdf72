"""Who may use the dashboard: a token by default, and Host and Origin checks, as ASGI middleware.

A head node is shared: a server on 127.0.0.1 keeps out the network, not the other users of the
node.  So, as Jupyter does, the server makes a random token at start (or takes ``METRICS_TOKEN``,
16 characters at least) and prints the URL that carries it; a browser that opens it (``?token=…``)
is redirected to the same page without the token and gets a cookie holding a session of its own
(``BrowserSessions``), never the token.  A client that sends ``Authorization: Bearer …`` (a
script, an authenticating proxy) shows the token on every request and gets no cookie.  Every
page, the websocket, every route of the server's own and anything else that can show run data
refuses a request without a session or the token, with a short page that says how to get in.
What holds no data stays open: Streamlit's static bundle (the same bytes every installation
serves) and its health check.  ``METRICS_TOKEN=off`` turns the token off, for a deployment behind
an authenticating proxy; an empty or short ``METRICS_TOKEN`` (``$(cat file)`` of a missing file)
refuses to start (``server_token``), as does binding beyond loopback with no token
(``refuse_open_bind``).  A client that sent wrong tokens waits before its next one is checked
(``clients.wrong_tokens``); on loopback a client is a user of this host, not an address, so
another user's guesses never make the owner wait.

What stands whatever the token says:

* **Host** (DNS rebinding): on a server bound to loopback, a request whose ``Host`` is not a
  loopback name or address is refused: a page on ``evil.example`` rebound to 127.0.0.1 would
  otherwise read the routes as same-origin.
* **Origin** on the websocket: a browser page of another origin cannot open the dashboard's
  websocket, whatever cookies the browser holds.
* **No framing**: every answer says ``Content-Security-Policy: frame-ancestors 'none'`` (and
  ``X-Frame-Options: DENY``), so a page on another port cannot show the dashboard under its own.
* **Same-origin links**: the redirect and the refusal page's link repeat the request's path with
  its leading slashes and backslashes (also percent-encoded) collapsed into one
  (``same_origin_path``): ``//evil.example/x`` is a link to another host, ``/evil.example/x`` is not.

The cookie (HttpOnly, SameSite=Strict) is named after the port the server listens on
(``metrics_session_8501``, read off each connection: Streamlit may move to the next free port at
start), so two dashboards of one user on one host keep a cookie each.  The check is a few
dictionary and string operations per request; its one I/O, asking the kernel whom a loopback
client is, comes only with a token and no session, while some client waits or when the token is
wrong.  Its state is used from the server's event loop only.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from urllib.parse import parse_qsl, quote, unquote_plus, urlencode

from metrics_core.dashboard.clients.browser_sessions import BrowserSessions
from metrics_core.dashboard.clients.wrong_tokens import GuessLimit, guesser
from metrics_core.dashboard.server.asgi_gzip import ASGIApp, Receive, Scope, Send, route_path

TOKEN_VARIABLE = "METRICS_TOKEN"
TOKEN_OFF = "off"
SHORTEST_TOKEN = 16
COOKIE_PREFIX = "metrics_session_"
NO_FRAMING = [(b"content-security-policy", b"frame-ancestors 'none'"), (b"x-frame-options", b"DENY")]
_LEADING_SLASHES = re.compile(r"\A(?:/|%2[fF]|%5[cC])+")  # after ``_visible``: a backslash is %5C
OPEN_PREFIXES = ("/static/",)  # Streamlit's frontend bundle: the same files in every installation
OPEN_PATHS = frozenset({"/_stcore/health", "/favicon.ico"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})

REFUSED_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Training metrics: token needed</title>
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:40em;margin:4em auto;padding:0 1em;color:#222}}
code{{background:#f3f3f3;padding:0 .3em}}</style></head><body>
<h1>This dashboard needs its access token</h1>
<p>{reason}</p>
<p>Open the address the server printed when it started: it ends in <code>?token=…</code>.
The browser then keeps a session cookie for this server, so you need it once per browser, until
the server restarts or a week has passed.
If someone else started this dashboard, ask them for the address.</p>{again}
</body></html>
"""
# A link followed from another site does not carry a SameSite=Strict cookie; the same link opened
# from this page does.
AGAIN = """
<p>Opened this dashboard in this browser before? A link from another site (a chat, a mail) does not
carry its cookie: <a href="{url}">open this page again</a>.</p>"""


def server_token(environ: Mapping[str, str]) -> str:
    """The token this server asks for: ``METRICS_TOKEN`` when it is set (``off``: ``''``, no token,
    access control off), else a new random one (32 bytes, URL-safe).  ``SystemExit`` naming the
    variable when it is set but empty or shorter than ``SHORTEST_TOKEN``: ``$(cat file)`` of a
    missing file must not turn access control off, nor a guessable token turn it on."""
    if TOKEN_VARIABLE not in environ:
        return secrets.token_urlsafe(32)
    token = environ[TOKEN_VARIABLE].strip()
    if token == TOKEN_OFF:
        return ""
    if len(token) < SHORTEST_TOKEN:
        said = "is empty" if not token else f"has {len(token)} characters"
        raise SystemExit(
            f"{TOKEN_VARIABLE} {said}: set it to a secret of {SHORTEST_TOKEN} characters or more "
            f'(python -c "import secrets; print(secrets.token_urlsafe(32))"), leave it unset for a new one '
            f"at each start, or set {TOKEN_VARIABLE}={TOKEN_OFF} to turn access control off"
        )
    return token


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
        f"refusing to listen on {where} with access control off ({TOKEN_VARIABLE}={TOKEN_OFF}): "
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

    def right_token(self, offered: str) -> bool:
        """Whether ``offered`` is the token (compared in constant time)."""
        return hmac.compare_digest(offered.encode(errors="replace"), self.token.encode())


def same_origin_path(path: str, query: str = "") -> str:
    """``path`` (as sent: percent-encoded) and ``query`` as a link that can only lead to this origin:
    the path's leading ``/`` and ``\\`` (also ``%2F``, ``%5C``) collapsed into one ``/`` (a browser
    reads ``//host`` and ``/\\host`` as another host), and every character that is not visible ASCII,
    or is a backslash, percent-encoded (a browser drops tabs and newlines from a URL)."""
    path = "/" + _LEADING_SLASHES.sub("", _visible(path))
    return path + (f"?{_visible(query)}" if query else "")


def _visible(text: str) -> str:
    """``text`` (one character a byte) with every byte that is not visible ASCII, and ``\\``, percent-encoded."""
    return "".join(c if "!" <= c <= "~" and c != "\\" else f"%{ord(c) & 0xFF:02X}" for c in text)


def cookie_name(scope: Scope) -> str:
    """The session cookie's name for the port a request came in on (the listening socket's)."""
    server = scope.get("server") or ("", 0)
    return f"{COOKIE_PREFIX}{server[1]}"


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
    through, adding ``NO_FRAMING`` to every HTTP answer.  A page visit with ``?token=`` is
    redirected to the same URL without it, so the token does not stay in the address bar, the
    history or a link copied from it; with the right token, the redirect sets a new session's
    cookie unless the browser's cookie already holds a live one (a stale one is replaced)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        access: Access,
        base_url: str = "",
        sessions: BrowserSessions | None = None,
        guesses: GuessLimit | None = None,
    ) -> None:
        self.app = app
        self.access = access
        self.base_url = base_url
        self.sessions = BrowserSessions() if sessions is None else sessions
        self.guesses = GuessLimit() if guesses is None else guesses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if kind == "http":
            send = _adding(send, NO_FRAMING)
        headers = _headers(scope)
        if not self.access.host_allowed(headers.get("host", "")):
            await self._refuse(scope, send, "This server answers only to addresses of this machine (its Host check).")
            return
        if kind == "websocket" and not _same_origin(headers):
            await send({"type": "websocket.close", "code": 1008})
            return
        path = route_path(scope, self.base_url)
        if not self.access.token or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        raw_query = scope.get("query_string", b"").decode("latin-1")
        pairs = parse_qsl(raw_query, keep_blank_values=True) if "token" in raw_query else ()
        query_token = next((value for key, value in pairs if key == "token"), None)
        page_visit = kind == "http" and scope.get("method") == "GET" and query_token is not None
        cookie = _cookie(headers.get("cookie", ""), cookie_name(scope))
        if self.sessions.valid(cookie):
            if page_visit:  # in already: only the token leaves the address bar
                await self._redirect_without_token(scope, send, raw_query, set_cookie=None)
            else:
                await self.app(scope, receive, send)
            return
        offered = query_token if query_token is not None else _bearer(headers.get("authorization", ""))
        if offered is None:
            reason = "Its session has ended (the server restarted, or a week passed)." if cookie else ""
            navigation = "text/html" in headers.get("accept", "")  # a browser opening a page
            again = _request_path(scope, raw_query) if navigation else ""
            await self._refuse(scope, send, reason or "No token came with it.", again=again)
            return
        # Who sent it, found only when a wait or a wrong token needs it (for a loopback client, the
        # kernel is asked): a page with its session never asks.
        client = guesser(scope.get("client"), scope.get("server")) if self.guesses.anyone_waits() else None
        wait = 0.0 if client is None else self.guesses.wait(client)
        if wait:  # not checked: an answer now would tell a right guess from the others
            retry = str(math.ceil(wait))
            said = f"Too many wrong tokens came from this client: the next one is checked in {retry} s."
            await self._refuse(scope, send, said, status=429, extra=[(b"retry-after", retry.encode())])
            return
        if not self.access.right_token(offered):
            self.guesses.wrong(guesser(scope.get("client"), scope.get("server")) if client is None else client)
            await self._refuse(scope, send, "The token it was given is not this server's.")
            return
        if query_token is None or kind == "websocket":  # Bearer: shown on every request, no cookie
            await self.app(scope, receive, send)
        elif page_visit:
            await self._redirect_without_token(scope, send, raw_query, set_cookie=self._set_cookie(scope))
        else:
            await self.app(scope, receive, _adding(send, [self._set_cookie(scope)]))

    def _set_cookie(self, scope: Scope) -> tuple[bytes, bytes]:
        """A new session, as the ``Set-Cookie`` header that hands it to the browser."""
        secure = "; Secure" if scope.get("scheme") in ("https", "wss") else ""
        lifetime = int(self.sessions.lifetime)
        value = (
            f"{cookie_name(scope)}={self.sessions.new()}; Path=/; Max-Age={lifetime}; HttpOnly; SameSite=Strict{secure}"
        )
        return b"set-cookie", value.encode("latin-1")

    async def _redirect_without_token(
        self, scope: Scope, send: Send, raw_query: str, *, set_cookie: tuple[bytes, bytes] | None
    ) -> None:
        rest = "&".join(item for item in raw_query.split("&") if unquote_plus(item.partition("=")[0]) != "token")
        location = _request_path(scope, rest)
        headers = [(b"location", location.encode("latin-1")), *([set_cookie] if set_cookie else [])]
        await send({"type": "http.response.start", "status": 303, "headers": [*headers, (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(
        self,
        scope: Scope,
        send: Send,
        reason: str,
        again: str = "",
        *,
        status: int = 403,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        link = AGAIN.format(url=escape(again)) if again and scope.get("method") == "GET" else ""
        body = REFUSED_PAGE.format(reason=escape(reason), again=link).encode()
        headers = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            *(extra or []),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _request_path(scope: Scope, query: str) -> str:
    """The path a request asked for (as sent, under the server's root path) with ``query``, as a
    same-origin link (``same_origin_path``)."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(scope.get("path", "/"))
    return same_origin_path(scope.get("root_path", "") + path, query)


def _adding(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    """``send`` with ``headers`` added to the answer's start."""

    async def sending(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *headers]}
        await send(message)

    return sending


def _same_origin(headers: Mapping[str, str]) -> bool:
    """A websocket's ``Origin`` names the server it connects to (``Host``); a client that sends no
    ``Origin`` is not a browser page, and the token decides for it."""
    origin = headers.get("origin")
    if origin is None:
        return True
    scheme, sep, rest = origin.partition("://")
    return bool(sep) and scheme in ("http", "https") and rest.lower() == headers.get("host", "").lower()
