"""Fixtures of more than one tier (unit/, integration/, browser/ each have their own conftest.py):
every test works on real files under pytest's tmp_path."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from metrics_core import RunContext
from metrics_core.read.run_reader import RunReader
from metrics_core.testing.buckets import BUCKET
from metrics_core.testing.live_server import free_port, listening

if TYPE_CHECKING:
    from pyarrow import fs as pafs

# The tests that train (torch, transformers, lightning: here or in the processes they start) train
# models of a few thousand weights, whose every operation is too small to split: one intra-op thread
# each runs them several times faster than a pool whose threads wait on one another for cores shared
# with the test's own processes.  MKL's variable, which torch (its CPU build) reads at import, and not
# OMP_NUM_THREADS, which would shrink pyarrow's thread pool too: the code under test keeps its threads.
# A caller's own setting wins.
os.environ.setdefault("MKL_NUM_THREADS", "1")


@pytest.fixture
def run(tmp_path: Path) -> RunContext:
    """A run context in a fresh, not yet existing run directory."""
    return RunContext(tmp_path / "runs" / "exp1", run_id="exp1", session_id="s1")


@pytest.fixture
def writer_lock() -> Iterator[Callable[[Path], None]]:
    """Hold the writer's lock on a run file until the test ends, as a living trainer does: on a local
    disk a run whose lock nobody holds and that did not end is crashed (``run_status``)."""
    from metrics_core.write.crash_safety import lock_exclusive

    held: list[int] = []

    def hold(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        held.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        lock_exclusive(held[-1])

    yield hold
    for fd in held:
        os.close(fd)


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding this checkout's wheel with its ``[app]`` extra (metrics_core/testing/wheel_venv.py): the one
    .ci/run built (``$METRICS_WHEEL_VENV``), else one built now, once per session; checked to import
    the installed wheel, not a checkout on ``PYTHONPATH``."""
    from metrics_core.testing.wheel_venv import build_wheel_venv, checked_wheel_venv

    built = os.environ.get("METRICS_WHEEL_VENV")
    if not built:
        return checked_wheel_venv(build_wheel_venv(tmp_path_factory.mktemp("wheel")))
    if not (Path(built) / "bin" / "python").is_file():
        pytest.fail(
            f"$METRICS_WHEEL_VENV={built}: no venv there "
            "(python -m metrics_core.testing.wheel_venv DIR builds DIR/venv)"
        )
    return checked_wheel_venv(Path(built))


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server of its own, stopped after the test session; waits at most 30 s for it to listen."""
    pytest.importorskip("moto", reason="moto[server] (the S3-compatible test server) is not installed")
    port = free_port()
    with listening([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, "the moto server"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> pafs.S3FileSystem:
    """The bucket, emptied, reached the way a user configures it: the standard AWS variables."""
    from pyarrow import fs as pafs

    from metrics_core.buckets.addresses import s3_filesystem

    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_endpoint}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    filesystem = s3_filesystem()
    if filesystem.get_file_info(BUCKET).type == pafs.FileType.NotFound:
        pafs.S3FileSystem(allow_bucket_creation=True, endpoint_override=s3_endpoint.removeprefix("http://"),
                          scheme="http").create_dir(BUCKET)  # fmt: skip
    filesystem.delete_dir_contents(BUCKET)
    return filesystem


@pytest.fixture
def metrics(tmp_path: Path) -> Path:
    """The metrics file of a run directory that does not exist yet."""
    return tmp_path / "run" / "metrics.jsonl"


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Make reading any run called 'poisoned' raise, as a reader bug would; counts the attempts."""
    calls = {"refresh": 0, "raise": 1}
    original = RunReader.refresh

    def refresh(self: RunReader) -> int:
        if self.path.parent.name == "poisoned":
            calls["refresh"] += 1
            if calls["raise"]:
                raise OverflowError("Python int too large to convert to C long")
        return original(self)

    monkeypatch.setattr(RunReader, "refresh", refresh)
    return calls
