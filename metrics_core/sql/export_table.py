"""One run as the export holds it: every record as one Arrow table, and the facts the views show.

``export`` decides where and when a run is written (the destination, the manifest, what changed);
this module decides what a run becomes, from a ``RunReader`` alone, so the file's columns and the
views' facts are defined in one place:

* ``run_table``: every record of every session, replayed ones included, one row per record, in
  the reader's order (by event, then file order).  Columns (``RECORD_COLUMNS``): ``run``,
  ``session``, ``session_index``, ``event``, ``step``, ``tokens_seen``, ``skipped_updates``,
  ``time`` (UTC, microseconds, as the writer writes it), ``superseded`` (a later session redid the
  record: ``RunReader.superseded``, the rule of ``metrics_core.read.supersession``), then every
  other field of the records under its own name (``train_loss``, ``sys/gpu_mem_gb``).  A field
  that is one of those names, or differs from an earlier one only in case (SQL names ignore
  case), gets a trailing ``_`` (``column_names``).  A field whose type differs between events is
  one column of the common type (``common_type``): integers and floats make floats, anything else
  mixed is text.  Numbers are numbers, booleans booleans, strings strings; a field of mixed types
  within an event is text (JSON for non-strings).
* ``run_slices``: the same table a slice of rows at a time (``SLICE_VALUES`` values each; the export
  writes a row group per slice), so a run that logs thousands of keys on few records (held sparse
  by the reader) is never made dense whole.
* ``run_facts``: what ``metrics_core.sql.query``'s ``runs`` and ``sessions`` views show of the run (the
  session model's facts, the status inputs of ``runs.run_status``), as JSON values for the
  manifest.

A change to what a run becomes here is a change of the export's layout: bump ``export.FORMAT``.
Optional, as ``export``: needs pyarrow and the read side; ``import metrics_core`` never loads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from datetime import datetime
from functools import cache
from operator import attrgetter
from typing import Any, get_type_hints

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_core.read.column_table import SparseColumn
from metrics_core.read.columns import Column
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import StatusRecord
from metrics_core.read.session_model import Session
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


_KIND_TYPES = {
    "null": pa.null(),
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "cat": pa.string(),
    "object": pa.string(),
}
SLICE_VALUES = 4 << 20  # values in memory at once: rows per slice = this / columns (a row group each)


def _arrow(column: Column | SparseColumn, start: int, stop: int) -> pa.Array:
    """Rows ``start:stop`` of a reader column as Arrow: missing values (NaN, -1 codes) as nulls
    (a sparse column's rows made dense for that slice alone)."""
    kind = column.kind
    if kind == "null":
        return pa.nulls(stop - start)
    values = column.view(start, stop) if isinstance(column, SparseColumn) else column.view()[start:stop]
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
    schema, slices = run_slices(reader, run)
    return pa.Table.from_batches([batch for part in slices() for batch in part.to_batches()], schema)


def run_slices(
    reader: RunReader, run: str, *, values: int = SLICE_VALUES
) -> tuple[pa.Schema, Callable[[], Iterator[pa.Table]]]:
    """``run_table``'s schema, and a call that yields its rows in order, a slice of about ``values``
    values at a time (one event's rows each): a run that logs thousands of keys on few records
    is written without a dense copy of every key's every row."""
    events = reader.events
    keys: dict[str, None] = {}
    for event in events:
        keys.update((name, None) for name in reader.fields(event) if name not in BASE_FIELDS)
    names = column_names(list(keys))
    types = {}
    for key in keys:
        found = [reader.column(event, key) for event in events]
        types[key] = common_type([pa.null() if column is None else _KIND_TYPES[column.kind] for column in found])
    dictionary = pa.dictionary(pa.int32(), pa.string())
    schema = pa.schema(
        [
            ("run", dictionary),
            ("session", dictionary),
            ("session_index", pa.int32()),
            ("event", dictionary),
            ("step", pa.int64()),
            ("tokens_seen", pa.int64()),
            ("skipped_updates", pa.int64()),
            ("time", _TIME),
            ("superseded", pa.bool_()),
            *((names[key], kind) for key, kind in types.items()),
        ]
    )
    rows = max(1, values // max(len(schema), 1))

    def slices() -> Iterator[pa.Table]:
        for event in events:
            size = reader.column(event, "step").size
            for start in range(0, size, rows):
                yield _slice(reader, run, event, range(start, min(size, start + rows)), schema, types)

    return schema, slices


def _slice(
    reader: RunReader, run: str, event: str, rows: range, schema: pa.Schema, types: dict[str, pa.DataType]
) -> pa.Table:
    """Rows ``rows`` of ``event``'s records as a table of ``schema`` (``run_slices``)."""
    start, stop, count = rows.start, rows.stop, len(rows)
    events = reader.events
    codes = reader.session_indices(event)[start:stop].astype(np.int32)

    def base(name: str) -> np.ndarray:
        return reader.column(event, name).view()[start:stop]

    columns = [
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, np.int32)), pa.array([run], pa.string())),
        pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(reader.log.session_ids(), pa.string())),
        pa.array(codes),
        pa.DictionaryArray.from_arrays(
            pa.array(np.full(count, events.index(event), np.int32)), pa.array(events, pa.string())
        ),
        pa.array(base("step"), pa.int64()),
        pa.array(base("tokens_seen"), pa.int64()),
        pa.array(base("skipped_updates"), pa.int64()),
        pa.array(base("time") // 1000, pa.int64()).cast(_TIME),
        pa.array(reader.superseded(event)[start:stop], pa.bool_()),
    ]
    for key, kind in types.items():
        column = reader.column(event, key)
        columns.append(pa.nulls(count, kind) if column is None else _cast(_arrow(column, start, stop), kind))
    return pa.Table.from_arrays(columns, schema=schema)


