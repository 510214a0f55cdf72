"""Fixtures of the browser tier: one headless Chromium for the whole session, and one dashboard for
every module that only reads what it serves (``server``): a module names its runs in
``served_runs(root)``; a test may add runs of its own under ``served_root``, by names no other test
uses.  A module whose tests need a root of their own (a listing of exactly its runs, a server
started differently) defines its own ``server`` fixture."""

from __future__ import annotations

import filecmp
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrics_core.testing.live_server import chromium, streamlit_server
from tests.support import DESKTOP


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """One headless Debian Chromium for the session (metrics_core.testing.live_server.chromium); each test gets a
    tab of its own in one shared context (``page``)."""
    pytest.importorskip("playwright", reason="playwright (the test extra) is not installed")
    with chromium() as instance:
        yield instance


@pytest.fixture(scope="session")
def served_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs root of the shared dashboard, made once per session: the runs of every collected
    module's ``served_runs(root)``.  Each module writes into a scratch root first, so that two modules
    may name the same run only with the same bytes; a run named twice with different ones fails here."""
    root = tmp_path_factory.mktemp("served")
    owners: dict[str, str] = {}
    modules = {item.module for item in request.session.items if getattr(item, "module", None) is not None}
    for module in sorted(modules, key=lambda module: module.__name__):
        served_runs = getattr(module, "served_runs", None)
        if served_runs is None:
            continue
        with tempfile.TemporaryDirectory(dir=root.parent) as scratch:
            served_runs(Path(scratch))
            for entry in sorted(Path(scratch).iterdir()):
                target = root / entry.name
                if target.exists():
                    comparison = filecmp.dircmp(entry, target)
                    same = not (comparison.left_only or comparison.right_only or comparison.diff_files)
                    assert same, f"run {entry.name!r}: {module.__name__} and {owners[entry.name]} write different ones"
                    continue
                shutil.move(entry, target)
                owners[entry.name] = module.__name__
    return root


@pytest.fixture(scope="session")
def server(served_root: Path) -> Iterator[str]:
    """The dashboard serving ``served_root``, once per session."""
    with streamlit_server(served_root) as url:
        yield url


@pytest.fixture(scope="session")
def desktop(browser: object) -> Iterator[object]:
    """One desktop-sized browser context for the session's ``page`` tabs: they share its HTTP cache
    (Streamlit's scripts and plotly.js compiled once, as in a user's browser) and its cookies."""
    context = browser.new_context(viewport=DESKTOP)
    yield context
    context.close()


@pytest.fixture
def page(request: pytest.FixtureRequest, browser: object, desktop: object) -> Iterator[object]:
    """A new tab of the session's desktop context, closed after the test with any other tab it
    opened; for a test marked ``first_visit``, a tab in a desktop-sized context of its own (an
    empty cache, no cookies)."""
    if request.node.get_closest_marker("first_visit") is None:
        yield desktop.new_page()
        for tab in desktop.pages:
            tab.close()
        return
    context = browser.new_context(viewport=DESKTOP)
    yield context.new_page()
    context.close()
