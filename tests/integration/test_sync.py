"""``python -m metrics_core sync`` and runs in parts (``bucket_files.PartsFile``), against a real
S3-compatible server (conftest's moto server): a live run uploaded as immutable parts, each complete
line once, read back exactly as the local file."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from metrics_core.buckets import sync as sync_module
from metrics_core.buckets.addresses import parse_bucket_url
from metrics_core.buckets.bucket_files import (
    ObjectFile,
    Part,
    PartsFile,
    list_parts,
    part_name,
)
from metrics_core.buckets.bucket_runs import discover_bucket_runs, open_bucket_run
from metrics_core.buckets.cloud_reads import s3_reads
from metrics_core.buckets.object_reads import ArrowReads
from metrics_core.buckets.sync import RunSync
from metrics_core.cli.main import main as cli_main
from metrics_core.errors import RunFileError
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.run_digest import RunDigest
from metrics_core.read.run_reader import RunReader
from metrics_core.write.writer import MetricsWriter, RunContext, TrainingState
from tests.support import (
    BUCKET,
    REPO,
    append_bytes,
    append_records,
    base_record,
    line,
    same_story,
    snapshot,
    spawn_python,
    three_session_run,
    upload,
)

# Appends what the test sends (hex, one write per command) to the file in argv[1], and says so.
WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
for command in sys.stdin:
    os.write(fd, bytes.fromhex(command.strip()))
    print("written", flush=True)
"""


def sync(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metrics_core", "sync", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)  # fmt: skip


def sync_here(*args: str) -> str:
    """``sync`` in this process (quicker than a child where only its effect matters): its output."""
    out, err = io.StringIO(), io.StringIO()
    assert cli_main(["sync", *args], out, err) == 0, err.getvalue()
    return out.getvalue()


def parts(filesystem: pafs.FileSystem, run: str) -> list[Part]:
    return list_parts(filesystem, parse_bucket_url(f"s3://{BUCKET}/{run}/metrics.jsonl.parts"))


def part_bytes(filesystem: pafs.FileSystem, run: str) -> list[bytes]:
    """Each part's bytes, read object by object (not through ``PartsFile``)."""
    found = parts(filesystem, run)
    return [filesystem.open_input_file(f"{BUCKET}/{run}/metrics.jsonl.parts/{part_name(p.start)}").readall()
            for p in found]  # fmt: skip


def complete_prefix(path: Path) -> bytes:
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1]


def poll(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.05)


def test_a_synced_run_reads_as_the_local_file_through_appends_a_torn_tail_and_a_rewrite(
    bucket: pafs.S3FileSystem, tmp_path: Path
) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    three_session_run(path)
    destination = f"s3://{BUCKET}/exp/run"
    done = sync(str(path.parent), destination)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"uploaded {destination}/metrics.jsonl.parts/{part_name(0)} ({path.stat().st_size:,} bytes)\n"
    file = open_bucket_run(bucket, destination)
    assert isinstance(file, PartsFile)
    remote, local = RunReader(file.path, file=file), RunReader(path)
    same_story(remote, local)
    assert snapshot(remote) == snapshot(local)
    digest = PartsFile(destination, bucket)
    same_story(RunDigest(digest.path, file=digest), RunDigest(path))

    # More records and a torn tail: a second part of the complete lines only; the tail stays local.
    size = path.stat().st_size
    append_records(path, *(base_record(s, session="s3", train_loss=1.0 / s) for s in range(210, 260, 10)))
    torn = line(base_record(260, session="s3", train_loss=0.5))
    append_bytes(path, torn[:-9])
    sync_here(str(path), destination)
    assert [(p.start, p.size) for p in parts(bucket, "exp/run")] == [
        (0, size),
        (size, len(complete_prefix(path)) - size),
    ]
    assert remote.refresh() == local.refresh() == 5
    assert remote.records == local.records and remote.sessions == local.sessions and not remote.resets
    assert local.pending_bytes == len(torn) - 9 and remote.pending_bytes == 0

    # The torn tail cut and the line written whole, as a resumed writer does: the third part.
    path.write_bytes(complete_prefix(path) + torn)
    sync_here(str(path), destination)
    same_story(remote, local)
    assert snapshot(remote) == snapshot(local) and len(parts(bucket, "exp/run")) == 3 and not remote.resets

    # Another, shorter run uploaded in parts at the same place: read again from its start.
    bucket.delete_dir_contents(f"{BUCKET}/exp/run")
    path.unlink()
    append_records(path, *(base_record(s, session="other", train_loss=2.0) for s in range(10, 40, 10)))
    sync_here(str(path), destination)
    same_story(remote, local)
    assert remote.resets == 1 and "shrank" in remote.reset_reasons[0]
    assert snapshot(remote) == snapshot(local)


