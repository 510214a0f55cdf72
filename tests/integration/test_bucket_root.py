"""The dashboard's store on a runs root in a bucket (``bucket_root.BucketRoot``), against a real
S3-compatible server (conftest's moto) behind a counting proxy (``metrics_core.testing.buckets.CountingProxy``): the
requests a refresh costs are counted, not timed, and every failure is one line."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest
from pyarrow import fs as pafs

from metrics_core.buckets.addresses import parse_bucket_url, s3_filesystem
from metrics_core.buckets.sync import RunSync
from metrics_core.dashboard.launch import streamlit_arguments
from metrics_core.dashboard.settings import parse_settings
from metrics_core.dashboard.store.run_store import RunStore, RunViewError
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.errors import RunNotFoundError
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import StatusRecord, write_failure
from metrics_core.roots.bucket_root import BucketRoot
from metrics_core.testing.live_server import free_port, wait_for_http
from metrics_core.write.failure_note import FAILURE_NOTE_FILENAME
from tests.support import (
    BUCKET,
    CountingProxy,
    append_bytes,
    append_records,
    base_record,
    bucket_run,
    follow_bucket_runs,
    follow_live_run,
    line,
    open_page,
    put_object,
    snapshot,
    three_bucket_runs,
    three_session_run,
)

REFRESH_S = 5.0


@pytest.fixture
def proxy(bucket: pafs.S3FileSystem, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingProxy]:
    """A counting proxy in front of the test server; clients made after this go through it."""
    counting = CountingProxy(s3_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", counting.url)
    yield counting
    counting.close()


def bucket_store(clock: list[float], **options: float) -> RunStore:
    """A store on ``s3://runs/exp`` as the dashboard makes one at ``--refresh 5``, on the test's clock."""
    root = BucketRoot(f"s3://{BUCKET}/exp", list_interval=options.pop("list_interval", 60.0), clock=lambda: clock[0])
    return RunStore(
        root, StoreSettings(safety_interval=REFRESH_S, load_budget_s=3600.0, clock=lambda: clock[0], **options)
    )


def statuses(store: RunStore) -> dict[str, str]:
    return dict(zip(*(store.runs_table()[column] for column in ("run", "status")), strict=True))


def test_a_refresh_costs_one_request_per_live_run_and_finished_runs_cost_nothing(
    bucket: pafs.S3FileSystem, proxy: CountingProxy
) -> None:
    """20 finished runs and 2 live ones, a page on a live run and one on a finished run, two minutes
    of refreshes every 5 s: a listing per minute, one GET per live run per refresh (its new bytes
    come with it), and not one request for a finished run, viewed or not, until a listing shows it
    changed."""
    for number in range(20):
        put_object(bucket, f"exp/done{number:02d}/metrics.jsonl", bucket_run(live=False))
    live = bucket_run(live=True)
    for number in range(2):
        put_object(bucket, f"exp/live{number}/metrics.jsonl", live)
    clock = [0.0]
    store = bucket_store(clock)
    try:
        assert set(statuses(store).values()) == {"finished", "live"}  # cold: a listing, then a HEAD and GET per run
        store.view("done00")
        cold, _ = proxy.snapshot()
        assert cold["list"] == 1 and cold["head"] >= 22 and cold["get"] >= 22
        proxy.reset()

        def requests_for(key: str) -> dict[str, int]:
            return {kind: n for (kind, at), n in proxy.keys.items() if at == key}

        for refresh in range(1, 25):
            clock[0] += REFRESH_S
            if refresh == 7:  # a longer copy of a live run uploaded, as `aws s3 cp` does
                longer = live + line(base_record(60, train_loss=0.1, time=datetime.now(timezone.utc).isoformat()))
                put_object(bucket, "exp/live0/metrics.jsonl", longer)
            store.runs_table()
            store.view("live0")
            store.view("done00")
            if refresh == 7:
                assert store.view("live0").records == 6  # seen at the refresh after the upload
        counts, _ = proxy.snapshot()
        assert counts["list"] == 2  # at 60 s and 120 s
        # One per live run per refresh, whatever the tabs: a GET from the last line read on, which
        # says the size and version, holds the follower's look at that line and the new bytes.
        assert counts == {"list": 2, "get": 2 * 24}, proxy.keys
        finished = {key: n for (kind, key), n in proxy.keys.items() if key.startswith("exp/done")}
        assert finished == {}

        # A finished run's object replaced: nothing until the next listing, then read again once.
        put_object(bucket, "exp/done05/metrics.jsonl", bucket_run(live=False, steps=7, session="s2"))
        proxy.reset()
        clock[0] += REFRESH_S
        store.runs_table()
        assert requests_for("exp/done05/metrics.jsonl") == {}
        clock[0] += 60.0
        assert store.runs_table().set_index("run").loc["done05", "last step"] == 70
        assert requests_for("exp/done05/metrics.jsonl") == {"head": 1, "get": 1}  # as at its first read
        assert proxy.snapshot()[0]["list"] == 1
    finally:
        store.close()


