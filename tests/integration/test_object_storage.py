"""Runs in a bucket, read through ``bucket_files.ObjectFile``, against a real S3-compatible server
(moto's server mode in a subprocess on a free localhost port): the readers tell the same story of
an object as of the local file it was uploaded from, through appends and rewrites."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyarrow import fs as pafs

from metrics_core.buckets.addresses import parse_bucket_url
from metrics_core.buckets.bucket_files import ObjectFile
from metrics_core.buckets.bucket_runs import discover_bucket_runs
from metrics_core.buckets.cloud_reads import s3_reads
from metrics_core.buckets.object_reads import ArrowReads
from metrics_core.errors import MetricsError, RunFileError, RunNotFoundError, RunPathError
from metrics_core.read.run_digest import RunDigest
from metrics_core.read.run_reader import RunReader
from tests.support import (
    BUCKET,
    append_bytes,
    append_records,
    base_record,
    line,
    same_story,
    snapshot,
    three_session_run,
    upload,
)


@pytest.mark.parametrize("client", ["botocore", "pyarrow"])
def test_reader_reads_an_uploaded_run_as_the_local_copy_through_appends_and_a_rewrite(
    bucket: pafs.S3FileSystem, tmp_path: Path, client: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    three_session_run(path)
    append_bytes(path, line(base_record(210, session="s3", train_loss=0.05))[:-9])  # a torn tail
    upload(bucket, "exp/a/metrics.jsonl", path.read_bytes())
    reads = s3_reads() if client == "botocore" else ArrowReads(bucket)
    file = ObjectFile(f"s3://{BUCKET}/exp/a/metrics.jsonl", reads=reads)
    remote, local = RunReader(file.path, file=file), RunReader(path)
    same_story(remote, local)
    assert remote.pending_bytes > 0 and remote.lost_work().steps_replayed > 0
    assert snapshot(remote) == snapshot(local)

    # A longer copy uploaded over it (the torn line completed, records appended): read on from the
    # old offset, not from the start.
    path.write_bytes(path.read_bytes()[: -(len(line(base_record(210, session="s3", train_loss=0.05))) - 9)])
    append_records(path, *(base_record(s, session="s3", train_loss=1.0 / s) for s in range(210, 260, 10)))
    upload(bucket, "exp/a/metrics.jsonl", path.read_bytes())
    same_story(remote, local)
    assert snapshot(remote) == snapshot(local)
    assert remote.resets == 0 and remote.records == 41

    # Unchanged: nothing new, no restart.
    assert remote.refresh() == 0 and not remote.resets

    # Another, shorter run uploaded at the same key: noticed, read again from the start.
    path.unlink()
    append_records(path, *(base_record(s, session="other", train_loss=2.0) for s in range(10, 40, 10)))
    upload(bucket, "exp/a/metrics.jsonl", path.read_bytes())
    same_story(remote, local)
    assert remote.resets == 1 and "shrank" in remote.reset_reasons[0]
    assert snapshot(remote) == snapshot(local)

    # Another run of the same length or longer (same size, other bytes): noticed as a rewrite.
    data = path.read_bytes().replace(b'"other"', b'"again"')
    upload(bucket, "exp/a/metrics.jsonl", data)
    remote.refresh()
    assert remote.resets == 2 and "rewritten" in remote.reset_reasons[1]
    assert {session.session_id for session in remote.sessions} == {"again"}


def test_digest_reads_an_uploaded_run_as_the_local_copy(bucket: pafs.S3FileSystem, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    three_session_run(path)
    upload(bucket, "d/metrics.jsonl", path.read_bytes())
    file = ObjectFile(f"s3://{BUCKET}/d/metrics.jsonl", bucket)
    remote, local = RunDigest(file.path, file=file), RunDigest(path)
    same_story(remote, local)
    append_records(path, base_record(210, session="s3", train_loss=0.1))
    upload(bucket, "d/metrics.jsonl", path.read_bytes())
    same_story(remote, local)
    assert remote.records == local.records == 37 and not remote.resets


def test_object_file_answers_for_a_missing_object_and_bucket(bucket: pafs.S3FileSystem) -> None:
    missing = ObjectFile(f"s3://{BUCKET}/nothing/metrics.jsonl", bucket)
    assert missing.stat() is None
    reader = RunReader(missing.path, file=missing)
    assert reader.refresh() == 0 and reader.records == 0  # a run awaiting its first upload
    with pytest.raises(RunFileError, match=r"^s3://runs/nothing/metrics.jsonl: no such object$"):
        missing.open()
    assert missing.writer_alive() is None


def test_bucket_runs_are_discovered_like_run_directories(bucket: pafs.S3FileSystem) -> None:
    record = line(base_record(1, train_loss=1.0))
    for key in ("exp/a/metrics.jsonl", "exp/b/c/metrics.jsonl", "exp/metrics.jsonl", "exp/.cache/x/metrics.jsonl",
                "exp/a/config.json", "exp/d/notes.txt", "other/e/metrics.jsonl"):  # fmt: skip
        upload(bucket, key, record)
    runs = discover_bucket_runs(f"s3://{BUCKET}/exp/", filesystem=bucket)
    assert [run.name for run in runs] == [".", "a", "b/c"]
    assert runs[2].metrics_url == f"s3://{BUCKET}/exp/b/c/metrics.jsonl"
    reader = RunReader(runs[2].file(bucket).path, file=runs[2].file(bucket))
    assert reader.refresh() == 1

    def names(root: str, **options: int) -> list[str]:
        return [run.name for run in discover_bucket_runs(f"s3://{BUCKET}{root}", filesystem=bucket, **options)]

    assert names("") == ["exp", "exp/a", "exp/b/c", "other/e"]
    assert names("/exp", max_depth=1) == [".", "a"]
    assert names("/empty") == []


def test_bad_bucket_addresses_are_refused_in_one_line(bucket: pafs.S3FileSystem) -> None:
    with pytest.raises(RunNotFoundError, match=r"^s3://no-such-bucket/p: the runs root cannot be listed: .*") as info:
        discover_bucket_runs("s3://no-such-bucket/p", filesystem=bucket)
    assert "\n" not in str(info.value)
    for bad in ("gcs://b/p", "s3:///p", "gs:///p", "s3://b/../p"):
        with pytest.raises(RunPathError, match=r"^" + bad):
            parse_bucket_url(bad)
    assert issubclass(RunPathError, MetricsError)
