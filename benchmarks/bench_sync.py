"""A live run into a bucket: what ``sync`` uploads, and what reading a run in parts costs.

Run: python benchmarks/bench_sync.py [--passes 200] [--lines-per-pass 20] [--parts 1440]

Against a moto S3 server started here on localhost (its latency is a local Python server's, not
a region's: compare the ratios, not the times):

* upload: a run grows by ``--lines-per-pass`` records between passes; ``sync`` (``RunSync.step``)
  uploads each pass's new lines as one part, against re-uploading the whole file each pass (what
  ``aws s3 cp`` from a loop costs): bytes sent in total, and the seconds of the last pass.
* cold read: ``RunReader.refresh()`` of a run in ``--parts`` parts (a day of ``sync --follow`` at
  its default interval) against the same bytes as one object, with the parts fetched 8 at a time
  (``object_storage``'s default) and one at a time.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from pyarrow import fs as pafs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.buckets import bucket_files as object_storage
from metrics_core.buckets.addresses import parse_bucket_url, s3_filesystem
from metrics_core.buckets.bucket_files import ObjectFile, PartsFile, upload_part
from metrics_core.buckets.sync import RunSync
from metrics_core.read.run_reader import RunReader

BUCKET = "bench"


def record(step: int) -> bytes:
    """A realistic train record, about 250 bytes."""
    fields = {"schema_version": 1, "time": f"2026-11-29T10:{step // 60 % 60:02d}:{step % 60:02d}.000000+00:00",
              "run_id": "r", "session_id": "s1", "event": "train", "step": step, "tokens_seen": step * 4096,
              "skipped_updates": 0, "train_loss": 2.0 + 1.0 / step, "lr": 3e-4, "grad_norm_avg": 1.0,
              "tokens_per_s": 50000.0}  # fmt: skip
    return orjson.dumps(fields) + b"\n"


def serve() -> subprocess.Popen:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")  # fmt: skip
    creator = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True)
    creator.create_dir(BUCKET)
    return server


def upload_costs(filesystem: pafs.FileSystem, work: Path, passes: int, lines: int) -> None:
    path = work / "metrics.jsonl"
    syncer = RunSync(parse_bucket_url(f"s3://{BUCKET}/upload"), filesystem)
    sent_parts = sent_whole = 0
    step = 0
    for number in range(passes):
        with open(path, "ab") as out:
            out.write(b"".join(record(step := step + 1) for _ in range(lines)))
        start = time.perf_counter()
        sent_parts += sum(size for _, size in syncer.step(path).uploaded)
        parts_s = time.perf_counter() - start
        start = time.perf_counter()
        with filesystem.open_output_stream(f"{BUCKET}/whole/metrics.jsonl") as out:
            out.write(path.read_bytes())
        whole_s = time.perf_counter() - start
        sent_whole += path.stat().st_size
        if number == passes - 1:
            size = path.stat().st_size
            print(f"upload, {passes} passes of {lines} records, file {size:,} B:")
            print(f"  sync: {sent_parts:,} B sent ({sent_parts / size:.2f}x the file), last pass {parts_s:.3f} s")
            print(f"  whole file each pass: {sent_whole:,} B sent ({sent_whole / size:.1f}x the file), "
                  f"last pass {whole_s:.3f} s")  # fmt: skip


def cold_read(filesystem: pafs.FileSystem, parts: int) -> None:
    data = bytearray()
    run = parse_bucket_url(f"s3://{BUCKET}/cold")
    step = 0
    for _ in range(parts):
        chunk = b"".join(record(step := step + 1) for _ in range(20))
        upload_part(filesystem, run.child("metrics.jsonl.parts"), len(data), chunk)
        data += chunk
    with filesystem.open_output_stream(f"{BUCKET}/cold-whole/metrics.jsonl") as out:
        out.write(bytes(data))

    def read(file: ObjectFile | PartsFile) -> tuple[float, int]:
        start = time.perf_counter()
        reader = RunReader(file.path, file=file)
        reader.refresh()
        return time.perf_counter() - start, reader.records

    whole_s, records = read(ObjectFile(f"s3://{BUCKET}/cold-whole/metrics.jsonl", filesystem))
    parallel_s, _ = read(PartsFile(run, filesystem))
    object_storage.PARALLEL_GETS = 1  # the name PartsFile.read looks up
    serial_s, _ = read(PartsFile(run, filesystem))
    print(f"cold read of {records:,} records ({len(data):,} B):")
    print(f"  one object {whole_s:.2f} s; {parts:,} parts: {parallel_s:.2f} s fetched 8 at a time, "
          f"{serial_s:.2f} s one at a time")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--lines-per-pass", type=int, default=20)
    parser.add_argument("--parts", type=int, default=1440)
    args = parser.parse_args()
    server = serve()
    try:
        filesystem = s3_filesystem()
        with tempfile.TemporaryDirectory() as work:
            upload_costs(filesystem, Path(work), args.passes, args.lines_per_pass)
        cold_read(filesystem, args.parts)
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
