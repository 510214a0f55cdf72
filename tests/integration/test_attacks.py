"""What one client on the same machine can make a served dashboard do with plain GETs to its
routes: without the token, with a wrong one or through a foreign Host it sees no run data, and no
websocket opens from another origin; no redirect or link leaves the origin, no answer can be framed,
and the cookie a browser gets is never the token; with it, no request stalls the server, requests
for runs that are not there cost next to nothing, and what a request names (a static file's
spelling, chart options) keeps no memory per name.  A server given an empty or short token does not
start.

A request goes through ``get`` (status and body), ``http_get`` (its headers too) or ``raw_get`` (a
target exactly as written, no redirect followed).
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from urllib.parse import urlencode, urljoin, urlsplit

import psutil
import pytest

from metrics_core.dashboard.live.push import options_query
from metrics_core.dashboard.views.chart_specs import SMOOTHING_STEP, ChartOptions
from metrics_core.testing.live_server import ACCESS_TOKEN, REPO, free_port, http_get, streamlit_server
from tests.support import append_records, base_record, run_async

CATASTROPHIC = "(.|.|.|.)*!"  # a regular expression that backtracks for ever on any chart title
BIG_RUN_RECORDS = 20_000  # records of the run whose figures each option set builds


def get(url: str, *, timeout: float = 30.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """GET ``url`` as the owner (the server's token: ``http_get``): its status and body, an error
    status included.  An attack by the owner is the hardest case: a stranger is refused first."""
    status, _, body = http_get(url, headers=headers or {}, timeout=timeout)
    return status, body


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, psutil.Process]]:
    """A dashboard serving a root with one run of ``BIG_RUN_RECORDS`` records: its URL and process."""
    root = tmp_path_factory.mktemp("runs")
    append_records(
        root / "big" / "metrics.jsonl",
        *(base_record(step, train_loss=1.0 + 1.0 / step, lr=3e-4) for step in range(1, BIG_RUN_RECORDS + 1)),
    )
    with streamlit_server(root, refresh=0.5) as url:  # the dashboard's default refresh period
        port = url.rsplit(":", 1)[1]
        (process,) = [
            found
            for found in psutil.process_iter(["cmdline"])
            if "streamlit" in (found.info["cmdline"] or []) and port in (found.info["cmdline"] or [])
        ]
        settle(process)  # its start's work (imports, the first loads' gzip copies) done
        yield url, process


def settle(process: psutil.Process, *, timeout: float = 60.0) -> None:
    """Until ``process`` spends under 5 % of a core over half a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = sum(process.cpu_times()[:2])
        time.sleep(0.5)
        if sum(process.cpu_times()[:2]) - before < 0.025:
            return
    raise AssertionError(f"the server stayed busy for {timeout} s")


def test_a_catastrophic_chart_filter_is_answered_and_never_stalls_the_server(server: tuple[str, object]) -> None:
    """The filter that backtracked for ever is answered within 5 s, and the health route keeps
    answering within 1 s all the while."""
    url, _ = server
    query = urlencode({"run": "big", "chart": "x", "history": "effective", "only": CATASTROPHIC})
    answered: list[tuple[int, float]] = []

    def ask() -> None:
        start = time.monotonic()
        status, _ = get(f"{url}/api/csv?{query}", timeout=60)
        answered.append((status, time.monotonic() - start))

    asking = threading.Thread(target=ask)
    asking.start()
    health = []
    while asking.is_alive() and len(health) < 100:
        start = time.monotonic()
        status, _ = get(f"{url}/_stcore/health", timeout=30)
        health.append((status, time.monotonic() - start))
        time.sleep(0.05)
    asking.join(60)
    assert answered and answered[0][0] == 404 and answered[0][1] <= 5.0  # the run has no chart "x"
    assert health and all(status == 200 and took <= 1.0 for status, took in health), health


def test_long_polls_for_unknown_runs_cost_under_forty_percent_of_a_core(server: tuple[str, object]) -> None:
    """300 long polls for runs that do not exist, all waiting for a snapshot far ahead: each is
    answered 404 without waiting, and over the 3 s after they were sent the server spends at most
    40 % of a core (a ticker each would ask the store for each name several times a second)."""
    url, process = server
    before, start = process.cpu_times(), time.monotonic()
    with ThreadPoolExecutor(300) as pool:
        asked = [pool.submit(get, f"{url}/api/changes?run=ghost-{n}&seen={10**9}", timeout=60) for n in range(300)]
        time.sleep(max(0.0, 3.0 - (time.monotonic() - start)))
        after, wall = process.cpu_times(), time.monotonic() - start
        answers = [future.result() for future in asked]
    cpu = sum(after[:2]) - sum(before[:2])
    assert [status for status, _ in answers] == [404] * 300
    assert all(b"ghost" in body and b"/" not in body for _, body in answers)
    assert cpu / wall <= 0.40, f"{cpu:.2f} s of CPU in {wall:.2f} s"


def static_bundle(url: str) -> str:
    """The path of the first script Streamlit's index.html loads (a content-hashed bundle)."""
    _, index = get(f"{url}/")
    return "/" + re.search(rb'src="\.?/?(static/js/[^"]+\.js)"', index).group(1).decode()


def test_static_spellings_and_option_sets_keep_no_memory_each(server: tuple[str, object]) -> None:
    """100 spellings of one static file (each answered with the file) and 200 chart option sets the
    page can produce (each building the run's figures) grow the server's RSS by at most 40 MB."""
    url, process = server
    bundle = static_bundle(url)
    gzip = {"Accept-Encoding": "gzip"}
    assert get(f"{url}{bundle}", headers=gzip)[0] == 200

    def changes(options: ChartOptions) -> int:
        query = {"run": "big", "seen": 0, "sig": "x", "opts": options_query(options), "held": "{}"}
        status, body = get(f"{url}/api/changes?{urlencode(query)}", timeout=120)
        assert status == 200 and json.loads(body).get("rerun") is True, body
        return status

    changes(ChartOptions())  # the run read, its first figures built: what every server holds
    before = process.memory_info().rss
    spellings = [bundle.replace("/static/", "/static/" + "./" * n, 1) for n in range(1, 51)]
    spellings += [bundle.replace("/static/", "/static" + "/" * n, 1) for n in range(2, 52)]
    for spelling in spellings:
        assert get(f"{url}{spelling}", headers=gzip)[0] == 200
    for log_y in (False, True):
        for step in range(100):
            changes(ChartOptions(smoothing=round(step * SMOOTHING_STEP, 2), log_y=log_y))
    grown = (process.memory_info().rss - before) / 1e6
    assert grown <= 40, f"RSS grew by {grown:.0f} MB"


RUN = "big"


def no_run_data(text: str) -> bool:
    """Nothing of the served run: its loss column, or the values logged in it."""
    return "train_loss" not in text and "0.0003" not in text


def test_routes_need_the_token_and_a_loopback_host(server: tuple[str, object]) -> None:
    url, _ = server
    csv = f"{url}/api/csv?run={RUN}&chart=loss&history=effective&only="
    status, _, body = http_get(csv)
    assert status == 200 and b"train_loss" in body, (status, body[:300])
    strangers = (
        {"Authorization": ""},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "", "Cookie": f"metrics_token_1={ACCESS_TOKEN}"},
    )
    for headers in strangers:
        status, _, body = http_get(csv, headers=headers)
        assert status == 403 and no_run_data(body.decode()), headers
    for host in ("evil.example", f"rebound.evil.example:{url.rsplit(':', 1)[1]}"):
        status, _, body = http_get(csv, headers={"Host": host})
        assert status == 403 and no_run_data(body.decode()), host
    assert http_get(f"{url}/_stcore/health", headers={"Authorization": ""})[0] == 200  # no data: open


