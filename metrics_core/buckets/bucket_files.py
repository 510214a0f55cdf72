"""A run's file in a bucket (S3-compatible, Google Cloud Storage, or an Azure Blob Storage container):
a ``RunFile`` for one object or for a run uploaded in parts (``bucket_runs`` finds the runs).

Optional, as ``buckets``: ``import metrics_core`` never loads this module.  ``pyarrow.fs`` lists
and uploads, because the read side already depends on it; bytes are fetched through
``object_reads.ObjectReads``.

``ObjectFile`` keeps the ``RunFile`` contract (``metrics_core.read.run_file``) with an object's terms:

* ``stat()`` is one request.  Before anything was read to the object's end it is a HEAD; after,
  it is a ranged GET from the start of the last complete line read (the overlap) on, up to
  ``line_follower.READ_CHUNK``: its answer gives the object's size and version, and holds both the bytes
  ``line_follower.LineFollower`` looks at to check a rewrite (that last line) and the new bytes after it,
  so a live run costs one request a refresh whether it grew or not (a start past the end, HTTP
  416: the object shrank below it, answered by a HEAD).  ``identity`` is the object's ETag and
  Last-Modified and its size, so any new upload (``aws s3 cp`` of a longer copy, or of another
  file) is a change; ``version`` is the key, which names the same run whatever is uploaded there.
* Whether a change is growth or a rewrite is decided as for a file copied over in place:
  ``LineFollower`` compares the last line it handed out and the first line, so a longer object
  with the same prefix is read from the old offset, and a shorter or different one restarts the
  run from its start.  The first line is not fetched again for that: when the new version holds
  the last complete line read, byte for byte at its offset, the first bytes read before are taken
  as its own.  So a copy that keeps that line but changed earlier bytes is read as an append: the
  records read before stay as they were read (a local file's follower would also compare the
  first line; either misses a change between the two lines).  A copy whose last line read
  changed, or that ends before it, fetches its first bytes again and is read from its start.
* ``read(offset, count)`` is answered from the bytes ``stat`` fetched when it can, else one ranged
  GET of the object as the last ``stat`` found it (never past that size).  An object has no open
  handle to pin: bytes uploaded between that ``stat`` and the GET are the new object's, and the
  next ``stat()`` sees the new version.
* ``writer_alive()`` is None: no lock crosses a bucket, so status falls back to record ages.

A run uploaded as it grows (``python -m metrics_core sync``, ``metrics_core.buckets.sync``) is a prefix of
immutable parts, ``<run>/metrics.jsonl.parts/<offset>.jsonl``: ``<offset>`` is the part's first
byte in the run's file, 16 decimal digits zero-padded (name order is offset order), each part
holds complete lines only, and the parts in name order concatenate to the file's complete lines.
``PartsFile`` reads that concatenation as one file, under the same rules as ``ObjectFile``:

* ``stat()`` is one listing of the parts prefix; ``identity`` is the list of parts (names, sizes,
  Last-Modified), so a new part is a change and ``LineFollower`` reads on from its offset.
* ``read(offset, count)`` is a ranged GET of each part the range covers, in parallel when it
  covers several, except for what is kept of parts already read: a part is immutable, so the
  first part's first bytes and the last line of the last part read, which the follower looks at
  again at each change, hold while the listing shows the part alike.  A refresh that finds no
  new part is one listing; one that finds a part adds its GET (with ``ArrowReads``, a HEAD too).
* A part missing from the middle (a gap between one part's end and the next part's name) or two
  parts overlapping is a ``RunFileError`` naming the offset: the bytes after it are not the file's.
* A part that ends mid-line is torn (whoever uploaded it cut a line): the file ends with it, like
  a torn tail, so its incomplete line is not taken until a complete part replaces it, and nothing
  after it is read (a part never continues another's line).  Knowing costs no request: the read
  that reaches a part's last byte sees it, and ``LineFollower`` takes a short read as the end.
* A part that disappears between the listing and its GET is a ``RunFileError`` saying it vanished.
"""

