"""Shared fixtures: every test works on real files under pytest's tmp_path."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding this checkout's wheel with its ``[app]`` extra (tests/wheel_venv.py): the one
    .ci/run built (``$METRICS_WHEEL_VENV``), else one built now, once per session."""
    from tests.wheel_venv import build_wheel_venv

    built = os.environ.get("METRICS_WHEEL_VENV")
    if not built:
        return build_wheel_venv(tmp_path_factory.mktemp("wheel"))
    if not (Path(built) / "bin" / "python").is_file():
        pytest.fail(f"$METRICS_WHEEL_VENV={built}: no venv there (python tests/wheel_venv.py DIR builds DIR/venv)")
    return Path(built)


@pytest.fixture(scope="module")
def served_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs root of the module's shared dashboard, made once per module: empty, then filled by the
    module's ``served_runs(root)`` if it defines one (a fixture reading its requesting module, as in
    pytest's "Fixtures can introspect the requesting test context")."""
    root = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    served_runs = getattr(request.module, "served_runs", None)
    if served_runs is not None:
        served_runs(root)
    return root


@pytest.fixture(scope="module")
def server(served_root: Path) -> Iterator[str]:
    """The dashboard serving ``served_root``, once per module."""
    from tests.live_server import streamlit_server

    with streamlit_server(served_root) as url:
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


@pytest.fixture
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty runs root, the one the app reads (``METRICS_RUNS_DIR``), for the tests that run pages in-process."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("METRICS_RUNS_DIR", str(root))
    return root