def test_the_websocket_refuses_a_stranger_and_a_foreign_origin(server: tuple[str, object]) -> None:
    """A websocket without the token, or with it from another origin's page, is closed before it
    is accepted; the owner's is accepted."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    url, _ = server
    stream = f"ws://{url.split('://', 1)[1]}/_stcore/stream"
    owner = {"Authorization": f"Bearer {ACCESS_TOKEN}"}

    async def opens(headers: dict[str, str], origin: str | None) -> bool:
        try:
            async with connect(stream, subprotocols=["streamlit"], additional_headers=headers, origin=origin):
                return True
        except InvalidStatus:
            return False

    def tried(headers: dict[str, str], origin: str) -> bool:
        return run_async(opens(headers, origin))

    assert tried(owner, url)
    assert not tried({}, url)
    assert not tried(owner, "http://evil.example")


@pytest.mark.parametrize("wrong", ["", "x" * 5000])
def test_a_token_of_any_length_that_is_not_the_servers_is_refused(server: tuple[str, object], wrong: str) -> None:
    status, _, body = http_get(f"{server[0]}/run?run={RUN}&token={wrong}", headers={"Authorization": ""})
    assert status == 403 and no_run_data(body.decode())


def raw_get(url: str, target: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """GET ``target`` exactly as written (no normalising, no redirect followed) from the server at
    ``url``, with ``headers`` (``Host`` among them): its status, headers (lower-case names, a
    repeated one joined) and body."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        answer = connection.getresponse()
        said = {}
        for name, value in answer.getheaders():
            said[name.lower()] = f"{said[name.lower()]}, {value}" if name.lower() in said else value
        return answer.status, said, answer.read()
    finally:
        connection.close()


