"""Runs in an S3-compatible bucket: a ``RunFile`` for one object or for a run uploaded in parts,
and run discovery under a prefix.

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

A run uploaded as it grows (``python -m metrics_core sync``, ``metrics_core.sync``) is a prefix of
immutable parts, ``<run>/metrics.jsonl.parts/<offset>.jsonl``: ``<offset>`` is the part's first
byte in the run's file, 16 decimal digits zero-padded (name order is offset order), each part
holds complete lines only, and the parts in name order concatenate to the file's complete lines.
``PartsFile`` reads that concatenation as one file, under the same rules as ``ObjectFile``:

* ``stat()`` is one listing of the parts prefix; ``identity`` is the list of parts (names, sizes,
  Last-Modified), so a new part is a change and ``LineFollower`` reads on from its offset.
* ``read(offset, count)`` is a ranged GET of each part the range covers (a HEAD the first time a
  part is read: the client's price for opening an object), in parallel when it covers several.
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
import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pyarrow import fs as pafs

from metrics_core.errors import RunFileError, RunNotFoundError, RunPathError
from metrics_core.storage import FileStat
from metrics_core.writer import METRICS_FILENAME

SCHEME = "s3"
PARTS_DIRNAME = METRICS_FILENAME + ".parts"
_PART_NAME = re.compile(r"(\d{16})\.jsonl")
_KEPT_HANDLES = 8  # opened parts kept from one listing to the next besides the first: the newest
_PARALLEL_GETS = 8  # parts fetched at once by a read that covers several: a GET's latency, not its bytes, is the cost


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
        return f"s3-{_digest(self.location.url.encode()):016x}"


class ObjectFile(_InBucket):
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

    def size(self) -> int:
        return self._latest.size()

    def read(self, offset: int, count: int) -> bytes:
        count = min(count, self._latest.size() - offset)
        if count <= 0:
            return b""
        try:
            return self._latest.read_at(count, offset)
        except OSError as exc:
            raise _read_failure(self.filesystem, self.location, exc) from exc

    def close(self) -> None:
        self._opened = False
        self._latest = None


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
    other names there are not parts and are ignored.  ``RunFileError`` naming the prefix when the
    listing is refused (no such bucket, wrong credentials), a part is missing from the middle, or
    two parts overlap."""
    try:  # recursive: a missing bucket is then an error, where a flat listing reports nothing
        infos = filesystem.get_file_info(pafs.FileSelector(parts.fs_path, recursive=True))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RunFileError(parts.url, f"cannot be listed: {_first_line(exc)}") from exc
    depth = parts.fs_path.count("/") + 1
    found = []
    for info in infos:
        match = _PART_NAME.fullmatch(info.base_name)
        if match and info.type == pafs.FileType.File and info.path.count("/") == depth:
            found.append(Part(int(match[1]), info.size, info.mtime_ns or 0))
    found.sort(key=lambda part: part.start)
    end = 0
    for part in found:
        if part.start > end:
            raise RunFileError(parts.url, f"part {part_name(end)} is missing: nothing holds bytes {end:,} to "
                                          f"{part.start:,} (the next part is {part_name(part.start)})")  # fmt: skip
        if part.start < end:
            raise RunFileError(parts.url, f"part {part_name(part.start)} overlaps the part before it, which "
                                          f"ends at byte {end:,}")  # fmt: skip
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
        raise RunFileError(location.url, f"cannot be uploaded: {_first_line(exc)}") from exc
    return location


class PartsFile(_InBucket):
    """A ``RunFile`` for a run uploaded in parts under ``run`` (its prefix); see the module docstring."""

    def __init__(self, run: str | BucketPath, filesystem: pafs.FileSystem | None = None) -> None:
        run = run if isinstance(run, BucketPath) else parse_bucket_url(run)
        self.location = run.child(PARTS_DIRNAME)
        self.path = Path(self.location.fs_path)
        self.filesystem = filesystem if filesystem is not None else s3_filesystem()
        self._parts: list[Part] = []  # as the last listing found them
        self._starts: list[int] = []
        self._size = 0
        self._torn: Part | None = None  # a part found to end mid-line: the file ends with it
        self._handles: dict[Part, pafs.NativeFile] = {}  # opened parts (a HEAD each), immutable: kept a while
        self._opened = False

    def stat(self) -> FileStat | None:
        parts = list_parts(self.filesystem, self.location)
        if not parts:
            return None
        self._parts, self._starts = parts, [part.start for part in parts]
        kept = {parts[0], *parts[-_KEPT_HANDLES:]}  # where the follower's fingerprints are read again
        self._handles = {part: handle for part, handle in self._handles.items() if part in kept}
        if self._torn not in parts:
            self._torn = None  # replaced or deleted: read on
        self._size = self._torn.end if self._torn is not None else parts[-1].end
        identity = _digest(*(f"{part.start}:{part.size}:{part.modified_ns}".encode() for part in parts))
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
            with ThreadPoolExecutor(min(len(pieces), _PARALLEL_GETS)) as pool:
                chunks = list(pool.map(lambda piece: self._read_part(*piece), pieces))
        else:
            chunks = [self._read_part(*piece) for piece in pieces]
        for number, ((part, at, take), chunk) in enumerate(zip(pieces, chunks, strict=True)):
            if at + take == part.size and part is not self._parts[-1] and not chunk.endswith(b"\n"):
                self._torn, self._size = part, part.end
                return b"".join(chunks[: number + 1])
        return b"".join(chunks)

    def _read_part(self, part: Part, at: int, count: int) -> bytes:
        location = self.location.child(part_name(part.start))
        try:
            handle = self._handles.get(part)
            if handle is None:
                handle = self._handles[part] = self.filesystem.open_input_file(location.fs_path)
            data = handle.read_at(count, at)
        except OSError as exc:
            raise _read_failure(self.filesystem, location, exc) from exc
        if len(data) != count:
            raise RunFileError(location.url, f"was replaced while being read: {len(data):,} bytes at offset "
                                             f"{at:,} where the listing promised {count:,}")  # fmt: skip
        return data

    def close(self) -> None:
        self._opened = False
        self._handles = {}


