"""Shared fixtures: every test works on real files under pytest's tmp_path."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from metrics_core import RunContext
from tests.live_server import free_port, wait_for_http
from tests.support import BUCKET, gcs_emulator_command

if TYPE_CHECKING:
    from pyarrow import fs as pafs


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


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server of its own, stopped after the test session; waits at most 30 s for it to listen."""
    port = free_port()
    with listening([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, "the moto server"):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def listening(command: list[str], port: int, what: str) -> Iterator[None]:
    """``command`` running until the block ends, once it accepts connections on ``port`` (at most 30 s)."""
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, f"{what} exited at start"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{what} did not listen within 30 s"
                time.sleep(0.1)
        yield
    finally:
        server.kill()
        server.wait()


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
def refusing_credentials(bucket: pafs.S3FileSystem, s3_endpoint: str) -> Iterator[None]:
    """While the test runs, the S3 server checks credentials (moto's own switch) and so refuses the
    test's keys as unknown, as AWS refuses wrong ones; the checks are off again after it."""
    import urllib.request

    def check_after(requests: str) -> None:
        request = urllib.request.Request(f"{s3_endpoint}/moto-api/reset-auth", data=requests.encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})  # fmt: skip
        urllib.request.urlopen(request, timeout=10).close()

    check_after("0")
    try:
        yield
    finally:
        check_after("inf")


@contextmanager
def gcs_emulator(monkeypatch: pytest.MonkeyPatch, *, stating_generation: bool) -> Iterator[pafs.GcsFileSystem]:
    """A Cloud Storage emulator (``gcp-storage-emulator``, installed by .ci/run) on a free port,
    holding the bucket, reached as a user names one: ``STORAGE_EMULATOR_HOST``
    (``tests.support.gcs_emulator_command``)."""
    pytest.importorskip("gcp_storage_emulator")
    from metrics_core.buckets.addresses import gcs_filesystem

    port = free_port()
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(gcs_emulator_command(port, stating_generation=stating_generation), stdout=log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_for_http(f"http://127.0.0.1:{port}/storage/v1/b", server, log, what="the Cloud Storage emulator")
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
            yield gcs_filesystem()
        finally:
            server.kill()
            server.wait()


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[pafs.GcsFileSystem]:
    """The emulator as it is: its downloads state no generation."""
    with gcs_emulator(monkeypatch, stating_generation=False) as filesystem:
        yield filesystem


@pytest.fixture
def gcs_stating_generation(monkeypatch: pytest.MonkeyPatch) -> Iterator[pafs.GcsFileSystem]:
    """The emulator with downloads that state the object's generation, as Cloud Storage's do."""
    with gcs_emulator(monkeypatch, stating_generation=True) as filesystem:
        yield filesystem


AZURITE_ACCOUNT = "devstoreaccount1"  # Azurite's well-known account and key (Azure's documentation)
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture(scope="session")
def azurite_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's blob service (npm's ``azurite``, installed by .ci/run) on a free port, its data in a
    temporary directory, for the test session: its blob endpoint, ``http://127.0.0.1:PORT/ACCOUNT``.
    Skipped only where ``azurite-blob`` is not installed."""
    binary = shutil.which("azurite-blob")
    if binary is None:
        pytest.skip("azurite-blob is not installed (npm install -g azurite)")
    port = free_port()
    data = tmp_path_factory.mktemp("azurite")
    command = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data), "--silent",
               "--disableTelemetry", "--skipApiVersionCheck"]  # fmt: skip
    with listening(command, port, "Azurite"):
        yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"


def azure_connection_string(endpoint: str) -> str:
    """A connection string as Azure's portal gives one, for the emulator at ``endpoint``."""
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={endpoint};")  # fmt: skip


@pytest.fixture
def azure(azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> pafs.FileSystem:
    """The container ``runs`` (``tests.support.BUCKET``), emptied, reached the way Azure's own tools
    are configured: ``AZURE_STORAGE_CONNECTION_STRING`` holding the emulator's ``BlobEndpoint``."""
    from metrics_core.buckets.addresses import azure_filesystem, parse_bucket_url

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_connection_string(azurite_endpoint))
    filesystem = azure_filesystem(parse_bucket_url(f"az://{BUCKET}"))
    filesystem.create_dir(BUCKET)
    filesystem.delete_dir_contents(BUCKET, missing_dir_ok=True)  # an empty container reads as missing
    return filesystem
