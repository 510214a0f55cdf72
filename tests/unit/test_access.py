"""The access check (``dashboard.server.access``) as ASGI middleware, called with real ASGI scopes:
who gets through, what the refused see, and what a request carrying the token gets back."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from metrics_core.dashboard.clients.browser_sessions import BrowserSessions
from metrics_core.dashboard.clients.wrong_tokens import GuessLimit, client_key, guesser
from metrics_core.dashboard.server.access import (
    COOKIE_PREFIX,
    Access,
    AccessGuard,
    access_url,
    host_name,
    is_loopback,
    refuse_open_bind,
    server_token,
)
from tests.support import run_async
from tests.support.dashboard import Sent

TOKEN = "s3cret-token-of-the-server"
ACCESS = Access(token=TOKEN, loopback=True)
COOKIE = f"{COOKIE_PREFIX}8501"  # the cookie of a server listening on port 8501


def call(
    path: str,
    *,
    query: str = "",
    headers: dict[str, str] | None = None,
    kind: str = "http",
    method: str = "GET",
    access: Access = ACCESS,
    base_url: str = "",
    guard: AccessGuard | None = None,
    client: str = "127.0.0.1",
) -> tuple[list[dict], bool]:
    """Run ``AccessGuard`` (``guard``, else a new one of ``access``) on one request for ``path`` as
    sent (percent-encoded: the scope's ``path`` is it decoded, as uvicorn makes it): the messages it
    sent, and whether the app behind it ran."""
    reached = []

    async def app(scope: dict, receive: object, send: object) -> None:
        reached.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"run data"})

    sent = Sent()

    async def receive() -> dict:
        return {"type": "http.request"}

    all_headers = {"host": "127.0.0.1:8501", **(headers or {})}
    scope = {
        "type": kind,
        "method": method,
        "path": unquote(path),
        "raw_path": path.encode("latin-1"),
        "query_string": query.encode(),
        "headers": [(key.encode(), value.encode()) for key, value in all_headers.items()],
        "scheme": "http" if kind == "http" else "ws",
        "server": ("127.0.0.1", 8501),
        "client": (client, 50000),
    }
    guard = guard or AccessGuard(app, access=access, base_url=base_url)
    guard.app = app
    run_async(guard(scope, receive, sent))
    return sent, bool(reached)


def new_guard(access: Access = ACCESS, **state: object) -> AccessGuard:
    """A guard that keeps its sessions and wrong guesses across ``call``s (the app is ``call``'s)."""
    return AccessGuard(None, access=access, **state)


def status(sent: list[dict]) -> int | str:
    first = sent[0]
    return first["status"] if first["type"] == "http.response.start" else first["type"]


def header(sent: list[dict], name: bytes) -> str | None:
    return next((value.decode() for key, value in sent[0].get("headers", []) if key == name), None)


def test_a_request_without_the_token_sees_a_page_that_says_how_to_get_in_and_no_data() -> None:
    for path in ("/", "/run", "/api/csv", "/api/changes", "/_stcore/host-config", "/media/x.csv", "/component/a.js"):
        sent, reached = call(path, query="run=a")
        assert not reached and status(sent) == 403, path
        body = sent[1]["body"].decode()
        assert "needs its access token" in body and "?token=" in body and "run data" not in body


def test_a_wrong_token_anywhere_is_refused_and_named_as_wrong() -> None:
    for request in ({"query": "token=guess"}, {"headers": {"authorization": "Bearer guess"}},
                    {"headers": {"cookie": f"{COOKIE}=guess"}}):  # fmt: skip
        sent, reached = call("/api/csv", **request)
        assert not reached and status(sent) == 403
    sent, _ = call("/", query="token=guess")
    assert "not this server" in sent[1]["body"].decode()


def login(guard: AccessGuard) -> str:
    """Open the printed URL on ``guard``: the session value its cookie holds."""
    sent, _ = call("/", query=f"token={TOKEN}", guard=guard)
    name, _, rest = header(sent, b"set-cookie").partition("=")
    assert status(sent) == 303 and name == COOKIE
    return rest.partition(";")[0]


def test_the_cookie_of_another_port_does_not_open_this_server() -> None:
    guard = new_guard()
    session = login(guard)
    sent, reached = call("/", headers={"cookie": f"{COOKIE_PREFIX}8502={session}"}, guard=guard)
    assert not reached and status(sent) == 403


def test_static_files_and_the_health_check_stay_open() -> None:
    for path in ("/static/js/main.123.js", "/_stcore/health"):
        assert call(path)[1], path


def test_a_page_visit_with_the_token_is_redirected_without_it_and_gets_a_session_not_the_token() -> None:
    """The cookie holds a random value of this browser's, kept by the server, never the token: a
    page on another port of the host receives the cookie, and must not learn the token from it."""
    guard = new_guard()
    sent, reached = call("/run", query=f"run=a&token={TOKEN}&run=b%20c", guard=guard)
    assert not reached and status(sent) == 303
    assert header(sent, b"location") == "/run?run=a&run=b%20c"  # every other parameter kept, in order
    name, _, rest = header(sent, b"set-cookie").partition("=")
    session, _, attributes = rest.partition("; ")
    assert name == COOKIE and TOKEN not in rest and len(session) >= 40
    assert attributes == f"Path=/; Max-Age={7 * 24 * 3600}; HttpOnly; SameSite=Strict"
    assert call("/run", headers={"cookie": f"{COOKIE}={session}"}, guard=guard)[1]
    assert login(guard) != session  # each browser a session of its own


def test_the_session_cookie_alone_lets_a_browser_in_and_is_not_set_again() -> None:
    guard = new_guard()
    cookie = f"other=1; {COOKIE}={login(guard)}"
    sent, reached = call("/run", query="run=a", headers={"cookie": cookie}, guard=guard)
    assert reached and status(sent) == 200 and header(sent, b"set-cookie") is None
    assert call("/_stcore/stream", kind="websocket", headers={"cookie": cookie}, guard=guard)[1]


def test_a_session_of_an_earlier_server_or_the_token_itself_in_the_cookie_opens_nothing() -> None:
    """After a restart (a new guard) the browser's cookie names no session: refused, saying why."""
    session = login(new_guard())
    for value in (session, TOKEN):
        sent, reached = call("/run", headers={"cookie": f"{COOKIE}={value}"}, guard=new_guard())
        assert not reached and status(sent) == 403
    assert "session has ended" in sent[1]["body"].decode()


def test_a_bearer_header_lets_a_client_in_with_no_cookie() -> None:
    """A script or a proxy shows the token on every request: a cookie would hand every proxied
    browser a key around the proxy."""
    for headers in (
        {"authorization": f"Bearer {TOKEN}"},
        {"authorization": f"Bearer {TOKEN}", "cookie": f"{COOKIE}=x"},
    ):
        sent, reached = call("/api/csv", query="run=a", headers=headers)
        assert reached and status(sent) == 200 and header(sent, b"set-cookie") is None


@pytest.mark.parametrize("stale", ["stale-session", TOKEN, "x" * 200])
def test_a_stale_or_foreign_cookie_beside_the_right_token_is_replaced_with_the_redirect(stale: str) -> None:
    """A cookie of an earlier start, or one a page on another port set for this one, does not keep
    the owner out: the printed URL replaces it, and the token leaves the address bar."""
    guard = new_guard()
    sent, reached = call("/", query=f"token={TOKEN}", headers={"cookie": f"{COOKIE}={stale}"}, guard=guard)
    assert not reached and status(sent) == 303 and header(sent, b"location") == "/"
    session = header(sent, b"set-cookie").partition("=")[2].partition(";")[0]
    assert session != stale and call("/", headers={"cookie": f"{COOKIE}={session}"}, guard=guard)[1]


def test_a_live_session_with_a_token_in_the_address_is_redirected_without_it() -> None:
    guard = new_guard()
    session = login(guard)
    sent, reached = call(
        "/run", query="token=old-bookmark&run=a", headers={"cookie": f"{COOKIE}={session}"}, guard=guard
    )
    assert not reached and status(sent) == 303 and header(sent, b"location") == "/run?run=a"
    assert header(sent, b"set-cookie") is None  # its session stays


def test_every_http_answer_forbids_framing() -> None:
    """Let in, refused, redirected or open: no page on another port shows the dashboard in a frame."""
    guard = new_guard()
    answers = [
        call("/run", guard=guard),
        call("/run", query=f"token={TOKEN}", guard=guard),
        call("/run", headers={"authorization": f"Bearer {TOKEN}"}, guard=guard),
        call("/static/index.html", guard=guard),
        call("/", headers={"host": "evil.example"}, guard=guard),
        call("/", access=Access(token="", loopback=True)),
    ]
    for sent, _ in answers:
        assert header(sent, b"content-security-policy") == "frame-ancestors 'none'", sent[0]
        assert header(sent, b"x-frame-options") == "DENY", sent[0]


def test_a_foreign_host_is_refused_even_with_the_token_when_bound_to_loopback() -> None:
    for host in ("evil.example:8501", "127.0.0.1.nip.io:8501", "10.0.0.5:8501", ""):
        sent, reached = call("/_stcore/health", headers={"host": host, "authorization": f"Bearer {TOKEN}"})
        assert not reached and status(sent) == 403, host
    for host in ("localhost:8501", "127.0.0.2:8501", "[::1]:8501", "LOCALHOST"):
        assert call("/_stcore/health", headers={"host": host})[1], host
    beyond = Access(token=TOKEN, loopback=False)
    assert call("/_stcore/health", headers={"host": "head-node.cluster:8501"}, access=beyond)[1]


def test_the_websocket_needs_the_token_and_its_own_origin() -> None:
    guard = new_guard()
    own = {"origin": "http://127.0.0.1:8501", "cookie": f"{COOKIE}={login(guard)}"}
    assert call("/_stcore/stream", kind="websocket", headers=own, guard=guard)[1]
    for headers in ({**own, "origin": "http://evil.example"}, {**own, "origin": "http://127.0.0.1:9999"},
                    {"origin": "http://127.0.0.1:8501"}):  # fmt: skip
        sent, reached = call("/_stcore/stream", kind="websocket", headers=headers, guard=guard)
        assert not reached and sent == [{"type": "websocket.close", "code": 1008}], headers


def test_no_token_turns_the_token_off_but_not_the_host_check() -> None:
    open_access = Access(token="", loopback=True)
    assert call("/api/csv", access=open_access)[1]
    assert not call("/api/csv", access=open_access, headers={"host": "evil.example"})[1]


def test_paths_are_judged_below_the_base_url() -> None:
    assert call("/board/static/js/a.js", base_url="board")[1]
    assert not call("/board/run", base_url="board")[1]


def test_the_token_comes_from_the_environment_or_is_made_fresh() -> None:
    assert server_token({"METRICS_TOKEN": " abcdefghijklmnop "}) == "abcdefghijklmnop"
    assert server_token({"METRICS_TOKEN": "off"}) == ""  # access control off: only on purpose
    made = {server_token({}) for _ in range(3)}
    assert len(made) == 3 and all(len(token) >= 40 for token in made)


@pytest.mark.parametrize("value", ["", "  ", "abc", "fifteen-chars!!"])
def test_an_empty_or_short_token_refuses_to_start_naming_the_variable(value: str) -> None:
    """``METRICS_TOKEN=$(cat ~/.metrics_token)`` with the file missing is empty: not "no token"."""
    with pytest.raises(SystemExit) as refused:
        server_token({"METRICS_TOKEN": value})
    said = str(refused.value)
    assert said.startswith("METRICS_TOKEN ") and "16 characters" in said and "METRICS_TOKEN=off" in said
    assert "\n" not in said and (not value.strip() or value.strip() not in said)  # the secret is not echoed


def test_listening_beyond_loopback_without_a_token_is_refused_in_one_line() -> None:
    assert refuse_open_bind("127.0.0.1", "") is None and refuse_open_bind("0.0.0.0", "t") is None
    for address in ("0.0.0.0", "", "head-node"):
        said = refuse_open_bind(address, "")
        assert said is not None and "\n" not in said and "METRICS_TOKEN=off" in said


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1", "http://127.0.0.1:8501/board/?token=a%2Bb"),
        ("0.0.0.0", "http://127.0.0.1:8501/board/?token=a%2Bb"),
        ("head-node", "http://head-node:8501/board/?token=a%2Bb"),
        ("fe80::1", "http://[fe80::1]:8501/board/?token=a%2Bb"),
    ],
)
def test_the_printed_url_opens_the_dashboard(address: str, expected: str) -> None:
    assert access_url(address, 8501, "/board/", "a+b") == expected


