"""Every run's records as Parquet, one file per run, kept up to date incrementally.

Optional: needs pyarrow and the read side (numpy, pandas); ``import metrics_core`` never loads it.
Parquet is the format DuckDB, Spark, Trino, Polars and pandas read at any scale.

An export directory ``OUT`` (a local directory, or ``s3://bucket/prefix`` through
``object_storage.s3_filesystem``) holds:

* ``OUT/<name>-<hash>.parquet``, one per run: every record of every session, replayed ones
  included, one row per record, in the reader's order (by event, then file order).  Columns
  (``RECORD_COLUMNS``): ``run``, ``session``, ``session_index``, ``event``, ``step``,
  ``tokens_seen``, ``skipped_updates``, ``time`` (UTC, microseconds, as the writer writes it),
  ``superseded`` (a later session redid the record: ``RunReader.superseded``, the rule of
  ``session_log.SessionLog.thresholds``), then every other field of the records under its own name
  (``train_loss``, ``sys/gpu_mem_gb``).  A field that is one of those names, or differs from an
  earlier one only in case (SQL names ignore case), gets a trailing ``_``.  A field whose type
  differs between events is one column of the common type: integers and floats make floats,
  anything else mixed is text.  Numbers are numbers, booleans booleans, strings strings; a field
  of mixed types within an event is text (JSON for non-strings).
* ``OUT/_manifest.json``: which file holds which run, the identity of the metrics file it was
  made from (``storage.FileStat``), and what ``metrics_core.sql``'s ``runs`` and ``sessions``
  views show of it (the session model's facts, the status inputs of ``runs.run_status``).
  Engines that read a directory of Parquet skip names starting with ``_`` (Spark, Hive, Trino).

Promises
--------
* Incremental: a run whose metrics file still has the identity the manifest recorded, and whose
  Parquet file is still there at the recorded size, is neither read nor written; an export that
  finds nothing changed writes nothing at all (not even the manifest).  A run that changed is read
  again (through the columnar cache of ``metrics_core.cache`` when given one: then only its
  appended bytes are parsed) and its one file rewritten.  A run gone from the root loses its file.
* Never a torn file: a local file is written under a temporary name and renamed; an object is one
  upload.  The manifest is written last, so a crash before it leaves files it does not vouch for,
  which the next export rewrites.  Two exports into one local directory take turns (a lock file).
* Reads only from the runs root; the export directory may not lie inside it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metrics_core.cache import CachePolicy
from metrics_core.columns import Column
from metrics_core.errors import MetricsError, RunPathError
from metrics_core.reader import RunReader
from metrics_core.runs import StatusRecord, UnreadableEntry, discover_runs
from metrics_core.storage import file_stat
from metrics_core.writer import BASE_FIELDS

FORMAT = 1  # bump when the file layout or the manifest changes: every run is exported again
MANIFEST = "_manifest.json"
LOCK = ".export.lock"
RECORD_COLUMNS = ("run", "session", "session_index", "event", "step", "tokens_seen", "skipped_updates", "time",
                  "superseded")  # fmt: skip
_STRINGS = pa.dictionary(pa.int32(), pa.string())
_TIME = pa.timestamp("us", tz="UTC")


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

    def lines(self) -> list[str]:
        """The report in plain lines (run names are data: the caller cleans them for a terminal)."""
        head = (f"exported {len(self.written):,} run(s), {self.unchanged:,} unchanged, "
                f"{len(self.removed):,} removed")  # fmt: skip
        return [head, *(f"could not export {name}: {why}" for name, why in self.failed),
                *(f"could not look into {entry}" for entry in self.unreadable)]  # fmt: skip


# -- one run as a table ----------------------------------------------------------------------------


def _arrow(column: Column) -> pa.Array:
    """A reader column as Arrow: missing values (NaN, -1 codes) as nulls."""
    kind, values = column.kind, column.view()
    if kind == "null":
        return pa.nulls(column.size)
    if kind == "int":
        return pa.array(values, pa.int64())
    if kind == "float":
        return pa.array(values, pa.float64(), from_pandas=True)  # NaN is never a value here: missing
    if kind == "bool":
        return pa.array(values > 0, mask=values < 0)
    if kind == "cat":
        codes = pa.array(values, pa.int32(), mask=values < 0)
        return pa.DictionaryArray.from_arrays(codes, pa.array(column.categories, pa.string())).dictionary_decode()
    text = [None if value is None else value if isinstance(value, str) else json.dumps(value) for value in values]
    return pa.array(text, pa.string())


def common_type(types: Sequence[pa.DataType]) -> pa.DataType:
    """The one type a column of these types takes: itself when they agree, float for integers and
    floats, else text (nulls join anything)."""
    kinds = {kind for kind in types if kind != pa.null()}
    if len(kinds) <= 1:
        return kinds.pop() if kinds else pa.null()
    if kinds <= {pa.int64(), pa.float64()}:
        return pa.float64()
    return pa.string()


def _cast(array: pa.Array, to: pa.DataType) -> pa.Array:
    if array.type == to:
        return array
    if array.type == pa.null():
        return pa.nulls(len(array), to)
    return pc.cast(array, to)


def column_names(keys: Sequence[str]) -> dict[str, str]:
    """Each field's column name (module docstring): its own, unless taken by a record column or,
    ignoring case, by an earlier field."""
    taken = {name.lower() for name in RECORD_COLUMNS}
    names = {}
    for key in keys:
        name = key
        while not name or name.lower() in taken:
            name += "_"
        taken.add(name.lower())
        names[key] = name
    return names


def run_table(reader: RunReader, run: str) -> pa.Table:
    """Every record ``reader`` holds as one table (module docstring), ``run`` in its ``run`` column."""
    events = reader.events
    sizes = [reader.column(event, "step").size for event in events]
    total = sum(sizes)
    sessions = np.concatenate([reader.session_indices(event) for event in events]) if events else np.zeros(0)
    event_codes = np.repeat(np.arange(len(events), dtype=np.int32), sizes)

    def joined(name: str) -> np.ndarray:
        return np.concatenate([reader.column(event, name).view() for event in events]) if events else np.zeros(0)

    base = {
        "run": pa.DictionaryArray.from_arrays(pa.array(np.zeros(total, np.int32)), pa.array([run], pa.string())),
        "session": pa.DictionaryArray.from_arrays(
            pa.array(sessions.astype(np.int32)), pa.array(reader.log.session_ids(), pa.string())
        ),
        "session_index": pa.array(sessions.astype(np.int32)),
        "event": pa.DictionaryArray.from_arrays(pa.array(event_codes), pa.array(events, pa.string())),
        "step": pa.array(joined("step"), pa.int64()),
        "tokens_seen": pa.array(joined("tokens_seen"), pa.int64()),
        "skipped_updates": pa.array(joined("skipped_updates"), pa.int64()),
        "time": pa.array(joined("time") // 1000, pa.int64()).cast(_TIME),
        "superseded": pa.array(
            np.concatenate([reader.superseded(event) for event in events]) if events else [], pa.bool_()
        ),
    }
    keys: dict[str, None] = {}
    for event in events:
        keys.update((name, None) for name in reader.fields(event) if name not in BASE_FIELDS)
    columns = dict(base)
    for key, name in column_names(list(keys)).items():
        parts = []
        for event, size in zip(events, sizes, strict=True):
            column = reader.column(event, key)
            parts.append(pa.nulls(size) if column is None else _arrow(column))
        kind = common_type([part.type for part in parts])
        columns[name] = pa.chunked_array([_cast(part, kind) for part in parts], kind)
    return pa.table(columns)


# -- what the views show of a run ------------------------------------------------------------------


def _effective_min(reader: RunReader, event: str, name: str) -> float | None:
    column = reader.column(event, name)
    if column is None:
        return None
    values = column.numbers()[~reader.superseded(event)]
    return None if np.isnan(values).all() else float(np.nanmin(values))


def run_facts(reader: RunReader) -> dict[str, Any]:
    """What the ``runs`` and ``sessions`` views show of the run ``reader`` read, as JSON values;
    the status inputs are kept, not the status, which the clock and the writer's lock move."""
    reader.writer_alive()  # a held lock now is worth knowing later (``lock_seen``)
    sessions = reader.sessions
    count = len(sessions)
    own_superseded = np.zeros(count, np.int64)
    for event in reader.events:
        own_superseded += np.bincount(reader.session_indices(event), weights=reader.superseded(event),
                                      minlength=count).astype(np.int64)  # fmt: skip
    session_min = [None] * count
    loss = reader.column("train", "train_loss")
    if loss is not None:
        numbers, indices = loss.numbers(), reader.session_indices("train")
        for index in range(count):
            mine = numbers[indices == index]
            if len(mine) and not np.isnan(mine).all():
                session_min[index] = float(np.nanmin(mine))
    progress = reader.progress()
    last_loss = reader.last_number("train", "train_loss")
    status = StatusRecord.of(reader, identity=reader.read_identity)
    return {
        "status": {
            **_values(status),
            "path": str(status.path),
            "identity": list(status.identity or ()),
            "last_record_time": _iso(status.last_record_time),
        },
        "records": reader.records,
        "sessions": count,
        "superseded_records": int(own_superseded.sum()),
        "started": _iso(progress.started),
        "last_step": progress.last_step,
        "tokens_seen": progress.tokens_seen,
        "min_train_loss": _effective_min(reader, "train", "train_loss"),
        "last_train_loss": None if last_loss is None else last_loss.value,
        "min_val_loss": _effective_min(reader, "validation", "val_loss"),
        "bad_lines": reader.bad_lines,
        "session_rows": [
            {
                **{name: _iso(value) if isinstance(value, datetime) else value for name, value in _values(s).items()},
                "own_records_superseded": int(own_superseded[s.index]),
                "min_train_loss": session_min[s.index],
            }
            for s in sessions
        ],
    }


