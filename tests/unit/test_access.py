"""The access check (``dashboard.server.access``) as ASGI middleware, called with real ASGI scopes:
who gets through, what the refused see, and what a request carrying the token gets back."""

from __future__ import annotations

import pytest

from metrics_core.dashboard.server.access import (
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

TOKEN = "s3cret-token"
ACCESS = Access(token=TOKEN, loopback=True)


def call(
    path: str,
    *,
    query: str = "",
    headers: dict[str, str] | None = None,
    kind: str = "http",
    method: str = "GET",
    access: Access = ACCESS,
    base_url: str = "",
) -> tuple[list[dict], bool]:
    """Run ``AccessGuard`` on one request: the messages it sent, and whether the app behind it ran."""
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
        "path": path,
        "query_string": query.encode(),
        "headers": [(key.encode(), value.encode()) for key, value in all_headers.items()],
        "scheme": "http" if kind == "http" else "ws",
        "server": ("127.0.0.1", 8501),
    }
    run_async(AccessGuard(app, access=access, base_url=base_url)(scope, receive, sent))
    return sent, bool(reached)


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
                    {"headers": {"cookie": "metrics_token_8501=guess"}}):  # fmt: skip
        sent, reached = call("/api/csv", **request)
        assert not reached and status(sent) == 403
    sent, _ = call("/", query="token=guess")
    assert "not this server" in sent[1]["body"].decode()


def test_the_cookie_of_another_port_does_not_open_this_server() -> None:
    sent, reached = call("/", headers={"cookie": f"metrics_token_8502={TOKEN}"})
    assert not reached and status(sent) == 403


def test_static_files_and_the_health_check_stay_open() -> None:
    for path in ("/static/js/main.123.js", "/_stcore/health"):
        assert call(path)[1], path


def test_a_page_visit_with_the_token_is_redirected_without_it_and_gets_the_cookie() -> None:
    sent, reached = call("/run", query="run=a&token=s3cret-token&run=b%20c")
    assert not reached and status(sent) == 303
    assert header(sent, b"location") == "/run?run=a&run=b%20c"  # every other parameter kept, in order
    cookie = header(sent, b"set-cookie")
    assert cookie == "metrics_token_8501=s3cret-token; Path=/; HttpOnly; SameSite=Strict"


def test_the_cookie_alone_lets_a_browser_in_and_is_not_set_again() -> None:
    sent, reached = call("/run", query="run=a", headers={"cookie": f"other=1; metrics_token_8501={TOKEN}"})
    assert reached and status(sent) == 200 and header(sent, b"set-cookie") is None


def test_a_bearer_header_lets_a_client_in_and_hands_it_the_cookie() -> None:
    sent, reached = call("/api/csv", query="run=a", headers={"authorization": f"Bearer {TOKEN}"})
    assert reached and status(sent) == 200
    assert header(sent, b"set-cookie").startswith("metrics_token_8501=s3cret-token;")


def test_a_foreign_host_is_refused_even_with_the_token_when_bound_to_loopback() -> None:
    for host in ("evil.example:8501", "127.0.0.1.nip.io:8501", "10.0.0.5:8501", ""):
        sent, reached = call("/_stcore/health", headers={"host": host, "authorization": f"Bearer {TOKEN}"})
        assert not reached and status(sent) == 403, host
    for host in ("localhost:8501", "127.0.0.2:8501", "[::1]:8501", "LOCALHOST"):
        assert call("/_stcore/health", headers={"host": host})[1], host
    beyond = Access(token=TOKEN, loopback=False)
    assert call("/_stcore/health", headers={"host": "head-node.cluster:8501"}, access=beyond)[1]


def test_the_websocket_needs_the_token_and_its_own_origin() -> None:
    own = {"origin": "http://127.0.0.1:8501", "cookie": f"metrics_token_8501={TOKEN}"}
    assert call("/_stcore/stream", kind="websocket", headers=own)[1]
    for headers in ({**own, "origin": "http://evil.example"}, {**own, "origin": "http://127.0.0.1:9999"},
                    {"origin": "http://127.0.0.1:8501"}):  # fmt: skip
        sent, reached = call("/_stcore/stream", kind="websocket", headers=headers)
        assert not reached and sent == [{"type": "websocket.close", "code": 1008}], headers


def test_no_token_turns_the_token_off_but_not_the_host_check() -> None:
    open_access = Access(token="", loopback=True)
    assert call("/api/csv", access=open_access)[1]
    assert not call("/api/csv", access=open_access, headers={"host": "evil.example"})[1]


def test_paths_are_judged_below_the_base_url() -> None:
    assert call("/board/static/js/a.js", base_url="board")[1]
    assert not call("/board/run", base_url="board")[1]


def test_the_token_comes_from_the_environment_or_is_made_fresh() -> None:
    assert server_token({"METRICS_TOKEN": " abc "}) == "abc"
    assert server_token({"METRICS_TOKEN": ""}) == ""
    made = {server_token({}) for _ in range(3)}
    assert len(made) == 3 and all(len(token) >= 40 for token in made)


def test_listening_beyond_loopback_without_a_token_is_refused_in_one_line() -> None:
    assert refuse_open_bind("127.0.0.1", "") is None and refuse_open_bind("0.0.0.0", "t") is None
    for address in ("0.0.0.0", "", "head-node"):
        said = refuse_open_bind(address, "")
        assert said is not None and "\n" not in said and "METRICS_TOKEN" in said


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
