"""Fixtures of the integration tier: real processes, emulated buckets (moto's S3 server in
tests/conftest.py, Cloud Storage's and Azure's emulators here), AppTest pages, the installed wheel."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from metrics_core.testing.buckets import AZURITE_ACCOUNT, BUCKET, azure_connection_string, gcs_emulator_command
from metrics_core.testing.live_server import free_port, listening, wait_for_http

if TYPE_CHECKING:
    from pyarrow import fs as pafs


@pytest.fixture
def runs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty runs root, the one the app reads (``METRICS_RUNS_DIR``), for the tests that run pages in-process."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("METRICS_RUNS_DIR", str(root))
    return root


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
    pytest.importorskip("gcp_storage_emulator", reason="gcp-storage-emulator is not installed")
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


@pytest.fixture
def azure(azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> pafs.FileSystem:
    """The container ``runs`` (``metrics_core.testing.buckets.BUCKET``), emptied, reached the way Azure's own tools
    are configured: ``AZURE_STORAGE_CONNECTION_STRING`` holding the emulator's ``BlobEndpoint``."""
    from metrics_core.buckets.addresses import azure_filesystem, parse_bucket_url

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_connection_string(azurite_endpoint))
    filesystem = azure_filesystem(parse_bucket_url(f"az://{BUCKET}"))
    filesystem.create_dir(BUCKET)
    filesystem.delete_dir_contents(BUCKET, missing_dir_ok=True)  # an empty container reads as missing
    return filesystem
