"""Shared fixtures: every test works on real files under pytest's tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metrics_core import RunContext


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Debian Chromium per test module (tests.live_server.chromium)."""
    from tests.live_server import chromium

    with chromium() as instance:
        yield instance


@pytest.fixture(scope="module")
def server(runs_root: Path) -> Iterator[str]:
    """The dashboard serving the module's ``runs_root`` fixture, once per module."""
    from tests.live_server import streamlit_server

    with streamlit_server(runs_root) as url:
        yield url


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    """A fresh desktop-sized browser context and tab (cookies, cache and storage of its own)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    tab = context.new_page()
    yield tab
    context.close()


@pytest.fixture
def run(tmp_path: Path) -> RunContext:
    """A run context in a fresh, not yet existing run directory."""
    return RunContext(tmp_path / "runs" / "exp1", run_id="exp1", session_id="s1")