def lands_on(url: str, link: str) -> str:
    """The host and port a browser on ``url`` goes to following ``link`` (it drops tabs and newlines
    and reads a backslash as a slash)."""
    cleaned = "".join(c for c in link if c not in "\t\n\r").replace("\\", "/")
    return urlsplit(urljoin(url + "/", cleaned)).netloc


def test_no_redirect_or_link_leaves_the_origin_and_no_answer_can_be_framed(server: tuple[str, object]) -> None:
    """Paths that a browser would read as another host, sent with the token in the address (the
    redirect that drops it), with a Bearer header (Streamlit's own answers) and with nothing (the
    refusal page and its link): every Location and link lands on this server, every answer forbids
    framing."""
    url, _ = server
    paths = ["//evil.example/login", "/%2F%2Fevil.example/x", "/\\evil.example/x", "/%5C%5Cevil.example/x/",
             "/\\/evil.example/", "/%09/evil.example/", "/run/"]  # fmt: skip
    own = urlsplit(url).netloc
    for path in paths:
        for query, headers in (
            (f"?token={ACCESS_TOKEN}&run={RUN}", {}),
            ("", {"Authorization": f"Bearer {ACCESS_TOKEN}"}),
            ("", {"Accept": "text/html"}),
        ):
            status, said, body = raw_get(url, path + query, {"Host": own, **headers})
            links = [said.get("location", ""), *(m.decode() for m in re.findall(rb'href="([^"]*)"', body))]
            assert all(lands_on(url, link) == own for link in links if link), (path, query, status, links)
            assert said.get("content-security-policy") == "frame-ancestors 'none'", (path, query, said)
            assert said.get("x-frame-options") == "DENY"
    status, said, _ = raw_get(url, f"/%2F%2Fevil.example/x?token={ACCESS_TOKEN}", {"Host": own})
    assert status == 303 and said["location"] == "/evil.example/x"


def test_the_cookie_is_a_session_never_the_token_and_a_bearer_client_gets_none(server: tuple[str, object]) -> None:
    url, _ = server
    own = {"Host": urlsplit(url).netloc}
    _, said, _ = raw_get(url, f"/?token={ACCESS_TOKEN}", own)
    cookie = said["set-cookie"].split(";", 1)[0]
    assert cookie.startswith(f"metrics_session_{urlsplit(url).port}=") and ACCESS_TOKEN not in said["set-cookie"]
    status, said, body = raw_get(
        url, f"/api/csv?run={RUN}&chart=loss&history=effective&only=", {**own, "Cookie": cookie}
    )
    assert status == 200 and b"train_loss" in body and "set-cookie" not in said
    status, said, _ = raw_get(url, "/", {**own, "Authorization": f"Bearer {ACCESS_TOKEN}"})
    assert status == 200 and "set-cookie" not in said