def test_a_live_object_costs_one_request_per_refresh_whether_it_grew_or_not(
    bucket: pafs.S3FileSystem, proxy: CountingProxy, tmp_path: Path
) -> None:
    """A live run's object replaced by a longer copy at some refreshes and not at others, with a torn
    line completed later: each refresh is one GET of it, from the last line read on (its answer
    gives the size and version, the follower's look at that line and the new bytes)."""
    follow_live_run(bucket, proxy, tmp_path / "metrics.jsonl", "s3", parts=False, requests=lambda grown: {"get": 1})


def test_without_botocore_a_refresh_is_a_head_and_a_get_when_it_grew(
    bucket: pafs.S3FileSystem, proxy: CountingProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where botocore is not installed, pyarrow's client reads: a HEAD per refresh, and one GET from
    the last line read on when the object grew.  pyarrow opens an object with a HEAD because its
    ``open_input_file`` takes a path, never a ``FileInfo`` with the size: if that changes, this fails
    and ``object_reads.ArrowReads`` can be one request a read too."""
    for module in ("botocore", "botocore.config", "botocore.session"):
        monkeypatch.setitem(sys.modules, module, None)
    follow_live_run(bucket, proxy, tmp_path / "metrics.jsonl", "s3", parts=False,
                    requests=lambda grown: {"head": 1, "get": 1} if grown else {"head": 1})  # fmt: skip
    try:
        bucket.open_input_file(pafs.FileInfo(f"{BUCKET}/exp/live/metrics.jsonl", size=1 << 20))
    except TypeError:
        pass
    else:
        pytest.fail("pyarrow now opens an object from a FileInfo, without a HEAD: ArrowReads can be one GET a read")


def test_a_live_run_in_parts_costs_a_listing_per_refresh_and_a_get_per_new_part(
    bucket: pafs.S3FileSystem, proxy: CountingProxy, tmp_path: Path
) -> None:
    """A live run that ``sync`` uploads as parts: a refresh that finds no new part is one listing of
    the run's parts; one that finds a part adds its GET alone (the follower's looks at the first and
    at the last line read are answered from the immutable parts already read)."""
    follow_live_run(bucket, proxy, tmp_path / "metrics.jsonl", "s3", parts=True,
                    requests=lambda grown: {"list": 1, "get": 1} if grown else {"list": 1})  # fmt: skip


def test_a_copy_that_keeps_the_last_line_read_is_read_on_and_one_that_changed_it_again(
    bucket: pafs.S3FileSystem,
) -> None:
    """The one-request rule of a live object: a longer copy whose last line read is unchanged at its
    offset is read on from there, even if it changed an earlier line (the records read stay as they
    were read; a local file's follower compares the first line too); a copy whose last line read
    changed, or that ends before it, is read again from its start."""
    data = bucket_run(live=True)
    put_object(bucket, "exp/a/metrics.jsonl", data)
    root = BucketRoot(f"s3://{BUCKET}/exp")
    reader = root.reader(root.resolve("a"), cache=None)
    assert reader.refresh() == 5
    extra = line(base_record(60, train_loss=0.1, time=datetime.now(timezone.utc).isoformat()))
    first_changed = data.replace(b'"train_loss":1.0', b'"train_loss":9.0', 1)
    assert first_changed != data and len(first_changed) == len(data)
    put_object(bucket, "exp/a/metrics.jsonl", first_changed + extra)
    assert reader.refresh() == 1 and reader.records == 6 and not reader.resets
    assert reader.column("train", "train_loss").numbers()[0] == 1.0  # as first read
    put_object(bucket, "exp/a/metrics.jsonl", (first_changed + extra).replace(b'"s1"', b'"s2"'))
    assert reader.refresh() == 6 and reader.resets == 1 and "rewritten" in reader.reset_reasons[0]
    put_object(bucket, "exp/a/metrics.jsonl", data[: len(data) // 2])
    reader.refresh()
    assert reader.resets == 2 and "shrank" in reader.reset_reasons[1]


def test_a_bucket_that_does_not_exist_is_one_line_and_retried_sparingly(proxy: CountingProxy) -> None:
    """The root cannot be listed: the runs page and a run page say so in one line naming the root;
    the listing is tried again after ``RETRY_S``, not at every call."""
    clock = [0.0]
    root = BucketRoot("s3://no-such-bucket/exp", clock=lambda: clock[0])
    store = RunStore(root, StoreSettings(safety_interval=REFRESH_S, clock=lambda: clock[0]))
    try:
        for _ in range(3):
            with pytest.raises(
                RunNotFoundError, match=r"^s3://no-such-bucket/exp: the runs root cannot be listed: "
            ) as info:
                store.runs_table()
            assert "\n" not in str(info.value)
        with pytest.raises(RunNotFoundError, match=r"^s3://no-such-bucket/exp: "):
            store.view("a")
        assert proxy.snapshot()[0]["list"] == 1
        clock[0] += 10.0
        with pytest.raises(RunNotFoundError):
            store.runs_table()
        assert proxy.snapshot()[0]["list"] == 2
    finally:
        store.close()


def test_an_object_deleted_between_its_head_and_its_get_is_that_runs_error_alone(
    bucket: pafs.S3FileSystem, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object of run ``a`` vanishes between the HEAD that sized it and the GET of its bytes: run
    ``a``'s row is an error naming its object in one line; run ``b`` is listed and read as usual."""
    put_object(bucket, "exp/a/metrics.jsonl", bucket_run(live=False))
    put_object(bucket, "exp/b/metrics.jsonl", bucket_run(live=False))

    def vanish(kind: str, key: str) -> None:
        if kind == "get" and key == "exp/a/metrics.jsonl":
            bucket.delete_file(f"{BUCKET}/{key}")

    proxy = CountingProxy(s3_endpoint, before=vanish)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = bucket_store([0.0])
    try:
        table = store.runs_table().set_index("run")
        assert table.loc["b", "status"] == "finished"
        assert table.loc["a", "status"] == "error"
        assert table.loc["a", "error"].startswith("a/metrics.jsonl: vanished while being read ")
        assert "\n" not in table.loc["a", "error"]
        with pytest.raises(
            RunViewError, match=r"^run 'a' cannot be shown: a/metrics.jsonl: vanished while being read "
        ):
            store.view("a")
    finally:
        store.close()
        proxy.close()


def test_refused_credentials_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that checks credentials (moto with its IAM checks on) refuses keys it does not know:
    the listing's refusal is one line naming the root."""
    port = free_port()
    env = {"INITIAL_NO_AUTH_ACTION_COUNT": "0", "PATH": "/usr/bin:/bin"}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        with tempfile.TemporaryFile() as log:
            wait_for_http(f"http://127.0.0.1:{port}/moto-api/", server, log, what="moto")
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        store = RunStore(f"s3://{BUCKET}/exp")
        try:
            with pytest.raises(
                RunNotFoundError, match=rf"^s3://{BUCKET}/exp: the runs root cannot be listed: "
            ) as info:
                store.runs_table()
            assert "INVALID_ACCESS_KEY_ID" in str(info.value) and "\n" not in str(info.value)
        finally:
            store.close()
    finally:
        server.kill()
        server.wait()


def test_the_runs_page_says_a_missing_bucket_in_one_plain_line_and_stays_up(
    bucket: pafs.S3FileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--runs s3://no-such-bucket/exp``: the runs page keeps its title and caption and shows the
    refusal as one error line, its text as data (no markdown formed from it)."""
    monkeypatch.setenv("METRICS_RUNS_DIR", "s3://no-such-bucket/exp")
    app = open_page("runs")
    assert app.title[0].value == "Runs"
    assert plain(app.caption[0].value).startswith("Watching s3://no-such-bucket/exp (listing: ")
    (error,) = app.error
    assert plain(error.value).startswith("Cannot list the runs: s3://no-such-bucket/exp: the runs root cannot be")
    assert "\n" not in error.value


def plain(markdown: str) -> str:
    """What ``display_text.md_text`` escaped, read back: its backslashes and word joiners dropped."""
    return re.sub(r"\\(.)", r"\1", markdown).replace("\u2060", "")


def test_a_bucket_address_is_the_runs_root_of_every_command(tmp_path: Path) -> None:
    """``--runs s3://bucket/prefix`` stays an address (a path would fold its ``//``) for ``streamlit
    run app.py --``, ``metrics-dashboard`` and ``serve`` alike; ``--list-interval`` must be positive."""
    config = parse_settings(["--runs", "s3://runs/exp", "--list-interval", "30", "--cache-dir", str(tmp_path)], {})
    assert (config.runs, config.list_interval) == ("s3://runs/exp", 30.0)
    assert parse_settings([], {"METRICS_RUNS_DIR": "s3://runs/x"}).runs == "s3://runs/x"
    assert streamlit_arguments(["--runs", "s3://runs/exp"], {}, Path("app.py"))[-2:] == ["--runs", "s3://runs/exp"]
    with pytest.raises(SystemExit, match="--list-interval must be a positive number"):
        parse_settings(["--runs", "s3://runs/exp", "--list-interval", "0"], {})


def test_a_bucket_run_read_through_its_root_tells_the_local_copys_story(
    bucket: pafs.S3FileSystem, tmp_path: Path
) -> None:
    """The root's reader (``ObjectFile``, whose one GET a refresh from the last line read on also
    fetches the new bytes) reads what a reader of the local file uploaded each time reads: a torn
    tail completed and records appended, then a rewrite of the same length, then a shorter run."""
    path = tmp_path / "metrics.jsonl"
    three_session_run(path)
    torn = line(base_record(210, session="s3", train_loss=0.05))
    append_bytes(path, torn[:-9])
    put_object(bucket, "exp/a/metrics.jsonl", path.read_bytes())
    root = BucketRoot(f"s3://{BUCKET}/exp")
    remote, local = root.reader(root.resolve("a"), cache=None), RunReader(path)

    def same() -> None:
        put_object(bucket, "exp/a/metrics.jsonl", path.read_bytes())
        assert remote.refresh() == local.refresh()
        assert snapshot(remote) == snapshot(local)
        assert (remote.resets, remote.pending_bytes) == (local.resets, local.pending_bytes)

    same()
    append_bytes(path, torn[-9:])
    append_records(path, *(base_record(s, session="s3", train_loss=1.0 / s) for s in range(220, 260, 10)))
    same()
    assert remote.resets == 0 and remote.pending_bytes == 0
    path.write_bytes(path.read_bytes().replace(b'"s3"', b'"s4"'))
    same()
    path.write_bytes(b"".join(line(base_record(s, session="x", train_loss=2.0)) for s in (10, 20)))
    same()
    assert remote.resets == 2 and remote.records == 2


def test_a_run_synced_as_parts_is_listed_and_followed_like_one_object(
    bucket: pafs.S3FileSystem, tmp_path: Path
) -> None:
    """A run ``sync`` uploads as parts is a run of the root like an uploaded ``metrics.jsonl``: listed
    with its parts' total size, read as the local file reads, and a part added after its
    session ended is read once the next listing shows the run grew."""
    path = tmp_path / "metrics.jsonl"
    three_session_run(path)
    sync = RunSync(parse_bucket_url(f"s3://{BUCKET}/exp/synced"), s3_filesystem())
    sync.step(path)
    clock = [0.0]
    store = bucket_store(clock)
    try:
        [run] = store.runs()
        assert run.name == "synced"
        local = RunReader(path)
        local.refresh()
        assert store.view("synced").records == local.records == 36
        append_records(path, *(base_record(s, session="s3", train_loss=1.0 / s) for s in range(220, 260, 10)))
        assert [size for _, size in sync.step(path).uploaded] != []
        clock[0] += 60.0  # the run had ended: it is looked at again when the next listing finds it changed
        local.refresh()
        assert store.view("synced").records == local.records == 40
    finally:
        store.close()


def test_a_local_file_at_the_bucket_keys_path_is_never_looked_at(
    bucket: pafs.S3FileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server started where a local copy of the run lies at the object's key (``runs/exp/a/``),
    with a failure note that would make it failed: the bucket run's status comes from its own
    records alone, read or released, for a bucket has no notes and no locks."""
    data = bucket_run(live=False)[: -len(line(base_record(50, event="session_end", status="finished")))]
    put_object(bucket, "exp/a/metrics.jsonl", data + b'{"torn')
    local = tmp_path / BUCKET / "exp" / "a"
    local.mkdir(parents=True)
    (local / "metrics.jsonl").write_bytes(data + b'{"torn')
    note = {"session_id": "s1", "time": "2026-11-29T10:00:21+00:00", "error": "No space left on device (ENOSPC)",
            "end": len(data), "size": len(data) + 6}  # fmt: skip
    (local / FAILURE_NOTE_FILENAME).write_bytes(orjson.dumps(note))
    local_reader = RunReader(local)
    local_reader.refresh()
    assert write_failure(local_reader) is not None  # the note is one a local reader takes
    monkeypatch.chdir(tmp_path)
    root = BucketRoot(f"s3://{BUCKET}/exp")
    remote = root.reader(root.resolve("a"), cache=None)
    remote.refresh()
    assert not remote.on_disk and write_failure(remote) is None
    released = StatusRecord.of(remote, identity=None)
    assert write_failure(released) is None and released.writer_alive() is None


def test_a_gs_root_lists_and_follows_its_runs_as_an_s3_one(gcs: pafs.GcsFileSystem, tmp_path: Path) -> None:
    """``--runs gs://bucket/prefix``: the emulator ``STORAGE_EMULATOR_HOST`` names, listed by
    pyarrow's Cloud Storage client and read through the gcs extra's where it is installed
    (tests/integration/test_gcs.py counts its requests), holds a finished run, a live one and one ``sync``
    uploads as parts; a longer copy of the live run is read on from its old size, another run uploaded over it
    is read again from its start; a bucket that does not exist is one line naming the root."""
    path = tmp_path / "metrics.jsonl"
    follow_bucket_runs(gcs, "gs", path, three_bucket_runs(gcs, "gs", path))

    with pytest.raises(RunNotFoundError, match=r"^gs://no-such-bucket/exp: the runs root cannot be listed: ") as info:
        BucketRoot("gs://no-such-bucket/exp").discover()
    assert "\n" not in str(info.value)