from __future__ import annotations

import bisect
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pyarrow import fs as pafs

from metrics_core.buckets.addresses import BucketPath, bucket_filesystem, error_line, parse_bucket_url
from metrics_core.buckets.addresses import s3_filesystem as s3_filesystem  # README's example imports it from here
from metrics_core.buckets.cloud_reads import reads_for
from metrics_core.buckets.object_reads import PARALLEL_GETS, ObjectReads, ObjectSlice, short_digest
from metrics_core.errors import RunFileError
from metrics_core.read.line_follower import READ_CHUNK
from metrics_core.read.run_file import FileStat
from metrics_core.write.writer import METRICS_FILENAME

PARTS_DIRNAME = METRICS_FILENAME + ".parts"
_PART_NAME = re.compile(r"(\d{16})\.jsonl")
SMALL_READ = 4096  # a read this short is a follower's look at a line (``line_follower.LineFollower``'s checks)


class _InBucket:
    """What a ``RunFile`` in a bucket answers whatever it holds: an address names one run, and no
    writer's lock crosses a bucket."""

    location: BucketPath
    _opened: bool

    @property
    def opened_version(self) -> int | None:
        return 0 if self._opened else None

    def writer_alive(self) -> bool | None:
        return None

    def cache_key(self) -> str | None:
        """The address (appends keep it; the cache's fingerprints catch a rewrite)."""
        if not self._opened:
            return None
        return f"{self.location.scheme}-{short_digest(self.location.url.encode()):016x}"


class ObjectFile(_InBucket):
    """A ``RunFile`` for one object in a bucket; see the module docstring."""

    def __init__(
        self, url: str | BucketPath, filesystem: pafs.FileSystem | None = None, *, reads: ObjectReads | None = None
    ) -> None:
        self.location = url if isinstance(url, BucketPath) else parse_bucket_url(url)
        self.path = Path(self.location.fs_path)
        self.reads = reads_for(self.location, filesystem, reads)
        self._found: ObjectSlice | None = None  # the object as the last stat() found it
        self._tail: ObjectSlice | None = None  # its bytes from the last complete line read to its end
        self._head = b""  # its first bytes as read, or carried over from the version before (stat)
        self._opened = False

    def stat(self) -> FileStat | None:
        """A HEAD while nothing was read to the object's end; then a GET from the last complete line
        read (the overlap) on, which answers the size and version too: see the module docstring."""
        tail = self._tail if self._found is not None and self._tail is not None else None
        if tail is None:
            found = self.reads.head(self.location)
        else:
            found = self.reads.get(self.location, tail.start, READ_CHUNK, unless=self._found.version)
        if found is None:
            return None
        if self._found is None or found.version != self._found.version:
            seen = b"" if tail is None else tail.data[: tail.data.rfind(b"\n") + 1]
            if not seen or not found.data.startswith(seen):
                self._head = b""  # not known to extend what was read: its first bytes are read again
            self._found, self._tail = found, found if found.data else None
        return FileStat((found.version, found.size), 0, found.size)

    def open(self) -> None:
        if self._found is None:
            self._found = self.reads.head(self.location)
        if self._found is None:
            raise RunFileError(self.location.url, "no such object")
        self._opened = True

    def size(self) -> int:
        return self._found.size

    def read(self, offset: int, count: int) -> bytes:
        """Bytes of the object as the last ``stat`` found it, from what was fetched when they are
        there, else by one GET; a short look at a line past the start fetches the rest of the
        object with it (when a run grew, the follower's look at its last line and the new bytes)."""
        size = self._found.size
        count = min(count, size - offset)
        if count <= 0:
            return b""
        if offset == 0 and count <= len(self._head):
            return self._head[:count]
        known = self._tail
        if known is None or not known.start <= offset <= offset + count <= known.end:
            wanted = size - offset if offset > 0 and count <= SMALL_READ and size - offset <= READ_CHUNK else count
            known = self.reads.get(self.location, offset, wanted, through=self._found)
            if known is None:
                raise RunFileError(self.location.url, "vanished while being read (deleted after it was listed)")
            if known.version != self._found.version:  # replaced since the stat: the next stat says so
                return known.data[:count]
        data = known.data[offset - known.start : offset - known.start + count]
        if offset == 0:
            self._head = data[:SMALL_READ]
        if offset + count == known.end == size:
            self._tail = _from_last_line(known)
        return data

    def close(self) -> None:
        self._opened = False
        self._head = b""  # a follower closes to start again: what it compares then is fetched anew


