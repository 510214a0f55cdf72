"""How a ``RunFile`` in a bucket fetches an object's bytes: ``ObjectReads``, each answer an
``ObjectSlice`` (the bytes with the object's size and version as the same request gave them).

Two shapes of reads.  Each cloud's own client (``cloud_reads``) reads in one request, because a
ranged GET's answer carries the object's total size (``Content-Range``) and version with the
bytes (``OneRequestReads``, the part they share).  pyarrow's client (``ArrowReads``, the fallback
where a cloud's client is not installed) opens an object with a HEAD: its ``open_input_file``
takes a path, never the size a listing gave, so a HEAD (on Azure, Get Blob Properties) comes
before each GET.  A client that lists a root in fewer requests than pyarrow's says so
(``FlatListing``).

Kept apart from the ``RunFile``s (``object_storage``) because these are the only requests that
cost a run's refresh.

Optional, as ``buckets``: ``import metrics_core`` never loads this module.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pyarrow import fs as pafs

from metrics_core.buckets.addresses import BucketPath, error_line
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
        self,
        location: BucketPath,
        start: int,
        count: int,
        *,
        unless: int | None = None,
        through: ObjectSlice | None = None,
    ) -> ObjectSlice | None:
        """Bytes ``[start, start + count)`` of the object, fewer at its end (none when it ends at
        or before ``start``), with its size and version as the same answer gave them; none either
        when its version is still ``unless`` (the one the caller holds), if that saves a request.
        ``through``: an earlier answer whose ``opened`` handle may read the bytes of the version it
        found, if that saves a request (they may be a later version's: the next look says so)."""


class OneRequestReads(ABC):
    """``ObjectReads`` in one request each, the shape every cloud's own client shares: a ranged
    GET's answer carries the object's total size (``Content-Range``) and version with the bytes,
    so a look at a live run that may have grown is one request, where pyarrow's client needs a HEAD
    before every GET (``ArrowReads``).  A start at or past the object's end (HTTP 416: it shrank
    below it, or is empty) is answered by a HEAD.  A client says how to make both requests."""

    @abstractmethod
    def head(self, location: BucketPath) -> ObjectSlice | None:
        """The object's size and version, no bytes (``ObjectReads.head``)."""

    @abstractmethod
    def _ranged(self, location: BucketPath, start: int, count: int) -> ObjectSlice | None:
        """One GET of bytes ``[start, start + count)``; ``NothingThere`` when none is there."""

    def get(
        self,
        location: BucketPath,
        start: int,
        count: int,
        *,
        unless: int | None = None,
        through: ObjectSlice | None = None,
    ) -> ObjectSlice | None:
        try:
            return self._ranged(location, start, count)
        except NothingThere:
            found = self.head(location)
            return None if found is None else ObjectSlice(start, b"", found.size, found.version)


class NothingThere(Exception):
    """A ranged GET that starts at or past the object's end (HTTP 416)."""


_CONTENT_RANGE = re.compile(r"bytes (\d+)-\d+/(\d+)")


def ranged_answer(start: int, count: int, data: bytes, content_range: str | None, version: int) -> ObjectSlice:
    """What a ranged GET answered: ``data`` from the start ``Content-Range`` states, and the total
    size it states; a server that ignores ranges answers the whole object."""
    ranged = _CONTENT_RANGE.fullmatch(content_range or "")
    if ranged is None:
        return ObjectSlice(start, data[start : start + count], len(data), version)
    return ObjectSlice(int(ranged[1]), data, int(ranged[2]), version)


@dataclass(frozen=True, slots=True)
class Listed:
    """An object a flat listing found: its key relative to the listed prefix, size and modification time."""

    key: str
    size: int
    mtime_ns: int


@runtime_checkable
class FlatListing(Protocol):
    """Reads that also list a prefix flat, in fewer requests than pyarrow's client (``AzureReads``)."""

    def listing(self, location: BucketPath) -> list[Listed]:
        """Every object under ``location``'s prefix; ``FileNotFoundError`` when its bucket is
        missing, ``OSError`` when the listing is refused."""


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
        self,
        location: BucketPath,
        start: int,
        count: int,
        *,
        unless: int | None = None,
        through: ObjectSlice | None = None,
    ) -> ObjectSlice | None:
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