def test_loopback_names_and_addresses() -> None:
    assert all(map(is_loopback, ("localhost", "127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost.")))
    assert not any(map(is_loopback, ("evil.example", "10.0.0.1", "localhost.evil.example", "0.0.0.0")))
    assert host_name("[::1]:8501") == "::1" and host_name("localhost:8501") == "localhost" and host_name("::1") == "::1"


def test_the_refusal_offers_the_same_page_again_as_data_not_markup() -> None:
    """A link from another site does not carry the SameSite=Strict cookie; the same link from the
    refusal page does.  The path and query it repeats are escaped."""
    sent, _ = call("/run", query='run=<script>alert(1)</script>&x="', headers={"accept": "text/html,*/*"})
    body = sent[1]["body"].decode()
    assert 'href="/run?run=&lt;script&gt;alert(1)&lt;/script&gt;&amp;x=&quot;"' in body and "<script>" not in body


OFF_SITE = ["//evil.example/login", "/%2F%2Fevil.example/x", "/\\evil.example/x", "/%5C%5cevil.example/x",
            "///\\/%2f%5C/evil.example/x", "/%09/evil.example/x", "/\t/evil.example/x"]  # fmt: skip


def same_origin(link: str) -> bool:
    """Whether a browser reads ``link`` as a path of the page's own origin: a path, with no second
    ``/`` or ``\\`` at its start once tabs and newlines are dropped, nor any of them encoded there."""
    cleaned = link.replace("\t", "").replace("\n", "").replace("\r", "")
    return cleaned.startswith("/") and cleaned[1:2] not in ("/", "\\") and cleaned[1:4].upper() not in ("%2F", "%5C")


