"""Requests and bytes per minute of a dashboard on a runs root in a bucket, ours beside TensorBoard's pattern.

Run: python benchmarks/bench_bucket.py [--runs 1000] [--live 5] [--records 200] [--refresh 5] [--minutes 3]
     [--reads client|pyarrow] [--scheme s3|gs|az]

A moto S3 server in a subprocess, behind ``metrics_core.testing.buckets.CountingProxy``, holds ``--runs`` runs
under ``s3://runs/exp`` (``--live`` of them live: dated now, a longer copy uploaded at every
refresh, as a job syncing its run with ``aws s3 cp`` does; the rest finished).  Counted at the
proxy, so what a bucket would bill:

* ours: a ``RunStore`` on a ``BucketRoot`` (``--list-interval``), as the dashboard runs it at
  ``--refresh``: every refresh an ``runs_table()`` (the runs page) and a ``view()`` of a live run (a
  run page), on a simulated clock, for ``--minutes`` after the cold load (the first listing and
  the first read of every run, printed apart), reading through the bucket's own client
  (``cloud_reads``: botocore, google-auth, azure-storage-blob); ``--reads pyarrow``:
  as where that client is not installed (``object_reads.ArrowReads``: a HEAD before each GET, and
  pyarrow's listing);
* TensorBoard's pattern: each reload (every ``--refresh`` s, its default is 5 s) lists every
  object and reads each run's file again (a HEAD and a GET per object), whatever ended long ago;
  emulated here with the same client (``pyarrow.fs``), two reloads measured, scaled to a minute.

``--scheme az``: the same against Azurite (``azurite-blob`` on the PATH) under
``az://runs/exp``, reached through ``AZURE_STORAGE_CONNECTION_STRING``.  ``--scheme gs``: against
``gcp-storage-emulator`` under ``gs://runs/exp``, reached through ``STORAGE_EMULATOR_HOST``, its
downloads stating the object's generation as Cloud Storage's do
(``metrics_core.testing.buckets.gcs_emulator_command``).

The clock is simulated so that the count does not depend on how fast this machine is; the
requests are real.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyarrow import fs as pafs

from metrics_core.buckets.addresses import azure_filesystem, bucket_filesystem, gcs_filesystem, parse_bucket_url
from metrics_core.buckets.bucket_runs import discover_bucket_runs
from metrics_core.buckets.cloud_reads import reads_for
from metrics_core.buckets.object_reads import ArrowReads
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.roots.bucket_root import BucketRoot
from metrics_core.testing.buckets import (
    AZURITE_ACCOUNT,
    BUCKET,
    CountingProxy,
    azure_connection_string,
    bucket_run,
    gcs_emulator_command,
    put_object,
)
from metrics_core.testing.live_server import free_port, wait_for_http
from metrics_core.testing.records import base_record, line


def moto(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
    with tempfile.TemporaryFile() as log:
        wait_for_http(f"http://127.0.0.1:{port}/moto-api/", server, log, what="moto")
    return server


def gcs_emulator(port: int) -> subprocess.Popen:
    """The Cloud Storage emulator on ``port``, returned once it answers."""
    server = subprocess.Popen(gcs_emulator_command(port, stating_generation=True), stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT)  # fmt: skip
    with tempfile.TemporaryFile() as log:
        wait_for_http(f"http://127.0.0.1:{port}/storage/v1/b", server, log, what="the Cloud Storage emulator")
    return server


def azurite(port: int, data: str) -> subprocess.Popen:
    """Azurite's blob service on ``port``, returned once it has made the container."""
    command = [shutil.which("azurite-blob") or "azurite-blob", "--blobHost", "127.0.0.1", "--blobPort", str(port),
               "--location", data, "--silent", "--disableTelemetry", "--skipApiVersionCheck"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    use_azure(f"http://127.0.0.1:{port}")
    for _ in range(300):
        try:
            azure_filesystem(parse_bucket_url(f"az://{BUCKET}")).create_dir(BUCKET)
            return server
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.1)
    raise RuntimeError("Azurite did not start")


def use_azure(endpoint: str) -> None:
    """Clients made after this reach Azurite's account at ``endpoint``."""
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = azure_connection_string(f"{endpoint}/{AZURITE_ACCOUNT}")


