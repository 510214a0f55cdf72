"""Buckets for tests and benchmarks: the emulators' commands and accounts, whole-object uploads,
a run's bytes as a bucket holds them, and a counting HTTP proxy in front of any of them.

The S3 server is moto's, the Cloud Storage one ``gcp-storage-emulator`` and the Azure one Azurite,
all on loopback ports (.ci/run installs them).
"""

from __future__ import annotations

import http.client
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from metrics_core.testing.records import base_record, line

AZURITE_ACCOUNT = "devstoreaccount1"  # Azurite's well-known account and key (Azure's documentation)
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azure_connection_string(endpoint: str) -> str:
    """A connection string as Azure's portal gives one, for the emulator at ``endpoint``
    (``http://host:port/ACCOUNT``)."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
    )


# The bucket (Azure: the container) every emulator serves runs from.
BUCKET = "runs"


_GCS_STATING_GENERATION = """
import runpy, sys
from gcp_storage_emulator.handlers import objects

plain = objects.download

def download(request, response, storage, *args, **kwargs):
    plain(request, response, storage, *args, **kwargs)
    if response.status.value in (200, 206):
        found = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = found["generation"]
        response["x-goog-metageneration"] = found["metageneration"]

objects.download = download
sys.argv[0] = "gcp_storage_emulator"
runpy.run_module("gcp_storage_emulator", run_name="__main__", alter_sys=True)
"""


def gcs_emulator_command(port: int, *, stating_generation: bool) -> list[str]:
    """``gcp-storage-emulator`` on ``port`` holding the bucket ``BUCKET``, in memory.

    ``stating_generation``: its media downloads state the object's generation and metageneration
    (``x-goog-generation``, ``x-goog-metageneration``), as Cloud Storage's do (google-cloud-storage
    reads them from a download's answer: ``Blob._extract_headers_from_download``) and the emulator's
    own omit; its handler is wrapped to add them from the object's metadata, and nothing else changes."""
    options = ["start", "--host", "127.0.0.1", "--port", str(port), "--in-memory", "--default-bucket", BUCKET]
    if stating_generation:
        return [sys.executable, "-c", _GCS_STATING_GENERATION, *options]
    return [sys.executable, "-m", "gcp_storage_emulator", *options]


def put_object(filesystem: object, key: str, data: bytes) -> None:
    """Replace the object ``key`` of the test bucket with ``data`` as a whole, as ``aws s3 cp`` does."""
    with filesystem.open_output_stream(f"{BUCKET}/{key}") as out:
        out.write(data)


def bucket_run(*, live: bool, steps: int = 5, session: str = "s1") -> bytes:
    """A run's metrics as bytes: ``steps`` train records, ended by a ``session_end`` unless ``live``
    (then the records are dated now, so the record-age rule reads it as live)."""
    now = datetime.now(timezone.utc)
    times = [(now - timedelta(seconds=steps - s)).isoformat(timespec="microseconds") for s in range(steps)]
    records = [base_record(10 * (s + 1), session=session, train_loss=1.0 / (s + 1)) for s in range(steps)]
    if live:
        records = [record | {"time": time} for record, time in zip(records, times, strict=True)]
    if not live:
        records.append(base_record(10 * steps, event="session_end", session=session, status="finished"))
    return b"".join(line(record) for record in records)


_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"))


class CountingProxy:
    """A plain HTTP proxy on 127.0.0.1 in front of an S3-compatible server or Azurite (``upstream``,
    ``http://host:port``), for a client whose ``AWS_ENDPOINT_URL`` (``BlobEndpoint``) is ``url``: forwards every
    request as it came and counts it by kind (``list``: a bucket's listing; ``head`` / ``get``: of
    an object; else the method), with the response bytes.  ``before(kind, key)``, if given, runs
    before a request is forwarded (a test deletes an object between a HEAD and its GET there).
    Shared by the bucket tests and benchmarks/bench_bucket.py."""

    def __init__(self, upstream: str, before: Callable[[str, str], None] | None = None) -> None:
        self.counts: Counter = Counter()
        self.keys: Counter = Counter()  # (kind, key) -> requests
        self.bytes = 0
        self.before = before
        self._lock = threading.Lock()
        target = urlsplit(upstream)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the client keeps its connection, as it does with S3

            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                kind, key = proxy.kind(self.command, self.path)
                if proxy.before is not None:
                    proxy.before(kind, key)
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP}
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                with proxy._lock:  # before the answer: a client that has it finds it counted
                    proxy.counts[kind] += 1
                    proxy.keys[kind, key] += 1
                    proxy.bytes += len(data)
                self.send_response_only(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in _HOP:
                        self.send_header(name, value)
                length = answer.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def kind(method: str, target: str) -> tuple[str, str]:
        """What a request is (path-style addressing: ``/bucket/key?query``; Azure's is
        ``/account/container/key``, so its keys start with the container; Cloud Storage's JSON API
        is ``/storage/v1/b/bucket/o[/key]``, ``alt=media`` for the bytes, else the metadata: a
        ``head``) and the key it names."""
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        gcs = re.fullmatch(r"/(?:download/)?storage/v1/b/[^/]+/o(?:/(.+))?", parts.path)
        if method == "GET" and gcs is not None:
            if gcs[1] is None:
                return "list", ""
            return ("get" if query.get("alt") == ["media"] else "head"), unquote(gcs[1])
        _, _, key = parts.path.lstrip("/").partition("/")
        if method == "GET" and ((not key and "list-type" in query) or query.get("comp") == ["list"]):
            return "list", ""
        return method.lower(), key

    def snapshot(self) -> tuple[Counter, int]:
        """The counts and bytes so far (a copy)."""
        with self._lock:
            return Counter(self.counts), self.bytes

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.keys.clear()
            self.bytes = 0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
