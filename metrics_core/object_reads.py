"""How a ``RunFile`` in a bucket fetches an object's bytes: ``ObjectReads``, each answer an
``ObjectSlice`` (the bytes with the object's size and version as the same request gave them).

Botocore where it is installed (the ``s3`` extra brings it), one request a read, because a ranged
GET's answer carries the object's size, ETag and Last-Modified with the bytes (``BotocoreReads``);
else pyarrow, whose ``open_input_file`` takes a path, never the size a listing gave, and so sends
a HEAD before each GET (``ArrowReads``).  Google Cloud Storage and Azure Blob Storage are read
with ``ArrowReads`` (a metadata request, Get Blob Properties, before each GET).  Kept apart from
the ``RunFile``s (``object_storage``) because these are the only requests that cost a run's
refresh, and the only code that knows botocore.

Optional, as ``buckets``: ``import metrics_core`` never loads this module.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Protocol

from pyarrow import fs as pafs

from metrics_core.buckets import BucketPath, bucket_filesystem, error_line, s3_filesystem
from metrics_core.errors import RunFileError

PARALLEL_GETS = 8  # parts fetched at once by a read that covers several: a GET's latency, not its bytes, is the cost


def short_digest(*parts: bytes) -> int:
    """A version or key from the parts that define it: 8 bytes of a hash, as an int the cache and
    ``FileStat.identity`` compare."""
    return int.from_bytes(hashlib.blake2b(b"\0".join(parts), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class ObjectSlice:
    """What one request found of an object: its bytes from ``start`` (none for a HEAD), and the
    object's size and version (a digest of its ETag and Last-Modified) at that moment."""

    start: int
    data: bytes
    size: int
    version: int
    opened: object = field(default=None, compare=False, repr=False)  # a client's handle on that version, if any

    @property
    def end(self) -> int:
        return self.start + len(self.data)


class ObjectReads(Protocol):
    """How a ``RunFile`` in a bucket fetches an object: None when no object is there, else a
    ``RunFileError`` naming it when the server refuses (no such bucket, access denied)."""

    def head(self, location: BucketPath) -> ObjectSlice | None:
        """The object's size and version, no bytes."""

    def get(
        self, location: BucketPath, start: int, count: int, *, unless: int | None = None,
        through: ObjectSlice | None = None,
    ) -> ObjectSlice | None:  # fmt: skip
        """Bytes ``[start, start + count)`` of the object, fewer at its end (none when it ends at
        or before ``start``), with its size and version as the same answer gave them; none either
        when its version is still ``unless`` (the one the caller holds), if that saves a request.
        ``through``: an earlier answer whose ``opened`` handle may read the bytes of the version it
        found, if that saves a request (they may be a later version's: the next look says so)."""


class BotocoreReads:
    """``ObjectReads`` in one request each: a ranged GET's answer carries the object's size
    (``Content-Range``), ETag and Last-Modified with the bytes, so a look at a live run that may
    have grown is one request, where pyarrow's client needs a HEAD before every GET (``ArrowReads``)."""

    def __init__(self, client: object) -> None:
        self.client = client

    def head(self, location: BucketPath) -> ObjectSlice | None:
        answer = self._call(location, "head_object")
        if answer is None:
            return None
        return ObjectSlice(answer["ContentLength"], b"", answer["ContentLength"], _version(answer))

    def get(
        self, location: BucketPath, start: int, count: int, *, unless: int | None = None,
        through: ObjectSlice | None = None,
    ) -> ObjectSlice | None:  # fmt: skip
        try:
            answer = self._call(location, "get_object", Range=f"bytes={start}-{start + count - 1}")
        except _NothingThere:  # the object holds no byte at start (shrank below it, or is empty)
            found = self.head(location)
            return None if found is None else ObjectSlice(start, b"", found.size, found.version)
        if answer is None:
            return None
        with answer["Body"] as body:
            data = self._body(location, body)
        ranged = _CONTENT_RANGE.fullmatch(answer.get("ContentRange") or "")
        if ranged is None:  # the whole object (a server that ignores ranges)
            return ObjectSlice(start, data[start : start + count], len(data), _version(answer))
        return ObjectSlice(int(ranged[1]), data, int(ranged[2]), _version(answer))

    def _call(self, location: BucketPath, operation: str, **options: str) -> dict | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(Bucket=location.bucket, Key=location.key, **options)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                return None
            if code == "InvalidRange":
                raise _NothingThere from exc
            raise RunFileError(location.url, f"cannot be read: {error_line(exc)}") from exc
        except BotoCoreError as exc:
            raise RunFileError(location.url, f"cannot be read: {error_line(exc)}") from exc

    @staticmethod
    def _body(location: BucketPath, body: object) -> bytes:
        from botocore.exceptions import BotoCoreError

        try:
            return body.read()
        except BotoCoreError as exc:
            raise RunFileError(location.url, f"cannot be read: {error_line(exc)}") from exc