def _from_last_line(found: ObjectSlice) -> ObjectSlice:
    """``found`` from the start of its last complete line on (whole when it holds none): the bytes a
    follower looks at again, and the overlap of the next ``ObjectFile.stat``."""
    start = found.data.rfind(b"\n", 0, max(found.data.rfind(b"\n"), 0)) + 1
    return ObjectSlice(found.start + start, found.data[start:], found.size, found.version)


def part_name(offset: int) -> str:
    """The name of the part that starts at byte ``offset`` of the run's file."""
    return f"{offset:016d}.jsonl"


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a run uploaded in parts: bytes ``[start, start + size)`` of the run's file."""

    start: int
    size: int
    modified_ns: int  # Last-Modified (a second's resolution): with the size, tells a replaced part

    @property
    def end(self) -> int:
        return self.start + self.size


def list_parts(filesystem: pafs.FileSystem, parts: BucketPath) -> list[Part]:
    """The parts under ``parts`` (a run's ``metrics.jsonl.parts``) in offset order, in one listing;
    other names there are not parts and are ignored, and so is an empty part: it holds no byte, and
    it is what an upload to Azure that did not complete leaves (pyarrow's Azure client creates the
    blob empty when it opens it, and commits its bytes when it closes).  ``RunFileError`` naming the prefix when the
    listing is refused (no such bucket, wrong credentials), a part is missing from the middle, or
    two parts overlap."""
    try:  # recursive: a missing bucket is then an error, where a flat listing reports nothing
        infos = filesystem.get_file_info(pafs.FileSelector(parts.fs_path, recursive=True))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RunFileError(parts.url, f"cannot be listed: {error_line(exc)}") from exc
    depth = parts.fs_path.count("/") + 1
    found = []
    for info in infos:
        match = _PART_NAME.fullmatch(info.base_name)
        if match and info.type == pafs.FileType.File and info.size and info.path.count("/") == depth:
            found.append(Part(int(match[1]), info.size, info.mtime_ns or 0))
    found.sort(key=lambda part: part.start)
    end = 0
    for part in found:
        if part.start > end:
            raise RunFileError(
                parts.url,
                f"part {part_name(end)} is missing: nothing holds bytes {end:,} to "
                f"{part.start:,} (the next part is {part_name(part.start)})",
            )
        if part.start < end:
            raise RunFileError(
                parts.url, f"part {part_name(part.start)} overlaps the part before it, which ends at byte {end:,}"
            )
        end = part.end
    return found


def upload_part(filesystem: pafs.FileSystem, parts: BucketPath, offset: int, data: bytes) -> BucketPath:
    """Upload ``data`` (complete lines, bytes from ``offset`` on) as the part at ``offset``.

    The object appears whole when the upload completes, or not at all: a process killed during
    it leaves no part.  ``data`` is written in one call, so that nothing can stop the upload
    between two writes, when closing the stream would complete a part with what was written."""
    location = parts.child(part_name(offset))
    try:
        with filesystem.open_output_stream(location.fs_path) as out:
            out.write(data)
    except OSError as exc:
        raise RunFileError(location.url, f"cannot be uploaded: {error_line(exc)}") from exc
    return location


