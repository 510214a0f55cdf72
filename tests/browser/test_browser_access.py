"""Who gets into a served dashboard, tried from outside in a real Chromium and over real HTTP: a
stranger's browser, a wrong token and a foreign Host see no run data; the owner's printed URL lets
a fresh browser in once, and from then on its cookie does."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import ACCESS_TOKEN, http_get, wait_until

RUN = "secret-run-7f3a"  # a name that appears nowhere but in what the server shows of this run


def served_runs(root: Path) -> None:
    """This module's run in the shared dashboard's root."""
    write_run(root / RUN / "metrics.jsonl", 200, seed=7)


def no_run_data(text: str) -> bool:
    return RUN not in text and "train_loss" not in text


def test_a_strangers_browser_sees_how_to_get_in_and_nothing_of_the_runs(server: str, browser: object) -> None:
    context = browser.anonymous_context()
    try:
        page = context.new_page()
        for path in ("/", f"/run?run={RUN}", f"/compare?run={RUN}", f"/?token=wrong-{ACCESS_TOKEN}"):
            answer = page.goto(server + path)
            assert answer.status == 403, path
            text = page.inner_text("body")
            assert "needs its access token" in text and no_run_data(text), (path, text)
        assert context.cookies() == []
    finally:
        context.close()


def test_the_printed_url_lets_a_fresh_browser_in_and_its_cookie_keeps_it_in(server: str, browser: object) -> None:
    """The URL with ``?token=`` is answered with a redirect to the same page without the token and
    an HttpOnly, SameSite=Strict cookie; pages opened later carry only the cookie."""
    context = browser.anonymous_context(viewport={"width": 1400, "height": 1100})
    try:
        page = context.new_page()
        page.goto(f"{server}/?token={ACCESS_TOKEN}")
        assert page.url == f"{server}/"  # the token is out of the address bar and the history
        [cookie] = [cookie for cookie in context.cookies() if cookie["name"].startswith("metrics_token_")]
        assert cookie["value"] == ACCESS_TOKEN and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert "metrics_token_" not in page.evaluate("document.cookie")  # HttpOnly: no script of the page reads it
        wait_until(page, lambda: page.locator("[data-testid=stDataFrame] canvas").count() > 0, timeout=60)  # the runs
        page.goto(f"{server}/run?run={RUN}")
        wait_until(page, lambda: page.locator(".js-plotly-plot .main-svg").count() > 0, timeout=60)
    finally:
        context.close()


def test_routes_need_the_token_and_a_loopback_host(server: str) -> None:
    csv = f"{server}/api/csv?run={RUN}&chart=loss&history=effective&only="
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
    for host in ("evil.example", f"rebound.evil.example:{server.rsplit(':', 1)[1]}"):
        status, _, body = http_get(csv, headers={"Host": host})
        assert status == 403 and no_run_data(body.decode()), host
    assert http_get(f"{server}/_stcore/health", headers={"Authorization": ""})[0] == 200  # no data: open


def test_the_websocket_refuses_a_stranger_and_a_foreign_origin(server: str) -> None:
    """A websocket without the token, or with it from another origin's page, is closed before it
    is accepted; the owner's is accepted."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    stream = f"ws://{server.split('://', 1)[1]}/_stcore/stream"
    owner = {"Authorization": f"Bearer {ACCESS_TOKEN}"}

    async def opens(headers: dict[str, str], origin: str | None) -> bool:
        try:
            async with connect(stream, subprotocols=["streamlit"], additional_headers=headers, origin=origin):
                return True
        except InvalidStatus:
            return False

    def tried(headers: dict[str, str], origin: str) -> bool:  # in a thread: Playwright's loop runs in this one
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, opens(headers, origin)).result()

    assert tried(owner, server)
    assert not tried({}, server)
    assert not tried(owner, "http://evil.example")


@pytest.mark.parametrize("wrong", ["", "x" * 5000])
def test_a_token_of_any_length_that_is_not_the_servers_is_refused(server: str, wrong: str) -> None:
    status, _, body = http_get(f"{server}/run?run={RUN}&token={wrong}", headers={"Authorization": ""})
    assert status == 403 and no_run_data(body.decode())
