"""Every run's records as Parquet, one file per run, kept up to date incrementally.

Optional: needs pyarrow and the read side (numpy, pandas); ``import metrics_core`` never loads it.
Parquet is the format DuckDB, Spark, Trino, Polars and pandas read at any scale.

The runs are read through ``runs_root.open_root``, the seam the dashboard reads them through: a local
directory, or a bucket prefix (``s3://``, ``gs://``, ``az://``; ``metrics_core.roots.bucket_root``), whose
one listing tells which runs changed at no request per run.  An export directory ``OUT`` (a local
directory, or a bucket prefix through ``addresses.bucket_filesystem``) holds:

* ``OUT/<name>-<hash>.parquet``, one per run: every record of every session, replayed ones
  included, one row per record, as ``export_table.run_table`` makes it (its docstring lists the
  columns and how a field's name and type are chosen).
* ``OUT/_manifest.json``: which file holds which run, the identity of the metrics file it was
  made from (``run_file.FileStat``), and what ``metrics_core.sql.query``'s ``runs`` and ``sessions``
  views show of it (``export_table.run_facts``).
  Engines that read a directory of Parquet skip names starting with ``_`` (Spark, Hive, Trino).

Promises
--------
* Incremental: a run whose metrics file still has the stamp the manifest recorded
  (``RunsRoot.stamp``: a file's identity, an object's listed size and time), and whose Parquet
  file is still there at the recorded size, is neither read nor written; an export that
  finds nothing changed writes nothing at all (not even the manifest).  A run that changed is read
  again (through the columnar cache of ``metrics_core.read.column_cache`` when given one: then only its
  appended bytes are parsed) and its one file rewritten.  A run gone from the root loses its file.
* Never a torn file: a local file is written under a temporary name and renamed; an object is one
  upload.  The manifest is written last, so a crash before it leaves files it does not vouch for,
  which the next export rewrites.  Two exports into one local directory take turns (a lock file).
* Reads only from the runs root; the export directory may not lie inside it (a local one, or a
  bucket one under the root's prefix).
* Private: a local export directory is made 0700 where it is created, and each file in it (the
  Parquet files, the manifest, the lock) 0600, created anew, never through a link
  (``metrics_core.read.private_files``): an export is as private as the runs it copies.
* Touches nothing outside the export directory: the manifest is data, and a manifest whose entry
  names anything but a plain file name of the directory (a separator, ``..``, an absolute path)
  is refused (``ExportError`` naming the entry) before any file it names is read or deleted.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metrics_core.errors import MetricsError, RunPathError
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.private_files import FILE_MODE, create_private, private_directory
from metrics_core.roots.discovery import RunInfo, UnreadableEntry
from metrics_core.roots.locations import is_bucket_url
from metrics_core.roots.runs_root import RunsRoot, open_root
from metrics_core.sql.export_table import run_facts, run_slices

FORMAT = 1  # bump when the file layout or the manifest changes: every run is exported again
MANIFEST = "_manifest.json"
LOCK = ".export.lock"


class ExportError(MetricsError, OSError):
    """An export directory that cannot be used: where it is and why."""


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What one export did: the runs it wrote, kept and removed, and what it could not read."""

    written: tuple[str, ...]
    unchanged: int
    removed: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]  # (run, why)
    unreadable: tuple[UnreadableEntry, ...]
    left: int = 0  # runs not looked at before the deadline: the next export goes on with them

    def lines(self) -> list[str]:
        """The report in plain lines (run names are data: the caller cleans them for a terminal)."""
        head = f"exported {len(self.written):,} run(s), {self.unchanged:,} unchanged, {len(self.removed):,} removed"
        return [
            head,
            *([f"{self.left:,} run(s) left for the next export: out of time"] if self.left else []),
            *(f"could not export {name}: {why}" for name, why in self.failed),
            *(f"could not look into {entry}" for entry in self.unreadable),
        ]


# -- where the export goes -------------------------------------------------------------------------


