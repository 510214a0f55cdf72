"""Who gets into a served dashboard, tried in a real Chromium: a stranger's browser sees no run
data; the owner's printed URL lets a fresh browser in once, and from then on its cookie does.
Routes, the websocket and the Host check over plain HTTP: tests/integration/test_attacks.py."""

from __future__ import annotations

from pathlib import Path

from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import ACCESS_TOKEN, wait_until
from tests.support import DESKTOP

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


def test_the_printed_url_lets_a_fresh_browser_in_and_replaces_a_stale_cookie(server: str, browser: object) -> None:
    """The URL with ``?token=`` is answered with a redirect to the same page without the token and
    an HttpOnly, SameSite=Strict cookie holding a session, not the token; pages opened later carry
    only the cookie.  A stale cookie (a restart's, or one a page on another port set) is refused,
    and the printed URL replaces it: the page draws, no "Connection error"."""
    context = browser.anonymous_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        page.goto(f"{server}/?token={ACCESS_TOKEN}")
        assert page.url == f"{server}/"  # the token is out of the address bar and the history
        [cookie] = [cookie for cookie in context.cookies() if cookie["name"].startswith("metrics_session_")]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and ACCESS_TOKEN not in cookie["value"]
        assert "metrics_session_" not in page.evaluate("document.cookie")  # HttpOnly: no script of the page reads it
        context.add_cookies([{**cookie, "value": "stale-session-of-an-earlier-start"}])
        assert page.goto(f"{server}/run?run={RUN}").status == 403
        page.goto(f"{server}/run?run={RUN}&token={ACCESS_TOKEN}")
        assert page.url == f"{server}/run?run={RUN}"
        [renewed] = [found for found in context.cookies() if found["name"] == cookie["name"]]
        assert renewed["value"] not in (cookie["value"], "stale-session-of-an-earlier-start")
        wait_until(page, lambda: page.locator(".js-plotly-plot .main-svg").count() > 0, timeout=60)
        assert "Connection error" not in page.inner_text("body")
        page.goto(server)
        wait_until(page, lambda: page.locator("[data-testid=stDataFrame] canvas").count() > 0, timeout=60)  # the runs
    finally:
        context.close()
