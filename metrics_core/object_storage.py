"""Runs in an S3-compatible bucket: a ``RunFile`` for one object, and run discovery under a prefix.

Optional: needs ``pyarrow`` (the ``s3`` extra; the head node's ``app`` extra has it already), and
``import metrics_core`` never loads this module.  ``pyarrow.fs`` is the client because the read
side already depends on it: no second HTTP stack for the dashboard to install.

Credentials come the way AWS's own tools take them (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, profiles); ``AWS_ENDPOINT_URL`` names an
S3-compatible server (MinIO, moto) and is passed on explicitly.

``ObjectFile`` keeps the ``RunFile`` contract (``metrics_core.storage``) with an object's terms:

* ``stat()`` is one HEAD request.  ``identity`` is the object's ETag, size and Last-Modified, so
  any new upload (``aws s3 cp`` of a longer copy, or of another file) is a change; ``version`` is
  the key, which names the same run whatever is uploaded there.  Whether a change is growth or a
  rewrite is decided as for a file copied over in place: ``lines.LineFollower`` compares the first
  line and the last line it handed out, so a longer object with the same prefix is read from the
  old offset, and a shorter or different one restarts the run from its start.
* ``read(offset, count)`` is one ranged GET of the object as the last HEAD found it (never past
  that size).  An object has no open handle to pin: bytes uploaded between that HEAD and the GET
  are the new object's, and the next ``stat()`` sees the new ETag and the fingerprints decide.
* ``writer_alive()`` is None: no lock crosses a bucket, so status falls back to record ages.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pyarrow import fs as pafs

from metrics_core.errors import RunFileError, RunNotFoundError, RunPathError
from metrics_core.storage import FileStat
from metrics_core.writer import METRICS_FILENAME

SCHEME = "s3"


@dataclass(frozen=True, slots=True)
class BucketPath:
    """An ``s3://bucket/key`` address, split; ``key`` has no leading or trailing ``/``."""

    bucket: str
    key: str

    @property
    def url(self) -> str:
        return f"{SCHEME}://{self.bucket}/{self.key}".rstrip("/")

    @property
    def fs_path(self) -> str:
        """The path ``pyarrow.fs`` takes: ``bucket/key``."""
        return f"{self.bucket}/{self.key}".rstrip("/")

    def child(self, name: str) -> BucketPath:
        return BucketPath(self.bucket, f"{self.key}/{name}".strip("/"))


def parse_bucket_url(url: str) -> BucketPath:
    """``s3://bucket/prefix`` split into bucket and key, or ``RunPathError`` saying why not."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME or not parts.netloc:
        raise RunPathError(f"{url}: not a bucket address (expected {SCHEME}://bucket/prefix)")
    key = parts.path.strip("/")
    if ".." in key.split("/") or parts.query or parts.fragment:
        raise RunPathError(f"{url}: a bucket prefix is a plain key path, without '..', '?' or '#'")
    return BucketPath(parts.netloc, key)


def s3_filesystem() -> pafs.S3FileSystem:
    """A client configured from the standard AWS variables; ``AWS_ENDPOINT_URL`` (an S3-compatible
    server) is read here because the client would otherwise go to AWS itself."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        return pafs.S3FileSystem()
    parts = urlsplit(endpoint)
    return pafs.S3FileSystem(endpoint_override=parts.netloc or parts.path, scheme=parts.scheme or "https")


def _digest(*parts: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(b"\0".join(parts), digest_size=8).digest(), "big")