@dataclass(frozen=True, slots=True)
class BucketRun:
    """A run found under a bucket prefix: its name relative to the prefix, its address, whether it
    was uploaded in parts (``metrics.jsonl.parts/``) rather than as one ``metrics.jsonl``, and its
    size and modification time as the listing gave them (free: no request per run; for parts, their
    total size and the newest part's time)."""

    name: str
    location: BucketPath
    parts: bool = False
    size: int = 0
    mtime_ns: int = 0

    @property
    def metrics_url(self) -> str:
        return self.location.child(PARTS_DIRNAME if self.parts else METRICS_FILENAME).url

    def file(self, filesystem: pafs.FileSystem | None = None) -> ObjectFile | PartsFile:
        return open_bucket_run(filesystem if filesystem is not None else s3_filesystem(), self)


def open_bucket_run(filesystem: pafs.FileSystem, run: BucketRun | BucketPath | str) -> ObjectFile | PartsFile:
    """The ``RunFile`` of the run at ``run`` (its prefix, ``s3://bucket/prefix/RUN``): a
    ``PartsFile`` when it holds ``metrics.jsonl.parts/`` (what ``sync`` uploads; it wins over a
    ``metrics.jsonl`` beside it, a whole copy that stopped growing), else an ``ObjectFile`` of its
    ``metrics.jsonl``.  A ``BucketRun`` (``discover_bucket_runs``) knows which at no cost; an
    address costs one flat listing of the run's prefix, and a prefix with neither yet is taken as
    a run awaiting its ``metrics.jsonl``."""
    if isinstance(run, BucketRun):
        location, parts = run.location, run.parts
    else:
        location = run if isinstance(run, BucketPath) else parse_bucket_url(run)
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(location.fs_path))
        except FileNotFoundError:
            infos = []
        except OSError as exc:
            raise RunNotFoundError(f"{location.url}: the run cannot be listed: {_first_line(exc)}") from exc
        parts = any(info.base_name == PARTS_DIRNAME and info.type == pafs.FileType.Directory for info in infos)
    if parts:
        return PartsFile(location, filesystem)
    return ObjectFile(location.child(METRICS_FILENAME), filesystem)


def discover_bucket_runs(
    root: str, *, filesystem: pafs.FileSystem | None = None, max_depth: int = 6
) -> list[BucketRun]:
    """Every ``<prefix>/<run>/metrics.jsonl`` or ``<prefix>/<run>/metrics.jsonl.parts/`` under
    ``root`` (``s3://bucket/prefix``), named by the run's key relative to the prefix, as
    ``runs.discover_runs`` names directories: hidden path parts (``.git``, ``.cache``) are
    skipped, and nothing deeper than ``max_depth``.

    Cost: one recursive listing (ListObjectsV2, a request per 1,000 keys: a run's parts count), no
    request per run.  An empty prefix is a root with no runs (a bucket has no directories); a
    missing bucket or a refused listing is ``RunNotFoundError`` naming the root.
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
    found: dict[tuple[str, bool], tuple[int, int]] = {}  # (name, in parts) -> (size, newest mtime)
    for info in infos:
        key = info.path[base:].split("/")
        if info.type != pafs.FileType.File:
            continue
        if info.base_name == METRICS_FILENAME:
            parts, in_parts = key[:-1], False
        elif len(key) >= 2 and key[-2] == PARTS_DIRNAME:
            parts, in_parts = key[:-2], True
        else:
            continue
        if len(parts) > max_depth or any(part.startswith(".") for part in parts):
            continue
        size, mtime_ns = found.get(("/".join(parts), in_parts), (0, 0))
        found["/".join(parts), in_parts] = (size + (info.size or 0), max(mtime_ns, info.mtime_ns or 0))
    runs: dict[str, BucketRun] = {}
    for (path, in_parts), (size, mtime_ns) in sorted(found.items(), key=lambda item: item[0][1]):
        name = path or "."
        runs[name] = BucketRun(name, location.child(path), in_parts, size, mtime_ns)  # parts come last: they win
    return sorted(runs.values(), key=lambda run: run.name)


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
    return RunFileError(location.url, f"cannot be read: {_first_line(exc)}")


_NOISE = re.compile(r"<!\[CDATA\[|\]\]>| \(Request ID: [^)]*\)")  # XML quoting and request ids of S3 errors


def _first_line(exc: BaseException) -> str:
    """The first line of a client error, without the server's XML quoting: the refusal stays one line."""
    text = _NOISE.sub("", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__
