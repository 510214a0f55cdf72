"""One run as the export holds it: every record as one Arrow table, and the facts the views show.

``export`` decides where and when a run is written (the destination, the manifest, what changed);
this module decides what a run becomes, from a ``RunReader`` alone, so the file's columns and the
views' facts are defined in one place:

* ``run_table``: every record of every session, replayed ones included, one row per record, in
  the reader's order (by event, then file order).  Columns (``RECORD_COLUMNS``): ``run``,
  ``session``, ``session_index``, ``event``, ``step``, ``tokens_seen``, ``skipped_updates``,
  ``time`` (UTC, microseconds, as the writer writes it), ``superseded`` (a later session redid the
  record: ``RunReader.superseded``, the rule of ``session_accounting.SessionLog.thresholds``), then every
  other field of the records under its own name (``train_loss``, ``sys/gpu_mem_gb``).  A field
  that is one of those names, or differs from an earlier one only in case (SQL names ignore
  case), gets a trailing ``_`` (``column_names``).  A field whose type differs between events is
  one column of the common type (``common_type``): integers and floats make floats, anything else
  mixed is text.  Numbers are numbers, booleans booleans, strings strings; a field of mixed types
  within an event is text (JSON for non-strings).
* ``run_facts``: what ``metrics_core.sql.query``'s ``runs`` and ``sessions`` views show of the run (the
  session model's facts, the status inputs of ``runs.run_status``), as JSON values for the
  manifest.

A change to what a run becomes here is a change of the export's layout: bump ``export.FORMAT``.
Optional, as ``export``: needs pyarrow and the read side; ``import metrics_core`` never loads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_core.read.columns import Column
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import StatusRecord
from metrics_core.write.writer import BASE_FIELDS

RECORD_COLUMNS = (
    "run",
    "session",
    "session_index",
    "event",
    "step",
    "tokens_seen",
    "skipped_updates",
    "time",
    "superseded",
)
_TIME = pa.timestamp("us", tz="UTC")


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
        own_superseded += np.bincount(
            reader.session_indices(event), weights=reader.superseded(event), minlength=count
        ).astype(np.int64)
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
            "within": None if status.within is None else str(status.within),
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