@pytest.mark.parametrize("path", OFF_SITE)
def test_the_redirect_without_the_token_stays_on_this_origin(path: str) -> None:
    sent, _ = call(path, query=f"token={TOKEN}&a=1")
    location = header(sent, b"location")
    assert status(sent) == 303 and same_origin(location) and "evil.example/" in location and location.endswith("?a=1")


@pytest.mark.parametrize("path", OFF_SITE)
def test_the_refusals_link_to_the_page_again_stays_on_this_origin(path: str) -> None:
    sent, _ = call(path, headers={"accept": "text/html"})
    body = sent[1]["body"].decode()
    link = body.split('<a href="', 1)[1].split('"', 1)[0]
    assert same_origin(link) and "evil.example/" in link, link


def test_wrong_tokens_make_their_client_wait_longer_each_time_and_the_right_one_stays_free() -> None:
    """Five wrong tokens are refused at once; from the sixth, the client waits 1 s, then 2, 4 ...
    before its next token is checked, and one sent meanwhile is answered 429 with the time left,
    unchecked (right or wrong).  Every loopback address is one client; another address and a
    browser with its session cookie never wait."""
    now = [0.0]
    guard = new_guard(Access(token=TOKEN, loopback=False), guesses=GuessLimit(clock=lambda: now[0]))
    session = login(guard)
    for n in range(5):
        assert status(call("/", query="token=guess", guard=guard, client=f"127.0.0.{n + 1}")[0]) == 403
    for wait in (1, 2, 4, 8):
        assert status(call("/", query="token=guess", guard=guard, client="::1")[0]) == 403  # checked: wrong
        for token in (TOKEN, "guess"):
            sent, reached = call("/", headers={"authorization": f"Bearer {token}"}, guard=guard, client="127.9.9.9")
            assert not reached and status(sent) == 429 and header(sent, b"retry-after") == str(wait)
        assert call("/", headers={"authorization": f"Bearer {TOKEN}"}, guard=guard, client="10.1.2.3")[1]
        assert call("/", headers={"cookie": f"{COOKIE}={session}"}, guard=guard)[1]
        now[0] += wait
    assert call("/", headers={"authorization": f"Bearer {TOKEN}"}, guard=guard)[1]  # its wait over
    sent, _ = call("/_stcore/stream", kind="websocket", query="token=guess", guard=guard)
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert call("/_stcore/stream", kind="websocket", query=f"token={TOKEN}", guard=guard)[1] is False  # waits 16 s