NOBODY = 65534  # another user of the node: Debian's nobody and nogroup


@contextmanager
def co_tenant(url: str) -> Iterator[Callable[..., int]]:
    """Another user of the node (``NOBODY``): ``ask(target, headers)`` has a process of theirs GET
    ``target`` (as written, with ``headers`` only) from the server at ``url`` and gives the status.  The
    process is this one forked, its user dropped before its first connection: an interpreter
    started afresh may be one that user cannot read."""
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()

    def serve() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        while (asked := theirs.recv()) is not None:
            target, headers = asked
            theirs.send(raw_get(url, target, {"Host": urlsplit(url).netloc, **headers})[0])

    process = context.Process(target=serve, daemon=True)
    process.start()

    def ask(target: str, headers: dict[str, str] | None = None) -> int:
        ours.send((target, headers or {}))
        assert ours.poll(30), "the other user's process did not answer"
        return ours.recv()

    try:
        yield ask
    finally:
        ours.send(None)
        process.join(10)


another_user = pytest.mark.skipif(
    not hasattr(os, "setuid") or os.geteuid() != 0 or not os.path.exists("/proc/net/tcp"),
    reason="being another user of the node takes root, and telling users apart Linux's kernel",
)


@another_user
def test_another_users_wrong_tokens_make_only_that_user_wait(server: tuple[str, object]) -> None:
    """Another user sends wrong tokens from loopback until a wait starts: the owner's printed URL
    and Bearer requests (from loopback too) are still let in at once, and the other user's next try,
    the right token or not, waits (429, unchecked)."""
    url, _ = server
    own = {"Host": urlsplit(url).netloc}
    with co_tenant(url) as ask:
        assert [ask(f"/run?run={RUN}&token=wrong-{n}") for n in range(6)] == [403] * 6
        status, said, _ = raw_get(url, f"/?token={ACCESS_TOKEN}", own)
        assert status == 303 and said["set-cookie"].startswith("metrics_session_")
        status, _, body = raw_get(url, f"/api/csv?run={RUN}&chart=loss&history=effective&only=", {
            **own, "Authorization": f"Bearer {ACCESS_TOKEN}"})  # fmt: skip
        assert status == 200 and b"train_loss" in body
        assert ask(f"/?token={ACCESS_TOKEN}") == 429
        assert ask(f"/?token=wrong-{NOBODY}") == 429


@another_user
def test_a_forwarded_for_address_makes_no_new_client(server: tuple[str, object]) -> None:
    """Uvicorn believes ``X-Forwarded-For`` from loopback: another user writing a new address there
    with each guess is still one client, which waits after five, and the owner does not."""
    url, _ = server
    with co_tenant(url) as ask:
        forged = [ask(f"/?token=wrong-{n}", {"X-Forwarded-For": f"10.9.0.{n}"}) for n in range(7)]
        assert forged == [403] * 6 + [429]
        assert raw_get(url, f"/?token={ACCESS_TOKEN}", {"Host": urlsplit(url).netloc})[0] == 303


@pytest.mark.parametrize(
    ("command", "token"),
    [
        (["-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port"], ""),
        (["-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port"], "fifteen-letters"),
        (["-m", "metrics_core", "serve", "--port"], "abc"),
    ],
    ids=["streamlit-run-empty", "streamlit-run-short", "serve-short"],
)
def test_an_empty_or_short_token_refuses_to_start_naming_the_variable(
    tmp_path: object, command: list[str], token: str
) -> None:
    """``METRICS_TOKEN=$(cat ~/.metrics_token)`` with the file missing is an empty token: the server
    refuses to start and says which variable, rather than serve every run to every user of the node."""
    argv = [sys.executable, *command, str(free_port()), "--", "--runs", str(tmp_path)]
    if command[1] == "metrics_core":
        argv.remove("--")
    env = {**os.environ, "METRICS_TOKEN": token, "PYTHONPATH": str(REPO)}
    ended = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    said = ended.stdout + ended.stderr
    assert ended.returncode != 0 and "METRICS_TOKEN" in said and "16 characters" in said, said
    assert "Open the dashboard" not in said