def _values(instance: Any) -> dict[str, Any]:
    """A dataclass's fields by name, not deep-copied (``asdict`` copies every value)."""
    return {item.name: getattr(instance, item.name) for item in fields(instance)}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


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
        if text.startswith("s3://"):
            from metrics_core.object_storage import parse_bucket_url, s3_filesystem

            location = parse_bucket_url(text)
            return cls(filesystem or s3_filesystem(), location.fs_path, location.url, local=False)
        path = Path(text).resolve()
        return cls(pafs.LocalFileSystem(), str(path), text, local=True)

    def path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def listing(self) -> dict[str, int]:
        """The export's files and their sizes (one listing request for a bucket)."""
        try:
            infos = self.filesystem.get_file_info(pafs.FileSelector(self.base, allow_not_found=True))
        except OSError as exc:
            raise ExportError(f"{self.url}: cannot be listed: {_first_line(exc)}") from exc
        return {info.base_name: info.size for info in infos if info.type == pafs.FileType.File}

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest, or None when there is none or it is unusable (then every run is exported)."""
        try:
            with self.filesystem.open_input_stream(self.path(MANIFEST)) as stream:
                manifest = json.loads(stream.read())
        except (OSError, ValueError):
            return None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return None
        return manifest

    def write(self, name: str, write: Any) -> None:
        """``write(stream)`` as the file ``name``, whole or not at all (module docstring)."""
        target = self.path(name)
        temporary = self.path(f".{name}.{uuid.uuid4().hex}.partial") if self.local else target
        try:
            if self.local:
                Path(self.base).mkdir(parents=True, exist_ok=True)
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
        Path(self.base).mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path(LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


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


def export_root(
    root: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    cache: CachePolicy | None = None,
    filesystem: pafs.FileSystem | None = None,
) -> ExportReport:
    """Export every run under the local runs ``root`` into ``out`` (module docstring).

    ``cache``: the columnar cache of parsed runs (never inside ``root``), so that a run that grew
    is parsed from where its cached parse ended.  ``filesystem``: the bucket's client (default
    from the AWS variables).  Raises ``ExportError`` when ``out`` cannot be listed or written and
    ``RunPathError`` when it lies inside ``root``; a run that cannot be read is reported, not raised.
    """
    real_root = Path(root).resolve()
    destination = Destination.of(out, filesystem)
    if destination.local and Path(destination.base).is_relative_to(real_root):
        raise RunPathError(f"{destination.url}: inside the runs root {root}: an export must live elsewhere")
    listing = discover_runs(root)
    with destination.turn():
        manifest = destination.read_manifest() or {}
        if manifest and manifest.get("root") != str(real_root):
            raise ExportError(f"{destination.url}: holds the export of another runs root, {manifest.get('root')}")
        before: Mapping[str, dict[str, Any]] = manifest.get("runs", {})
        present = destination.listing()
        plan = _Plan()
        for run in listing.runs:
            entry = before.get(run.name)
            if entry is not None and _unchanged(entry, run.metrics_path, present):
                plan.entries[run.name] = entry
                continue
            try:
                plan.entries[run.name] = _export_run(run.name, run.metrics_path, destination, cache)
                plan.written.append(run.name)
            except (MetricsError, OSError) as exc:
                if isinstance(exc, ExportError):
                    raise
                plan.failed.append((run.name, _first_line(exc)))
                if entry is not None:
                    plan.entries[run.name] = entry  # kept as last exported: nothing already exported is lost
        removed = sorted(set(before) - set(plan.entries))
        if plan.written or removed or not manifest:
            document = {"format": FORMAT, "root": str(real_root), "runs": plan.entries}
            destination.write(MANIFEST, lambda stream: stream.write(json.dumps(document).encode()))
        for name in removed:
            if before[name]["file"] not in {entry["file"] for entry in plan.entries.values()}:
                destination.delete(before[name]["file"])
    return ExportReport(tuple(plan.written), len(listing.runs) - len(plan.written) - len(plan.failed),
                        tuple(removed), tuple(plan.failed), listing.unreadable)  # fmt: skip


def _unchanged(entry: Mapping[str, Any], path: Path, present: Mapping[str, int]) -> bool:
    try:
        identity = list(file_stat(os.stat(path)).identity)
    except OSError:
        return False
    return entry.get("source") == identity and present.get(entry.get("file")) == entry.get("bytes")


def _export_run(name: str, path: Path, destination: Destination, cache: CachePolicy | None) -> dict[str, Any]:
    """Read the run (from its cached parse when there is one), write its file; its manifest entry."""
    reader = RunReader(path, cache=cache)
    try:
        reader.refresh()
        table = run_table(reader, name)
        facts = run_facts(reader)
        identity = reader.read_identity
    finally:
        reader.close()
    target = file_name(name)
    destination.write(target, lambda stream: pq.write_table(table, stream, compression="zstd"))
    size = destination.filesystem.get_file_info(destination.path(target)).size
    schema = base64.b64encode(table.schema.serialize().to_pybytes()).decode()
    return {"file": target, "bytes": size, "rows": table.num_rows, "source": list(identity or ()),
            "schema": schema, **facts}  # fmt: skip


def read_schema(entry: Mapping[str, Any]) -> pa.Schema:
    """The Arrow schema of a run's file, as its manifest entry keeps it (no read of the file)."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(entry["schema"])))
