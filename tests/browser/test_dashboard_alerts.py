"""A real dashboard server posting each alert once to a local webhook receiver, however many tabs
are open."""

from __future__ import annotations

from pathlib import Path

from tests.support import DESKTOP, Receiver
from tests.support.alerts import nan_and_healthy_runs


def test_the_server_posts_each_alert_once_with_two_tabs_open(browser: object, tmp_path: Path) -> None:
    """A real server started with --webhook: both tabs show the NaN run's alert and the local
    receiver gets exactly one POST for it (one evaluator per server, not one per viewer)."""
    from metrics_core.testing.live_server import streamlit_server, wait_until

    root = tmp_path / "runs"
    nan_and_healthy_runs(root)
    receiver = Receiver()
    context = browser.new_context(viewport=DESKTOP)
    try:
        with streamlit_server(root, "--webhook", receiver.url) as url:
            tabs = [context.new_page(), context.new_page()]
            for tab in tabs:
                tab.goto(url + "/")
            for tab in tabs:
                wait_until(tab, lambda tab=tab: tab.get_by_text("nan · nonfinite_loss since").count(), timeout=60)
            wait_until(tabs[0], lambda: receiver.posts, timeout=30)
            tabs[1].reload()  # a new session of the same server: it must not alert again
            wait_until(tabs[1], lambda: tabs[1].get_by_text("nan · nonfinite_loss since").count(), timeout=60)
    finally:
        context.close()
        receiver.close()
    assert receiver.by_run() == {"nan": 1}
    assert receiver.posts[0]["condition"] == "nonfinite_loss" and receiver.posts[0]["state"] == "firing"