def _effective_min(reader: RunReader, event: str, name: str) -> float | None:
    column = reader.column(event, name)
    if column is None:
        return None
    values = column.numbers()[~reader.superseded(event)]
    return None if np.isnan(values).all() else float(np.nanmin(values))


def run_facts(reader: RunReader) -> dict[str, Any]:
    """What the ``runs`` and ``sessions`` views show of the run ``reader`` read, as JSON values;
    the status inputs are kept, not the status, which the clock and the writer's lock move.
    O(records + sessions)."""
    reader.writer_alive()  # a held lock now is worth knowing later (``lock_seen``)
    sessions = reader.sessions
    count = len(sessions)
    own_superseded = np.zeros(count, np.int64)
    for event in reader.events:
        own_superseded += np.bincount(
            reader.session_indices(event), weights=reader.superseded(event), minlength=count
        ).astype(np.int64)
    session_min, logged_in = np.full(count, np.inf), np.zeros(count, dtype=bool)
    loss = reader.column("train", "train_loss")
    if loss is not None:  # each session's least loss in one pass, not a pass per session
        numbers, indices = loss.numbers(), reader.session_indices("train")
        logged = ~np.isnan(numbers)
        np.minimum.at(session_min, indices[logged], numbers[logged])
        logged_in[indices[logged]] = True
    session_least = [
        value if seen else None for value, seen in zip(session_min.tolist(), logged_in.tolist(), strict=True)
    ]
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
        "session_rows": _session_rows(sessions, own_superseded.tolist(), session_least),
    }


def _session_rows(sessions: Sequence[Session], own_superseded: list[int], least: list[float | None]) -> list[dict]:
    """Each session's row of the ``sessions`` view: its fields by name, times as ISO text, and its
    own superseded records and least train loss (indexed by ``Session.index``).  A row is made of
    the session's values at once (``attrgetter``), not a call and a check per field: a run of
    thousands of sessions makes thousands of rows."""
    names = _names(Session)
    values = attrgetter(*names)
    times = [name for name, hint in get_type_hints(Session).items() if hint is datetime]
    rows = []
    for session in sessions:
        row = dict(zip(names, values(session), strict=True))
        for name in times:
            row[name] = row[name].isoformat()
        row["own_records_superseded"] = own_superseded[session.index]
        row["min_train_loss"] = least[session.index]
        rows.append(row)
    return rows


def _values(instance: Any) -> dict[str, Any]:
    """A dataclass's fields by name, not deep-copied (``asdict`` copies every value)."""
    return {name: getattr(instance, name) for name in _names(type(instance))}


@cache
def _names(kind: type) -> tuple[str, ...]:
    return tuple(item.name for item in fields(kind))  # ``fields`` per instance: most of a session's row


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