class PartsFile(_InBucket):
    """A ``RunFile`` for a run uploaded in parts under ``run`` (its prefix); see the module docstring."""

    def __init__(
        self, run: str | BucketPath, filesystem: pafs.FileSystem | None = None, *, reads: ObjectReads | None = None
    ) -> None:
        run = run if isinstance(run, BucketPath) else parse_bucket_url(run)
        self.location = run.child(PARTS_DIRNAME)
        self.path = Path(self.location.fs_path)
        self.reads = reads_for(self.location, filesystem, reads)
        self.filesystem = filesystem if filesystem is not None else bucket_filesystem(self.location)
        self._parts: list[Part] = []  # as the last listing found them
        self._starts: list[int] = []
        self._size = 0
        self._torn: Part | None = None  # a part found to end mid-line: the file ends with it
        self._first: tuple[Part, int, bytes] | None = None  # the first part's first bytes (part, at, bytes)
        self._last: tuple[Part, int, bytes] | None = None  # of the last part read to its end, its last line on
        self._opened = False

    def stat(self) -> FileStat | None:
        parts = list_parts(self.filesystem, self.location)
        if not parts:
            return None
        self._parts, self._starts = parts, [part.start for part in parts]
        listed = set(parts)  # a part is immutable: what was read of it holds while it is listed alike
        self._first = self._first if self._first is not None and self._first[0] in listed else None
        self._last = self._last if self._last is not None and self._last[0] in listed else None
        if self._torn not in parts:
            self._torn = None  # replaced or deleted: read on
        self._size = self._torn.end if self._torn is not None else parts[-1].end
        identity = short_digest(*(f"{part.start}:{part.size}:{part.modified_ns}".encode() for part in parts))
        return FileStat((identity, self._size), 0, self._size)

    def open(self) -> None:
        if not self._parts and self.stat() is None:
            raise RunFileError(self.location.url, "no parts")
        self._opened = True

    @property
    def parts(self) -> list[Part]:
        """The parts as the last ``stat()`` listed them, in offset order."""
        return self._parts

    def size(self) -> int:
        return self._size

    def read(self, offset: int, count: int) -> bytes:
        """The bytes of ``[offset, offset + count)`` that the listed parts hold, ending early at
        the end of a torn part."""
        end = min(offset + count, self._size)
        pieces = []
        index = bisect.bisect_right(self._starts, offset) - 1
        while offset < end:
            part = self._parts[index]
            take = min(end, part.end) - offset
            pieces.append((part, offset - part.start, take))
            offset += take
            index += 1
        if len(pieces) > 1:
            with ThreadPoolExecutor(min(len(pieces), PARALLEL_GETS)) as pool:
                chunks = list(pool.map(lambda piece: self._read_part(*piece), pieces))
        else:
            chunks = [self._read_part(*piece) for piece in pieces]
        for number, ((part, at, take), chunk) in enumerate(zip(pieces, chunks, strict=True)):
            if at == 0 and part == self._parts[0]:
                self._first = part, 0, chunk[:SMALL_READ]
            if at + take == part.size:
                line = chunk.rfind(b"\n", 0, max(len(chunk) - 1, 0)) + 1
                self._last = part, at + line, chunk[line:]
                if part is not self._parts[-1] and not chunk.endswith(b"\n"):
                    self._torn, self._size = part, part.end
                    return b"".join(chunks[: number + 1])
        return b"".join(chunks)

    def _read_part(self, part: Part, at: int, count: int) -> bytes:
        """Bytes of one part: from what was kept of it (the follower's looks at the first bytes and
        at the last line read cost nothing), else one GET."""
        for kept in (self._first, self._last):
            if kept is not None and kept[0] == part and kept[1] <= at and at + count <= kept[1] + len(kept[2]):
                return kept[2][at - kept[1] : at - kept[1] + count]
        location = self.location.child(part_name(part.start))
        found = self.reads.get(location, at, count)
        if found is None:
            raise RunFileError(location.url, "vanished while being read (deleted after it was listed)")
        data = found.data
        if len(data) != count:
            raise RunFileError(
                location.url,
                f"was replaced while being read: {len(data):,} bytes at offset "
                f"{at:,} where the listing promised {count:,}",
            )
        return data

    def close(self) -> None:
        self._opened = False
