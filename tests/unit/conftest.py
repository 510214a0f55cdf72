"""The unit tier: pure functions and real files under tmp_path, in this process only.  A test that
starts a process is not a unit test (it belongs in tests/integration/): starting one fails here."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way this tier could start a process (``subprocess`` underneath ``os.system`` aside) raises."""

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test starts no process: move it to tests/integration/")

    monkeypatch.setattr(subprocess.Popen, "__init__", refused)