@dataclass
class Destination:
    """An export directory on a ``pyarrow.fs`` file system: local, or a bucket prefix."""

    filesystem: pafs.FileSystem
    base: str  # the directory's path on ``filesystem``
    url: str  # as the user named it, for messages
    local: bool

    @classmethod
    def of(cls, out: str | os.PathLike[str], filesystem: pafs.FileSystem | None = None) -> Destination:
        text = os.fspath(out)
        if is_bucket_url(text):
            from metrics_core.buckets.addresses import bucket_filesystem, parse_bucket_url

            location = parse_bucket_url(text)
            return cls(filesystem or bucket_filesystem(location), location.fs_path, location.url, local=False)
        path = Path(text).resolve()
        return cls(pafs.LocalFileSystem(), str(path), text, local=True)

    def path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def inside(self, root: str) -> bool:
        """Whether this directory lies in the runs root ``root`` (``root_name``)."""
        if is_bucket_url(root):
            return not self.local and f"{self.url}/".startswith(f"{root}/")
        return self.local and Path(self.base).is_relative_to(root)

    def listing(self) -> dict[str, int]:
        """The export's files and their sizes (one listing request for a bucket)."""
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        except OSError as exc:
            raise ExportError(f"{self.url}: cannot be listed: {_first_line(exc)}") from exc
        return {info.base_name: info.size for info in infos if info.type == pafs.FileType.File}

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest, or None when there is none or it is unusable (then every run is exported);
        ``ExportError`` when an entry names a file outside the directory (``_check_entries``)."""
        try:
            with self.filesystem.open_input_stream(self.path(MANIFEST)) as stream:
                manifest = json.loads(stream.read())
        except (OSError, ValueError):
            return None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return None
        self._check_entries(manifest.get("runs"))
        return manifest

    def _check_entries(self, runs: Any) -> None:
        """``ExportError`` naming the first entry whose file is not a plain file name of this directory
        (module docstring): a manifest is data, and ``../victim`` must not be deleted or read."""
        if not isinstance(runs, dict) or not all(isinstance(entry, dict) for entry in runs.values()):
            raise ExportError(f"{self.url}: {MANIFEST} is not an export's manifest: expected an object of runs")
        for run, entry in runs.items():
            name = entry.get("file")
            if not is_plain_name(name):
                raise ExportError(
                    f"{self.url}: {MANIFEST}: the entry of run {run!r} names the file {name!r}: expected a plain "
                    "file name of the export directory (no directory separator, '..' or absolute path); "
                    "refused, nothing read or deleted"
                )

    def write(self, name: str, write: Any) -> None:
        """``write(stream)`` as the file ``name``, whole or not at all (module docstring)."""
        target = self.path(name)
        temporary = self.path(f".{name}.{uuid.uuid4().hex}.partial") if self.local else target
        try:
            if self.local:
                private_directory(Path(self.base))
                with os.fdopen(create_private(temporary), "wb") as file, pa.PythonFile(file, mode="w") as stream:
                    write(stream)
            else:
                with self.filesystem.open_output_stream(temporary) as stream:
                    write(stream)
            if self.local:
                self.filesystem.move(temporary, target)
        except OSError as exc:
            if self.local:
                with contextlib.suppress(OSError):
                    self.filesystem.delete_file(temporary)
            raise ExportError(f"{self.url}: cannot write {name}: {_first_line(exc)}") from exc

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filesystem.delete_file(self.path(name))

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Exclusive use of a local export directory while one export writes it (a bucket has no
        lock: one exporter per prefix)."""
        if not self.local:
            yield
            return
        private_directory(Path(self.base))
        fd = os.open(self.path(LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def is_plain_name(name: object) -> bool:
    """Whether ``name`` names a file in a directory itself, and nothing else: no separator (of any
    system), not ``.`` or ``..``, no NUL, not empty."""
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def file_name(run: str) -> str:
    """The Parquet file of ``run``: readable, safe on any file system and in any glob, and unique
    (the hash of the whole name)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", run).strip("._")[:60] or "run"
    return f"{slug}-{hashlib.blake2b(run.encode(), digest_size=6).hexdigest()}.parquet"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


# -- the export ------------------------------------------------------------------------------------


@dataclass
class _Plan:
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def export_root(
    root: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    cache: CachePolicy | None = None,
    filesystem: pafs.FileSystem | None = None,
    deadline: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportReport:
    """Export every run under the runs ``root`` (a directory or a bucket prefix) into ``out``
    (module docstring).

    ``cache``: the columnar cache of parsed runs (never inside ``root``), so that a run that grew
    is parsed from where its cached parse ended.  ``filesystem``: the client of ``out``'s bucket
    (default from the environment).  ``progress(bytes done, bytes)`` of the runs' metrics files
    (their sizes as the listing found them): before each run, as each block of a run's file is
    parsed (one big run moves a bar too), and at the end; a run left as exported counts whole.
    ``deadline`` (a ``time.monotonic()``): past it, no run is
    begun once one has been read; the runs not reached keep their entries as last exported
    (``ExportReport.left``), so an export cut short writes what it did and the next one goes on
    from there, one run further at least.  Raises
    ``ExportError`` when ``out`` cannot be listed or written, ``RunPathError`` when it lies inside
    ``root``, ``RunNotFoundError`` when ``root`` cannot be listed; a run that cannot be read is
    reported, not raised.
    """
    destination = Destination.of(out, filesystem)
    runs = open_root(root, watch=False)
    try:
        return _export(runs, destination, cache, deadline, progress)
    finally:
        runs.close()


def root_name(root: str | os.PathLike[str]) -> str:
    """What names a runs root in a manifest and a cache key: a directory's real path, a bucket's address."""
    if is_bucket_url(root):
        from metrics_core.buckets.addresses import parse_bucket_url

        return parse_bucket_url(os.fspath(root)).url
    return str(Path(root).resolve())


def _export(
    root: RunsRoot,
    destination: Destination,
    cache: CachePolicy | None,
    deadline: float | None,
    progress: Callable[[int, int], None] | None,
) -> ExportReport:
    root_id = root_name(root.location)
    if destination.inside(root_id):
        raise RunPathError(f"{destination.url}: inside the runs root {root.location}: an export must live elsewhere")
    listing = root.discover()
    with destination.turn():
        manifest = destination.read_manifest() or {}
        if manifest and manifest.get("root") != root_id:
            raise ExportError(f"{destination.url}: holds the export of another runs root, {manifest.get('root')}")
        before: Mapping[str, dict[str, Any]] = manifest.get("runs", {})
        present = destination.listing()
        plan = _Plan()
        sizes = [root.size(run) for run in listing.runs]  # no request for a bucket's: its listing's
        total, done = sum(sizes), 0
        for run, size in zip(listing.runs, sizes, strict=True):
            if progress is not None:
                progress(done, total)
            read = _read_progress(progress, done, size, total)
            done += size
            if deadline is not None and (plan.written or plan.failed) and time.monotonic() > deadline:
                plan.left.append(run.name)
                if run.name in before:
                    plan.entries[run.name] = before[run.name]  # as last exported, its file kept
                continue
            entry, stamp = before.get(run.name), root.stamp(run)
            if entry is not None and _unchanged(entry, stamp, present):
                plan.entries[run.name] = entry
                continue
            try:
                plan.entries[run.name] = _export_run(root, run, stamp, destination, cache, read)
                plan.written.append(run.name)
            except (MetricsError, OSError) as exc:
                if isinstance(exc, ExportError):
                    raise
                plan.failed.append((run.name, _first_line(exc)))
                if entry is not None:
                    plan.entries[run.name] = entry  # kept as last exported: nothing already exported is lost
        if progress is not None:
            progress(total, total)
        removed = sorted(set(before) - set(plan.entries))
        if plan.written or removed or not manifest:
            document = {"format": FORMAT, "root": root_id, "runs": plan.entries}
            destination.write(MANIFEST, lambda stream: stream.write(json.dumps(document).encode()))
        for name in removed:
            if before[name]["file"] not in {entry["file"] for entry in plan.entries.values()}:
                destination.delete(before[name]["file"])
    return ExportReport(
        tuple(plan.written),
        len(listing.runs) - len(plan.written) - len(plan.failed) - len(plan.left),
        tuple(removed),
        tuple(plan.failed),
        listing.unreadable,
        len(plan.left),
    )


def _unchanged(entry: Mapping[str, Any], stamp: tuple[int, ...] | None, present: Mapping[str, int]) -> bool:
    if stamp is None:
        return False
    return entry.get("source") == list(stamp) and present.get(entry.get("file")) == entry.get("bytes")


def _read_progress(
    progress: Callable[[int, int], None] | None, before: int, size: int, total: int
) -> Callable[[int, int], None] | None:
    """The ``RunReader.refresh`` progress of a run of ``size`` bytes, the ``before`` bytes of the
    runs ahead of it done: ``progress`` of the whole export (a file grown since the listing counts
    as its listed size)."""
    if progress is None:
        return None
    report = progress
    return lambda read, _file_size: report(before + min(read, size), total)


def _export_run(
    root: RunsRoot,
    run: RunInfo,
    stamp: tuple[int, ...] | None,
    destination: Destination,
    cache: CachePolicy | None,
    read: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Read the run (from its cached parse when there is one), write its file; its manifest entry.
    ``stamp``: the run's file as the root said it was before this read (a write since makes the
    next export read it again).  ``read``: ``RunReader.refresh``'s progress."""
    reader = root.reader(run, cache=cache)
    try:
        reader.refresh(read)
        schema, slices = run_slices(reader, run.name)
        facts = run_facts(reader)
    finally:
        reader.close()  # the file; what was parsed stays for the slices
    target = file_name(run.name)
    rows = []

    def write(stream: Any) -> None:  # a slice at a time: a row group each, never the whole run's table
        rows.clear()
        with pq.ParquetWriter(stream, schema, compression="zstd") as writer:
            for part in slices():
                writer.write_table(part)
                rows.append(part.num_rows)

    destination.write(target, write)
    size = destination.filesystem.get_file_info(destination.path(target)).size
    return {
        "file": target,
        "bytes": size,
        "rows": sum(rows),
        "source": list(stamp or ()),
        "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
        **facts,
    }


def read_schema(entry: Mapping[str, Any]) -> pa.Schema:
    """The Arrow schema of a run's file, as its manifest entry keeps it (no read of the file)."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(entry["schema"])))