class ObjectFile:
    """A ``RunFile`` for one object in a bucket; see the module docstring."""

    def __init__(self, url: str | BucketPath, filesystem: pafs.FileSystem | None = None) -> None:
        self.location = url if isinstance(url, BucketPath) else parse_bucket_url(url)
        self.path = Path(self.location.fs_path)
        self.filesystem = filesystem if filesystem is not None else s3_filesystem()
        self._latest: pafs.NativeFile | None = None  # the object as the last HEAD found it
        self._opened = False

    def _head(self) -> pafs.NativeFile | None:
        """One HEAD request: the object now, None when nothing is there; ``RunFileError`` naming
        the object when the server refuses (no such bucket, access denied)."""
        try:
            return self.filesystem.open_input_file(self.location.fs_path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RunFileError(self.location.url, f"cannot be read: {_first_line(exc)}") from exc

    def stat(self) -> FileStat | None:
        head = self._head()
        if head is None:
            return None
        self._latest = head
        meta = head.metadata()
        identity = _digest(meta.get("ETag", b""), meta.get("Last-Modified", b""))
        return FileStat((identity, head.size()), 0, head.size())

    def open(self) -> None:
        if self._latest is None:
            self._latest = self._head()
        if self._latest is None:
            raise RunFileError(self.location.url, "no such object")
        self._opened = True

    @property
    def opened_version(self) -> int | None:
        return 0 if self._opened else None

    def size(self) -> int:
        return self._latest.size()

    def read(self, offset: int, count: int) -> bytes:
        count = min(count, self._latest.size() - offset)
        if count <= 0:
            return b""
        try:
            return self._latest.read_at(count, offset)
        except OSError as exc:
            raise RunFileError(self.location.url, f"cannot be read: {_first_line(exc)}") from exc

    def writer_alive(self) -> bool | None:
        return None

    def cache_key(self) -> str | None:
        """The object's address (appends keep it; the cache's fingerprints catch a rewrite)."""
        if not self._opened:
            return None
        return f"s3-{_digest(self.location.url.encode()):016x}"

    def close(self) -> None:
        self._opened = False
        self._latest = None


@dataclass(frozen=True, slots=True)
class BucketRun:
    """A run found under a bucket prefix: its name relative to the prefix, its address, and its
    object's size and modification time as the listing gave them (free: no request per run)."""

    name: str
    location: BucketPath
    size: int = 0
    mtime_ns: int = 0

    @property
    def metrics_url(self) -> str:
        return self.location.child(METRICS_FILENAME).url

    def file(self, filesystem: pafs.FileSystem | None = None) -> ObjectFile:
        return ObjectFile(self.location.child(METRICS_FILENAME), filesystem)


def discover_bucket_runs(
    root: str, *, filesystem: pafs.FileSystem | None = None, max_depth: int = 6
) -> list[BucketRun]:
    """Every ``<prefix>/<run>/metrics.jsonl`` under ``root`` (``s3://bucket/prefix``), named by the
    run's key relative to the prefix, as ``runs.discover_runs`` names directories: hidden path
    parts (``.git``, ``.cache``) are skipped, and nothing deeper than ``max_depth``.

    Cost: one recursive listing (ListObjectsV2, a request per 1,000 keys), no request per run.
    An empty prefix is a root with no runs (a bucket has no directories); a missing bucket or a
    refused listing is ``RunNotFoundError`` naming the root.
    """
    location = parse_bucket_url(root)
    filesystem = filesystem if filesystem is not None else s3_filesystem()
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(location.fs_path, recursive=True))
    except FileNotFoundError:
        return []  # nothing under the prefix (a missing bucket is another error: no such bucket)
    except OSError as exc:
        raise RunNotFoundError(f"{location.url}: the runs root cannot be listed: {_first_line(exc)}") from exc
    base = len(location.fs_path) + 1
    runs = []
    for info in infos:
        if info.type != pafs.FileType.File or info.base_name != METRICS_FILENAME:
            continue
        parts = info.path[base:].split("/")[:-1]
        if len(parts) > max_depth or any(part.startswith(".") for part in parts):
            continue
        name = "/".join(parts) or "."
        runs.append(BucketRun(name, location.child("/".join(parts)), info.size or 0, info.mtime_ns or 0))
    return sorted(runs, key=lambda run: run.name)


def _first_line(exc: BaseException) -> str:
    """The first line of a client error: the refusal stays one line."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