class _NothingThere(Exception):
    """A ranged GET that starts at or past the object's end (HTTP 416)."""


_CONTENT_RANGE = re.compile(r"bytes (\d+)-\d+/(\d+)")


def _version(answer: dict) -> int:
    headers = answer["ResponseMetadata"]["HTTPHeaders"]
    return short_digest(headers.get("etag", "").encode(), headers.get("last-modified", "").encode())


class ArrowReads:
    """``ObjectReads`` through a ``pyarrow.fs`` client, which opens an object with a HEAD: a HEAD
    and a GET per read (a read of what a HEAD found goes through that HEAD's handle, ``through``).
    The fallback without botocore, and the reads of a filesystem configured otherwise than from
    the environment."""

    def __init__(self, filesystem: pafs.FileSystem) -> None:
        self.filesystem = filesystem

    def head(self, location: BucketPath) -> ObjectSlice | None:
        return self._open(location)

    def get(
        self, location: BucketPath, start: int, count: int, *, unless: int | None = None,
        through: ObjectSlice | None = None,
    ) -> ObjectSlice | None:  # fmt: skip
        found = through if through is not None and through.opened is not None else self._open(location)
        if found is None:
            return None
        count = min(count, found.size - start)
        if count <= 0 or found.version == unless:  # the HEAD said all there is to know
            return ObjectSlice(start, b"", found.size, found.version, found.opened)
        try:
            return ObjectSlice(start, found.opened.read_at(count, start), found.size, found.version, found.opened)
        except OSError as exc:
            raise _read_failure(self.filesystem, location, exc) from exc

    def _open(self, location: BucketPath) -> ObjectSlice | None:
        """The object opened (one HEAD, ``pyarrow``'s only way: ``open_input_file`` takes a path,
        never the size a listing gave); None when nothing is there."""
        try:
            handle = self.filesystem.open_input_file(location.fs_path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RunFileError(location.url, f"cannot be read: {error_line(exc)}") from exc
        # S3 says ETag and Last-Modified, Cloud Storage etag, generation and updated: any change is a new version
        version = short_digest(*(f"{key}={value!r}".encode() for key, value in sorted(handle.metadata().items())))
        return ObjectSlice(handle.size(), b"", handle.size(), version, handle)


def s3_reads() -> ObjectReads:
    """How a runs root reads its objects: one request a read through botocore, configured from the
    same environment as ``s3_filesystem`` (``AWS_ENDPOINT_URL`` with path-style addresses, as
    ``pyarrow`` uses them; AWS's own chain for credentials and region), or ``ArrowReads`` on
    ``s3_filesystem()`` where botocore is not installed."""
    try:
        import botocore.config
        import botocore.session
    except ImportError:
        return ArrowReads(s3_filesystem())
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
    config = botocore.config.Config(
        connect_timeout=10, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"},
        max_pool_connections=2 * PARALLEL_GETS, s3={"addressing_style": "path"} if endpoint else None,
    )  # fmt: skip
    return BotocoreReads(botocore.session.get_session().create_client("s3", endpoint_url=endpoint, config=config))


def object_reads(
    location: BucketPath, filesystem: pafs.FileSystem | None = None, reads: ObjectReads | None = None
) -> ObjectReads:
    """``reads`` if given, else the reads of ``filesystem`` (``ArrowReads``: botocore would not
    share its configuration), else those of the environment for ``location``'s kind of bucket
    (``s3_reads``; Google Cloud Storage's and Azure's through ``pyarrow``: a HEAD before each GET)."""
    if reads is not None:
        return reads
    if filesystem is not None or location.scheme != "s3":
        return ArrowReads(filesystem if filesystem is not None else bucket_filesystem(location))
    return s3_reads()


def _read_failure(filesystem: pafs.FileSystem, location: BucketPath, exc: OSError) -> RunFileError:
    """Why an object that was there could not be read: deleted since (the client's own error for a
    missing object names no object), or the server's refusal."""
    try:
        gone = (
            isinstance(exc, FileNotFoundError)
            or filesystem.get_file_info(location.fs_path).type == pafs.FileType.NotFound
        )
    except OSError:
        gone = False
    if gone:
        return RunFileError(location.url, "vanished while being read (deleted after it was listed)")
    return RunFileError(location.url, f"cannot be read: {error_line(exc)}")