def test_a_cached_parse_of_a_run_in_parts_is_reopened_and_read_on(bucket: pafs.S3FileSystem, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    three_session_run(path)
    destination = f"s3://{BUCKET}/cached"
    sync_here(str(path), destination)
    policy = CachePolicy(tmp_path / "cache", min_records=1)
    first = RunReader(Path("cached"), file=PartsFile(destination, bucket), cache=policy)
    first.refresh()
    first.close()
    append_records(path, *(base_record(s, session="s3", train_loss=1.0 / s) for s in range(210, 260, 10)))
    sync_here(str(path), destination)
    again, local = RunReader(Path("cached"), file=PartsFile(destination, bucket), cache=policy), RunReader(path)
    again.refresh()
    local.refresh()
    assert again.served_from_cache and not again.resets
    assert snapshot(again) == snapshot(local)


def test_sync_follow_uploads_each_complete_line_once_while_the_writer_is_killed_mid_line(
    bucket: pafs.S3FileSystem, tmp_path: Path
) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    writer = spawn_python(WRITER, str(path))
    follow = subprocess.Popen([sys.executable, "-m", "metrics_core", "sync", str(path.parent), f"s3://{BUCKET}/live",
                               "--follow", "--interval", "0.05"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=REPO)  # fmt: skip

    def write(data: bytes) -> None:
        writer.stdin.write(data.hex() + "\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "written\n"

    def uploaded() -> int:
        return sum(part.size for part in parts(bucket, "live"))

    try:
        step = 0
        for _ in range(4):  # each time: lines, and half of the next one, which sync must leave local
            lines = [line(base_record(step := step + 1, train_loss=1.0 / step)) for _ in range(3)]
            half = len(lines[-1]) // 2
            write(b"".join(lines[:-1]) + lines[-1][:half])
            poll(lambda: uploaded() == len(complete_prefix(path)), "the complete lines uploaded")
            write(lines[-1][half:])
        write(line(base_record(step + 1)) + line(base_record(step + 2))[:40])
        poll(lambda: uploaded() == len(complete_prefix(path)), "the complete lines uploaded")
        writer.send_signal(signal.SIGKILL)  # mid-line
        writer.wait(timeout=30)
        follow.send_signal(signal.SIGTERM)
        out, err = follow.communicate(timeout=60)
    finally:
        for process in (writer, follow):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert follow.returncode == 0, err
    data = path.read_bytes()
    complete = complete_prefix(path)
    assert len(data) - len(complete) == 40  # the torn tail is local only
    found = parts(bucket, "live")
    assert sum(part.size for part in found) == len(complete)  # no byte uploaded twice, none left out
    assert b"".join(part_bytes(bucket, "live")) == complete
    assert all(chunk.endswith(b"\n") for chunk in part_bytes(bucket, "live"))
    assert len(found) >= 5 and len(out.splitlines()) == len(found)  # each part uploaded once
    reader = RunReader(Path("live"), file=PartsFile(f"s3://{BUCKET}/live", bucket))
    reader.refresh()
    assert reader.records == complete.count(b"\n") == 13 and reader.pending_bytes == 0

    # The run resumes (its writer cuts the torn tail), then a new sync continues after the parts.
    with MetricsWriter(RunContext(path.parent, "r", "s2")) as resumed:
        resumed.write("session_start", TrainingState(step=13))
    assert resumed.discarded_bytes == 40
    again = sync(str(path.parent), f"s3://{BUCKET}/live")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"uploaded s3://{BUCKET}/live/metrics.jsonl.parts/{part_name(len(complete))} (")
    assert parts(bucket, "live")[:-1] == found  # the parts there were left as they were
    assert b"".join(part_bytes(bucket, "live")) == path.read_bytes()


def test_sync_follow_ends_by_itself_when_the_session_is_over(bucket: pafs.S3FileSystem, tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    three_session_run(path)
    append_records(path, base_record(200, event="session_end", session="s3", status="finished"))
    done = sync(str(path.parent), f"s3://{BUCKET}/done", "--follow", "--interval", "0.05")
    assert done.returncode == 0, done.stderr
    assert b"".join(part_bytes(bucket, "done")) == path.read_bytes()


def test_a_backlog_goes_up_in_parts_of_at_most_the_part_size_cut_at_line_ends(
    bucket: pafs.S3FileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync_module, "MAX_PART_BYTES", 1000)
    path = tmp_path / "metrics.jsonl"
    append_records(path, *(base_record(s) for s in range(1, 20)))
    append_records(path, base_record(20, note="x" * 2500))  # one line longer than a part: a part of its own
    append_records(path, *(base_record(s) for s in range(21, 25)))
    syncer = RunSync(parse_bucket_url(f"s3://{BUCKET}/big"), bucket)
    syncer.resume()
    done = syncer.step(path)
    chunks = part_bytes(bucket, "big")
    assert len(done.uploaded) == len(chunks) > 4 and b"".join(chunks) == path.read_bytes()
    assert all(chunk.endswith(b"\n") and (len(chunk) <= 1000 or chunk.count(b"\n") == 1) for chunk in chunks)
    assert any(len(chunk) > 2500 for chunk in chunks)


def test_a_long_tail_with_no_newline_costs_a_part_and_a_scan_of_memory_per_pass(
    bucket: pafs.S3FileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Complete lines, then 64 MB with no newline (a writer stuck mid-line, sparse on disk): each pass
    uploads the lines and allocates at most a part plus a scan, not the tail; once the line ends it
    goes up whole, as one part."""
    import tracemalloc

    monkeypatch.setattr(sync_module, "MAX_PART_BYTES", 1 << 20)
    monkeypatch.setattr(sync_module, "SCAN_BYTES", 64 << 10)
    path = tmp_path / "metrics.jsonl"
    append_records(path, *(base_record(s) for s in range(1, 20)))
    lines = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(lines + (64 << 20))  # zeros: no newline in them
    syncer = RunSync(parse_bucket_url(f"s3://{BUCKET}/tail"), bucket)
    syncer.resume()
    for _ in range(2):
        tracemalloc.start()
        try:
            done = syncer.step(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert syncer.uploaded == lines and peak < 2 * sync_module.MAX_PART_BYTES  # a part and two scans fit
    assert [size for _, size in done.uploaded] == []
    append_bytes(path, b"\n")
    assert [size for _, size in syncer.step(path).uploaded] == [(64 << 20) + 1]
    assert b"".join(part_bytes(bucket, "tail")) == path.read_bytes()


def test_a_part_missing_from_the_middle_is_a_one_line_error(bucket: pafs.S3FileSystem, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    for steps in (range(1, 5), range(5, 9), range(9, 13)):
        append_records(path, *(base_record(s) for s in steps))
        sync_here(str(path), f"s3://{BUCKET}/gap")
    middle = parts(bucket, "gap")[1]
    bucket.delete_file(f"{BUCKET}/gap/metrics.jsonl.parts/{part_name(middle.start)}")
    message = (rf"^s3://{BUCKET}/gap/metrics.jsonl.parts: part {part_name(middle.start)} is missing: nothing holds "
               rf"bytes {middle.start:,} to {middle.end:,} \(the next part is {part_name(middle.end)}\)$")  # fmt: skip
    file = PartsFile(f"s3://{BUCKET}/gap", bucket)
    with pytest.raises(RunFileError, match=message):
        RunReader(file.path, file=file).refresh()
    refused = sync(str(path), f"s3://{BUCKET}/gap")
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1 and f"part {part_name(middle.start)} is missing" in refused.stderr


@pytest.mark.parametrize("client", ["botocore", "pyarrow"])
def test_a_torn_part_is_not_read_past_until_a_complete_one_replaces_it(bucket: pafs.S3FileSystem, client: str) -> None:
    first, second, third = (line(base_record(s, train_loss=1.0)) for s in (1, 2, 3))
    upload(bucket, f"torn/metrics.jsonl.parts/{part_name(0)}", first)
    upload(bucket, f"torn/metrics.jsonl.parts/{part_name(len(first))}", second[:30])
    reads = s3_reads() if client == "botocore" else ArrowReads(bucket)
    reader = RunReader(Path("torn"), file=PartsFile(f"s3://{BUCKET}/torn", bucket, reads=reads))
    assert reader.refresh() == 1 and reader.pending_bytes == 30  # the torn last part: a torn tail

    # A part after the torn one: still nothing past it (a part never continues another's line).
    upload(bucket, f"torn/metrics.jsonl.parts/{part_name(len(first) + 30)}", second[30:] + third)
    assert reader.refresh() == 0 and reader.records == 1 and reader.pending_bytes == 30
    fresh = RunReader(Path("torn"), file=PartsFile(f"s3://{BUCKET}/torn", bucket))
    assert fresh.refresh() == 1 and fresh.pending_bytes == 30 and fresh.bad_lines == 0

    # The torn part replaced by its complete version, the one after it dropped: read on, no restart.
    bucket.delete_file(f"{BUCKET}/torn/metrics.jsonl.parts/{part_name(len(first) + 30)}")
    upload(bucket, f"torn/metrics.jsonl.parts/{part_name(len(first))}", second)
    upload(bucket, f"torn/metrics.jsonl.parts/{part_name(len(first + second))}", third)
    assert reader.refresh() == 2 and reader.records == 3 and reader.pending_bytes == 0 and not reader.resets


@pytest.mark.parametrize("client", ["botocore", "pyarrow"])
def test_an_object_or_part_that_vanishes_mid_read_is_a_one_line_error(bucket: pafs.S3FileSystem, client: str) -> None:
    upload(bucket, "v/a/metrics.jsonl", line(base_record(1)))
    upload(bucket, f"v/b/metrics.jsonl.parts/{part_name(0)}", line(base_record(1)))
    reads = s3_reads() if client == "botocore" else ArrowReads(bucket)
    objects = (ObjectFile(f"s3://{BUCKET}/v/a/metrics.jsonl", reads=reads), "v/a/metrics.jsonl")
    parts_run = (PartsFile(f"s3://{BUCKET}/v/b", bucket, reads=reads), f"v/b/metrics.jsonl.parts/{part_name(0)}")
    for file, key in (objects, parts_run):
        assert file.stat() is not None
        file.open()
        bucket.delete_file(f"{BUCKET}/{key}")
        with pytest.raises(RunFileError, match=rf"^s3://{BUCKET}/{key}: vanished while being read \(deleted after"):
            file.read(0, 100)


def test_sync_refuses_a_local_file_that_was_rewritten_or_shrank(bucket: pafs.S3FileSystem, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_records(path, *(base_record(s, session="a") for s in range(1, 10)))
    sync_here(str(path), f"s3://{BUCKET}/re")
    uploaded = parts(bucket, "re")
    path.write_bytes(path.read_bytes().replace(b'"a"', b'"b"'))  # another run, same length
    refused = sync(str(path), f"s3://{BUCKET}/re")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.startswith(f"error: {path}: was rewritten: its first {uploaded[0].size:,} bytes are not")
    path.write_bytes(path.read_bytes()[:100])
    refused = sync(str(path), f"s3://{BUCKET}/re")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.startswith(f"error: {path}: shrank to 100 bytes, below the {uploaded[0].size:,} bytes")
    assert parts(bucket, "re") == uploaded  # nothing deleted or uploaded


def test_sync_to_a_missing_bucket_is_a_one_line_error(bucket: pafs.S3FileSystem, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_records(path, base_record(1))
    refused = sync(str(path), "s3://no-such-bucket/p/r")
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.startswith("error: s3://no-such-bucket/p/r/metrics.jsonl.parts: cannot be listed: ")
    assert "The specified bucket does not exist" in refused.stderr


def test_wrong_credentials_are_a_one_line_error(
    bucket: pafs.S3FileSystem, tmp_path: Path, refusing_credentials: None
) -> None:
    path = tmp_path / "metrics.jsonl"
    append_records(path, base_record(1))
    refused = sync(str(path), f"s3://{BUCKET}/creds")
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.startswith(f"error: s3://{BUCKET}/creds/metrics.jsonl.parts: cannot be listed: ")
    assert "INVALID_ACCESS_KEY_ID" in refused.stderr
    with pytest.raises(RunFileError, match=r"cannot be listed: .*INVALID_ACCESS_KEY_ID") as info:
        PartsFile(f"s3://{BUCKET}/creds", bucket).stat()
    assert "\n" not in str(info.value)


def test_runs_in_parts_are_discovered_and_opened_beside_whole_objects(bucket: pafs.S3FileSystem) -> None:
    record = line(base_record(1, train_loss=1.0))
    for key in ("exp/whole/metrics.jsonl", f"exp/parts/metrics.jsonl.parts/{part_name(0)}",
                "exp/both/metrics.jsonl", f"exp/both/metrics.jsonl.parts/{part_name(0)}",
                f"exp/.hidden/metrics.jsonl.parts/{part_name(0)}"):  # fmt: skip
        upload(bucket, key, record)
    runs = discover_bucket_runs(f"s3://{BUCKET}/exp", filesystem=bucket)
    assert [(run.name, run.parts) for run in runs] == [("both", True), ("parts", True), ("whole", False)]
    assert runs[1].metrics_url == f"s3://{BUCKET}/exp/parts/metrics.jsonl.parts"
    assert [type(run.file(bucket)) for run in runs] == [PartsFile, PartsFile, ObjectFile]
    assert [type(open_bucket_run(bucket, f"s3://{BUCKET}/exp/{name}")) for name in ("both", "parts", "whole")] == [
        PartsFile, PartsFile, ObjectFile]  # fmt: skip
    for run in runs:
        file = run.file(bucket)
        assert RunReader(file.path, file=file).refresh() == 1
