"""Runs roots in Azure Blob Storage (``az://container/prefix``: read and listed through
azure-storage-blob where it is installed, else ``pyarrow.fs.AzureFileSystem``) against Azurite,
configured as Azure's own tools are (``AZURE_STORAGE_CONNECTION_STRING``, whose ``BlobEndpoint``
names the emulator): listing, reading, a live run followed at a counted request cost, ``sync``
into a container, export and query; each failure one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from metrics_core.buckets.addresses import azure_filesystem, parse_bucket_url
from metrics_core.buckets.cloud_reads import reads_for
from metrics_core.buckets.object_reads import ArrowReads
from metrics_core.buckets.sync import RunSync
from metrics_core.errors import MetricsError, RunNotFoundError
from metrics_core.read.run_reader import RunReader
from metrics_core.roots.bucket_root import BucketRoot
from metrics_core.roots.runs_root import open_root
from metrics_core.testing.buckets import AZURITE_ACCOUNT, AZURITE_KEY, azure_connection_string
from tests.support import (
    BUCKET,
    REPO,
    CountingProxy,
    append_records,
    base_record,
    follow_bucket_runs,
    follow_live_run,
    put_object,
    small_run,
    snapshot,
    three_bucket_runs,
    three_session_run,
)


def without_azure_storage_blob(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, clients are made as where azure-storage-blob is not installed."""
    monkeypatch.setitem(sys.modules, "azure.storage.blob", None)


@pytest.mark.parametrize("client", ["azure-storage-blob", "pyarrow"])
def test_an_az_root_lists_reads_and_follows_its_runs_at_a_counted_cost(
    azure: pafs.FileSystem, azurite_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    """``--runs az://container/prefix``: a finished run, a live one and one ``sync`` uploaded are
    listed and read as the local copies, through a counting proxy.  Through azure-storage-blob a
    listing is one flat List Blobs, and the live run, followed, one ranged Get Blob per refresh
    whether it grew or not (a copy of the same size with other bytes is still a rewrite); through
    pyarrow (where azure-storage-blob is not installed) a listing is a request per directory and a
    refresh a HEAD (Get Blob Properties), plus a GET when it grew.  A connection string whose
    ``BlobEndpoint`` cannot be used is one line."""
    if client == "pyarrow":
        without_azure_storage_blob(monkeypatch)
    else:
        pytest.importorskip("azure.storage.blob", reason="the azure extra is not installed")
    path = tmp_path / "metrics.jsonl"
    data = three_bucket_runs(azure, "az", path)
    proxy = CountingProxy(azurite_endpoint.rpartition("/")[0])
    try:
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"AccountName=x;BlobEndpoint={proxy.url}/y/z")
        with pytest.raises(MetricsError, match=rf"^az://{BUCKET}/exp: BlobEndpoint {proxy.url}/y/z names neither "):
            open_root(f"az://{BUCKET}/exp")
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_connection_string(f"{proxy.url}/{AZURITE_ACCOUNT}"))
        assert len(BucketRoot(f"az://{BUCKET}/exp").discover().runs) == 3
        # pyarrow's Azure client lists one directory a request (exp, its three runs, synced's parts),
        # after a look at the container; List Blobs flat is one request a 5,000 blobs.
        listing = {"list": 1} if client == "azure-storage-blob" else {"list": 5, "head": 1}
        assert proxy.snapshot()[0] == listing, proxy.keys

        def look(refresh: Callable[[], int], grown: bool) -> int:
            proxy.reset()
            added = refresh()
            if client == "azure-storage-blob":
                assert proxy.snapshot()[0] == {"get": 1}, proxy.keys
            else:
                assert proxy.snapshot()[0] == ({"head": 1, "get": 1} if grown else {"head": 1}), proxy.keys
            return added

        follow_bucket_runs(azure, "az", path, data, look=look)
    finally:
        proxy.close()


def test_a_live_blob_costs_one_get_per_refresh_and_a_torn_tail_waits_for_its_newline(
    azure: pafs.FileSystem, azurite_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live run's blob replaced by a longer copy at some refreshes and not at others, one copy
    ending in half a line: through azure-storage-blob each refresh is one ranged Get Blob from the
    last line read on, the appended records are read as the local reader reads them, and the torn
    half is not taken until its newline is uploaded."""
    pytest.importorskip("azure.storage.blob", reason="the azure extra is not installed")
    proxy = CountingProxy(azurite_endpoint.rpartition("/")[0])
    try:
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_connection_string(f"{proxy.url}/{AZURITE_ACCOUNT}"))
        follow_live_run(azure, proxy, tmp_path / "metrics.jsonl", "az", parts=False, requests=lambda grown: {"get": 1})
    finally:
        proxy.close()


def test_a_missing_container_bad_credentials_and_no_account_are_one_line_each(
    azure: pafs.FileSystem, azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each refusal names the root in one line: a container that does not exist, a key the account
    refuses, and no storage account named at all."""
    with pytest.raises(
        RunNotFoundError, match=r"^az://nothere/exp: the runs root cannot be listed: no such container$"
    ):
        BucketRoot("az://nothere/exp").discover()
    wrong = azure_connection_string(azurite_endpoint).replace(AZURITE_KEY, "A" * 86 + "==")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong)
    with pytest.raises(RunNotFoundError, match=rf"^az://{BUCKET}/exp: the runs root cannot be listed: .*403") as info:
        BucketRoot(f"az://{BUCKET}/exp").discover()
    assert "\n" not in str(info.value)
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    with pytest.raises(MetricsError, match=rf"^az://{BUCKET}/exp: no storage account named: set AZURE_STORAGE_ACCOUNT"):
        BucketRoot(f"az://{BUCKET}/exp")