def test_the_clients_remembered_are_bounded_and_forgotten() -> None:
    now = [0.0]
    guesses = GuessLimit(limit=3, forget=600, clock=lambda: now[0])
    for n in range(10):
        for _ in range(6):
            guesses.wrong(f"10.0.0.{n}")
    assert len(guesses) == 3 and guesses.wait("10.0.0.9") == 1.0 and guesses.wait("10.0.0.0") == 0.0
    now[0] += 1 + 600
    assert guesses.wait("10.0.0.9") == 0.0 and len(guesses) == 2
    assert {client_key(a) for a in ("127.0.0.1", "127.200.0.1", "::1", "::ffff:127.0.0.1")} == {"loopback"}
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff") != client_key("2001:db8:0:1::1")
    forwarded = {guesser((address, 0), ("127.0.0.1", 8501)) for address in ("10.0.0.1", "10.0.0.2", "::1")}
    assert forwarded == {"forwarded"}  # port 0: uvicorn took the address from X-Forwarded-For, as sent


def test_sessions_are_bounded_oldest_dropped_first_and_expire() -> None:
    now = [0.0]
    sessions = BrowserSessions(lifetime=100, limit=3, clock=lambda: now[0])
    made = [sessions.new() for _ in range(5)]
    assert len(sessions) == 3 and [sessions.valid(value) for value in made] == [False, False, True, True, True]
    now[0] += 100
    assert not any(sessions.valid(value) for value in made) and len(sessions) == 0
    assert not sessions.valid(None) and not sessions.valid("")
