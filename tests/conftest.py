"""Shared fixtures: every test works on real files under pytest's tmp_path."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from metrics_core import RunContext

REPO = Path(__file__).resolve().parents[1]


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


def read_records(path: Path) -> list[dict]:
    """Parse every complete line of a metrics file (fails the test on any bad line)."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "file must end on a record boundary"
    return [orjson.loads(line) for line in data.splitlines()]


def spawn_python(code: str, *args: str) -> subprocess.Popen:
    """Start a real Python child process running ``code`` with line-buffered pipes."""
    return subprocess.Popen(
        [sys.executable, "-u", "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def base_record(step: int = 0, *, event: str = "train", session: str = "s1", **values: object) -> dict:
    """A valid record as the writer would produce it, for hand-crafted files."""
    return {
        "schema_version": 1,
        "time": f"2026-11-29T10:{step // 60 % 60:02d}:{step % 60:02d}.000000+00:00",
        "run_id": "r",
        "session_id": session,
        "event": event,
        "step": step,
        "tokens_seen": step * 100,
        "skipped_updates": 0,
        **values,
    }


def append_bytes(path: Path, data: bytes) -> None:
    """Append raw bytes, as a (possibly misbehaving) trainer would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as out:
        out.write(data)


def append_records(path: Path, *records: dict) -> None:
    append_bytes(path, b"".join(orjson.dumps(r) + b"\n" for r in records))