def test_sync_into_a_container_resumes_over_an_upload_that_did_not_complete(
    azure: pafs.FileSystem, tmp_path: Path
) -> None:
    """``sync RUN az://…``: the parts read as the local file.  pyarrow's Azure client creates a blob
    empty when it opens it and fills it when it closes, so a sync killed mid-upload leaves an empty
    part: it is no part (nothing to read, nothing to refuse), and the next sync uploads over it."""
    path = tmp_path / "run" / "metrics.jsonl"
    three_session_run(path)
    destination = f"az://{BUCKET}/exp/synced"
    done = subprocess.run([sys.executable, "-m", "metrics_core", "sync", str(path.parent), destination],
                          capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith(f"uploaded {destination}/metrics.jsonl.parts/0000"), done
    end = path.stat().st_size
    append_records(path, *(base_record(s, session="s3", train_loss=1.0 / s) for s in range(220, 260, 10)))
    part = f"{BUCKET}/exp/synced/metrics.jsonl.parts/{end:016d}.jsonl"
    with azure.open_output_stream(part):  # its open made the blob, empty, as a killed upload leaves it
        assert azure.get_file_info(part).size == 0
    assert azure.get_file_info(part).size == 0
    root = open_root(f"az://{BUCKET}/exp")
    remote = root.reader(root.resolve("synced"), cache=None)
    assert remote.refresh() == 36
    sync = RunSync(parse_bucket_url(destination), azure_filesystem(parse_bucket_url(destination)))
    sync.resume()
    assert [size for _, size in sync.step(path).uploaded] == [path.stat().st_size - end]
    local = RunReader(path)
    local.refresh()
    assert remote.refresh() == 4 and snapshot(remote) == snapshot(local)


def test_export_to_a_container_and_a_query_over_an_az_root(azure: pafs.FileSystem, tmp_path: Path) -> None:
    """`export az://… az://…` writes every run's file and the manifest, a second time nothing; `query`
    over the az:// root answers from the runs read through the root."""
    from metrics_core.sql.export import export_root
    from metrics_core.sql.query import connect, run_query
    from metrics_core.sql.query_process import query_root

    small_run(tmp_path / "a" / "metrics.jsonl")
    three_session_run(tmp_path / "b" / "metrics.jsonl")
    for name in ("a", "b"):
        put_object(azure, f"exp/{name}/metrics.jsonl", (tmp_path / name / "metrics.jsonl").read_bytes())
    assert export_root(f"az://{BUCKET}/exp", f"az://{BUCKET}/exports").written == ("a", "b")
    assert export_root(f"az://{BUCKET}/exp", f"az://{BUCKET}/exports").written == ()
    connection = connect(f"az://{BUCKET}/exports", now=datetime.now(timezone.utc))
    try:
        assert run_query(connection, "SELECT count(*) AS n FROM records").table.to_pylist() == [{"n": 86}]
    finally:
        connection.close()
    result = query_root(f"az://{BUCKET}/exp", "SELECT run, records, last_step FROM runs ORDER BY run",
                        cache_home=tmp_path / "cache", now=datetime.now(timezone.utc))  # fmt: skip
    assert result.table.to_pylist() == [{"run": "a", "records": 50, "last_step": 500},
                                        {"run": "b", "records": 36, "last_step": 200}]  # fmt: skip


def test_an_account_named_without_key_or_token_needs_azure_identity_else_pyarrow_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An account named with neither key nor SAS token is read with Azure's default credential
    chain: azure-identity's for azure-storage-blob, so where azure-identity is not installed,
    pyarrow's client (which has the chain of its own) reads it instead."""
    pytest.importorskip("azure.storage.blob", reason="the azure extra is not installed")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_KEY", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "someaccount")
    monkeypatch.setitem(sys.modules, "azure.identity", None)
    assert isinstance(reads_for(parse_bucket_url(f"az://{BUCKET}/exp")), ArrowReads)
