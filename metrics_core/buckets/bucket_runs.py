"""Which runs are under a bucket prefix, and the ``RunFile`` of one: an ``ObjectFile`` of its
``metrics.jsonl`` or a ``PartsFile`` of the parts ``sync`` uploads (``bucket_files``).

Optional, as ``buckets``: ``import metrics_core`` never loads this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyarrow import fs as pafs

from metrics_core.buckets.addresses import BucketPath, bucket_filesystem, error_line, parse_bucket_url
from metrics_core.buckets.bucket_files import PARTS_DIRNAME, ObjectFile, PartsFile
from metrics_core.buckets.object_reads import FlatListing, Listed, ObjectReads
from metrics_core.errors import RunNotFoundError
from metrics_core.write.writer import METRICS_FILENAME


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

    def file(
        self, filesystem: pafs.FileSystem | None = None, *, reads: ObjectReads | None = None
    ) -> ObjectFile | PartsFile:
        return open_bucket_run(
            filesystem if filesystem is not None else bucket_filesystem(self.location), self, reads=reads
        )


def open_bucket_run(
    filesystem: pafs.FileSystem, run: BucketRun | BucketPath | str, *, reads: ObjectReads | None = None
) -> ObjectFile | PartsFile:
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
            raise RunNotFoundError(f"{location.url}: the run cannot be listed: {error_line(exc)}") from exc
        parts = any(info.base_name == PARTS_DIRNAME and info.type == pafs.FileType.Directory for info in infos)
    if parts:
        return PartsFile(location, filesystem, reads=reads)
    return ObjectFile(location.child(METRICS_FILENAME), filesystem, reads=reads)


def discover_bucket_runs(
    root: str, *, filesystem: pafs.FileSystem | None = None, reads: ObjectReads | None = None, max_depth: int = 6
) -> list[BucketRun]:
    """Every ``<prefix>/<run>/metrics.jsonl`` or ``<prefix>/<run>/metrics.jsonl.parts/`` under
    ``root`` (``s3://bucket/prefix``), named by the run's key relative to the prefix, as
    ``runs.discover_runs`` names directories: hidden path parts (``.git``, ``.cache``) are
    skipped, and nothing deeper than ``max_depth``.

    Cost: one flat listing, no request per run: ``reads``' own when it lists (``FlatListing``:
    Azure's List Blobs, a request per 5,000 blobs), else pyarrow's recursive one (ListObjectsV2 on
    S3 and Cloud Storage's objects.list, a request per 1,000 keys: a run's parts count; on Azure a
    request per directory).  An empty prefix is a root with no runs (a bucket has no directories);
    a missing bucket or a refused listing is ``RunNotFoundError`` naming the root.
    """
    location = parse_bucket_url(root)
    try:
        if isinstance(reads, FlatListing):
            listed = reads.listing(location)
        else:
            listed = _arrow_listing(filesystem if filesystem is not None else bucket_filesystem(location), location)
    except FileNotFoundError:
        kind = "container" if location.scheme == "az" else "bucket"
        raise RunNotFoundError(f"{location.url}: the runs root cannot be listed: no such {kind}") from None
    except OSError as exc:
        raise RunNotFoundError(f"{location.url}: the runs root cannot be listed: {error_line(exc)}") from exc
    found: dict[tuple[str, bool], tuple[int, int]] = {}  # (name, in parts) -> (size, newest mtime)
    for item in listed:
        key = item.key.split("/")
        if key[-1] == METRICS_FILENAME:
            parts, in_parts = key[:-1], False
        elif len(key) >= 2 and key[-2] == PARTS_DIRNAME:
            parts, in_parts = key[:-2], True
        else:
            continue
        if len(parts) > max_depth or any(part.startswith(".") for part in parts):
            continue
        size, mtime_ns = found.get(("/".join(parts), in_parts), (0, 0))
        found["/".join(parts), in_parts] = (size + item.size, max(mtime_ns, item.mtime_ns))
    runs: dict[str, BucketRun] = {}
    for (path, in_parts), (size, mtime_ns) in sorted(found.items(), key=lambda item: item[0][1]):
        name = path or "."
        runs[name] = BucketRun(name, location.child(path), in_parts, size, mtime_ns)  # parts come last: they win
    return sorted(runs.values(), key=lambda run: run.name)


def _arrow_listing(filesystem: pafs.FileSystem, location: BucketPath) -> list[Listed]:
    """The objects under ``location`` through pyarrow's recursive listing; ``FileNotFoundError``
    when the bucket is missing (S3 says so; Cloud Storage and Azure list a missing bucket as an
    empty prefix, so one more request asks)."""
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(location.fs_path, recursive=True))
    except FileNotFoundError:
        if location.scheme != "s3" and filesystem.get_file_info(location.bucket).type == pafs.FileType.NotFound:
            raise
        return []
    base = len(location.fs_path) + 1
    return [
        Listed(info.path[base:], info.size or 0, info.mtime_ns or 0)
        for info in infos
        if info.type == pafs.FileType.File
    ]
