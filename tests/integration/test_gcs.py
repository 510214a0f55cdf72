"""Runs roots in Google Cloud Storage (``gs://bucket/prefix``) against ``gcp-storage-emulator``,
reached as a user names one (``STORAGE_EMULATOR_HOST``): read through google-auth's authorized
session where it is installed (one ranged media GET a look), else through
``pyarrow.fs.GcsFileSystem``; counted at a proxy in front of the emulator."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from metrics_core.buckets.addresses import parse_bucket_url
from metrics_core.buckets.cloud_reads import GcsReads, reads_for
from metrics_core.buckets.object_reads import ArrowReads
from metrics_core.roots.bucket_root import BucketRoot
from tests.support import CountingProxy, follow_bucket_runs, follow_live_run, three_bucket_runs


@pytest.fixture
def proxy_in_front(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], CountingProxy]]:
    """A counting proxy in front of the emulator ``STORAGE_EMULATOR_HOST`` names, made on demand
    (after the test uploaded straight to the emulator); clients made after that go through it."""
    import os

    proxies: list[CountingProxy] = []

    def start() -> CountingProxy:
        proxies.append(CountingProxy(os.environ["STORAGE_EMULATOR_HOST"]))
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxies[-1].url)
        return proxies[-1]

    yield start
    for proxy in proxies:
        proxy.close()


def counted_looks(proxy: CountingProxy, requests: Callable[[bool], dict]) -> Callable[[Callable[[], int], bool], int]:
    """``follow_bucket_runs``' ``look``: each refresh of the live run costs ``requests(grown)``."""

    def look(refresh: Callable[[], int], grown: bool) -> int:
        proxy.reset()
        added = refresh()
        assert proxy.snapshot()[0] == requests(grown), proxy.keys
        return added

    return look


def test_a_gs_root_is_one_listing_and_one_get_per_look_through_google_auth(
    gcs_stating_generation: pafs.GcsFileSystem, proxy_in_front: Callable[[], CountingProxy], tmp_path: Path
) -> None:
    """A finished run, a live one and one ``sync`` uploaded, listed in one request (objects.list)
    and read as the local copies; the live run, followed, is one ranged media GET per refresh
    whether it grew or not: its answer states the size (``Content-Range``) and the generation with
    the bytes, so a copy of the same size with other bytes is still read as a rewrite."""
    pytest.importorskip("google.auth", reason="the gcs extra is not installed")
    path = tmp_path / "metrics.jsonl"
    data = three_bucket_runs(gcs_stating_generation, "gs", path)
    proxy = proxy_in_front()
    assert isinstance(reads_for(parse_bucket_url("gs://runs/exp")), GcsReads)
    assert len(BucketRoot("gs://runs/exp").discover().runs) == 3
    assert proxy.snapshot()[0] == {"list": 1}, proxy.keys
    follow_bucket_runs(gcs_stating_generation, "gs", path, data, look=counted_looks(proxy, lambda grown: {"get": 1}))


def test_a_live_gs_object_costs_one_get_per_refresh_and_a_torn_tail_waits_for_its_newline(
    gcs_stating_generation: pafs.GcsFileSystem, proxy_in_front: Callable[[], CountingProxy], tmp_path: Path
) -> None:
    """A live run's object replaced by a longer copy at some refreshes and not at others, one copy
    ending in half a line: each refresh is one ranged GET from the last line read on, the appended
    records are read as the local reader reads them, and the torn half waits for its newline."""
    pytest.importorskip("google.auth", reason="the gcs extra is not installed")
    proxy = proxy_in_front()
    follow_live_run(gcs_stating_generation, proxy, tmp_path / "metrics.jsonl", "gs", parts=False,
                    requests=lambda grown: {"get": 1})  # fmt: skip


def test_a_server_that_states_no_generation_costs_a_head_per_look_and_misses_no_rewrite(
    gcs: pafs.GcsFileSystem, proxy_in_front: Callable[[], CountingProxy], tmp_path: Path
) -> None:
    """The emulator as it is states no generation with an object's bytes, so no GET's answer can be
    taken as the version a HEAD found: each look is a HEAD (the object's metadata), and when it grew
    two GETs (the follower's look at the first bytes, and the last line read with the new bytes in
    one range); a copy of the same size with other bytes is still a rewrite."""
    pytest.importorskip("google.auth", reason="the gcs extra is not installed")
    path = tmp_path / "metrics.jsonl"
    data = three_bucket_runs(gcs, "gs", path)
    proxy = proxy_in_front()
    requests = counted_looks(proxy, lambda grown: {"head": 1, "get": 2} if grown else {"head": 1})
    follow_bucket_runs(gcs, "gs", path, data, look=requests)


def test_without_google_auth_pyarrow_reads_a_gs_root(
    gcs_stating_generation: pafs.GcsFileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where google-auth is not installed, pyarrow's client lists and reads (a HEAD before each GET),
    and tells the same story of the runs."""
    for module in ("google.auth", "google.auth.transport.requests"):
        monkeypatch.setitem(sys.modules, module, None)
    assert isinstance(reads_for(parse_bucket_url("gs://runs/exp")), ArrowReads)
    path = tmp_path / "metrics.jsonl"
    follow_bucket_runs(gcs_stating_generation, "gs", path, three_bucket_runs(gcs_stating_generation, "gs", path))
