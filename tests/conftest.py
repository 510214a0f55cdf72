"""Shared fixtures: every test works on real files under pytest's tmp_path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from metrics_core import RunContext


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