class ProxyProcess:
    """``CountingProxy`` in a process of its own, asked for its counts over a pipe: pyarrow's Cloud
    Storage client holds the GIL while it waits for some answers, so a proxy thread in this
    process could never give them."""

    def __init__(self, upstream: str) -> None:
        self._pipe, child = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("fork").Process(target=self._serve, args=(upstream, child),
                                                                   daemon=True)  # fmt: skip
        self._process.start()
        self.url = self._pipe.recv()

    @staticmethod
    def _serve(upstream: str, pipe: Connection) -> None:
        proxy = CountingProxy(upstream)
        pipe.send(proxy.url)
        while (command := pipe.recv()) != "close":
            pipe.send(proxy.snapshot() if command == "snapshot" else proxy.reset())
        proxy.close()

    def snapshot(self) -> tuple[Counter, int]:
        self._pipe.send("snapshot")
        return self._pipe.recv()

    def reset(self) -> None:
        self._pipe.send("reset")
        self._pipe.recv()

    def close(self) -> None:
        self._pipe.send("close")
        self._process.join(timeout=10)


def per_minute(counts: Counter, sent: int, minutes: float) -> str:
    kinds = ("list", "head", "get")
    total = sum(counts.values())
    parts = ", ".join(f"{counts[kind] / minutes:,.0f} {kind}" for kind in kinds)
    return f"{total / minutes:9,.0f} requests/min ({parts}), {sent / minutes / 1e6:8.2f} MB/min"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--live", type=int, default=5)
    parser.add_argument("--records", type=int, default=200, help="records per run")
    parser.add_argument("--refresh", type=float, default=5.0)
    parser.add_argument("--list-interval", type=float, default=60.0)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--reads", choices=("client", "pyarrow"), default="client")
    parser.add_argument("--scheme", choices=("s3", "gs", "az"), default="s3")
    args = parser.parse_args()

    port = free_port()
    url = f"{args.scheme}://{BUCKET}/exp"
    if args.scheme == "az":
        server = azurite(port, tempfile.mkdtemp(prefix="bench-azurite-"))
        direct = azure_filesystem(parse_bucket_url(url))
    elif args.scheme == "gs":
        server = gcs_emulator(port)
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        direct = gcs_filesystem()
    else:
        server = moto(port)
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
        direct = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True)
        direct.create_dir(BUCKET)
    proxy = ProxyProcess(f"http://127.0.0.1:{port}")
    os.environ["AWS_ENDPOINT_URL"] = os.environ["STORAGE_EMULATOR_HOST"] = proxy.url
    use_azure(proxy.url)
    try:
        finished = bucket_run(live=False, steps=args.records)
        for number in range(args.runs - args.live):
            put_object(direct, f"exp/done{number:04d}/metrics.jsonl", finished)
        live = {f"exp/live{n}/metrics.jsonl": bucket_run(live=True, steps=args.records) for n in range(args.live)}
        for key, data in live.items():
            put_object(direct, key, data)
        size = len(finished) * (args.runs - args.live) + sum(map(len, live.values()))
        print(f"{args.runs} runs ({args.live} live) of {args.records} records, {size / 1e6:.1f} MB in all; "
              f"refresh every {args.refresh:g} s, listing every {args.list_interval:g} s")  # fmt: skip

        clock = [0.0]
        address = parse_bucket_url(url)
        reads = reads_for(address) if args.reads == "client" else ArrowReads(bucket_filesystem(address))
        print(f"reads: {type(reads).__name__}")
        root = BucketRoot(url, list_interval=args.list_interval, reads=reads, clock=lambda: clock[0])
        store = RunStore(
            root, StoreSettings(safety_interval=args.refresh, load_budget_s=3600.0, clock=lambda: clock[0])
        )
        try:
            store.runs_table()
            counts, sent = proxy.snapshot()
            print(f"ours, cold load (once):     {sum(counts.values()):9,} requests, {sent / 1e6:8.2f} MB")
            proxy.reset()
            refreshes = round(args.minutes * 60 / args.refresh)
            step = 10 * (args.records + 1)
            for _ in range(refreshes):
                clock[0] += args.refresh
                now = datetime.now(timezone.utc).isoformat()
                for key in live:  # each live run's job uploads its longer copy once per refresh
                    live[key] += line(base_record(step, train_loss=0.1, time=now))
                    put_object(direct, key, live[key])
                step += 10
                store.runs_table()
                store.view("live0")
            counts, sent = proxy.snapshot()
            print(f"ours, steady:           {per_minute(counts, sent, args.minutes)}")
        finally:
            store.close()

        proxy.reset()
        filesystem = bucket_filesystem(parse_bucket_url(url))
        reloads = 2
        for _ in range(reloads):  # TensorBoard's reload: list everything, read everything again
            for run in discover_bucket_runs(url, filesystem=filesystem):
                with filesystem.open_input_file(f"{run.location.fs_path}/metrics.jsonl") as file:
                    file.read_at(file.size(), 0)
        counts, sent = proxy.snapshot()
        print(f"TensorBoard's pattern:  {per_minute(counts, sent, reloads * args.refresh / 60)}")
    finally:
        proxy.close()
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
