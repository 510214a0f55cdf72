"""The records of one event as columns: ``Table``, each field a ``columns.Column`` or, while it
holds a value on few of the event's rows, a ``SparseColumn``.

A per-task evaluation logs hundreds of keys every thousand steps; a dense column per key would
cost rows × keys (a 20,000-row run with 2,500 such keys: hundreds of MB for 50,000 values).
A sparse column keeps the rows that hold a value and those values: it costs what it holds, and
appending rows it lacks costs nothing but their count.  Which form a column takes is decided
where the cost is already paid: when it is created (from its first chunk), when missing values
grow its buffer, and when a sparse one gets values; the form never changes what a column holds
(its kind, values and missing rows are those of the dense column), only what it costs.

``PendingRows`` holds the records a per-line parse found, as dicts, until they are appended to
their tables: a live append of a few records is columnarised when a query needs it, not per refresh.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.read.columns import MISSING, NUMPY_DTYPES, Chunk, Column, as_python, chunk_from_pylist, convert

_EVENT_AND_VERSION = itemgetter("event", "schema_version")
SPARSE_AT = 16  # a column held on at most 1 row in this many is stored as its rows and values
DENSE_AT = 4  # and stored dense again once it holds more than 1 row in this many


class SparseColumn:
    """A column that holds a value on few of its rows, stored as those rows (int64, ascending) and
    their values (a ``Column`` that holds no missing value, so the rules of widening are its own):
    it costs what it holds, not its rows.  Kinds as ``Column``'s; never ``int`` nor ``null``, as a
    column with a missing value is not (its held integers are stored as floats).  The same
    ``extend``, ``put``, ``view``, ``numbers`` and ``series`` as ``Column``: ``view`` and
    ``numbers`` build the dense rows when called (O(rows), not kept); ``series`` is a pandas
    ``SparseArray`` (O(held)).  Appending missing values costs nothing but the count."""

    __slots__ = ("_held", "_rows", "_values", "size")

    def __init__(self, size: int, values: Column | None = None, rows: np.ndarray | None = None) -> None:
        self.size = size
        self._values = Column() if values is None else values
        self._rows = np.empty(0, np.int64) if rows is None else rows
        self._held: Held | None = None  # ``held_values``, kept until a value is added

    @classmethod
    def of(cls, column: Column) -> SparseColumn:
        """``column``'s values, held sparse (O(rows))."""
        rows = np.flatnonzero(_present(column.kind, column.view()))
        values = column.view()[rows]
        return cls(column.size, Column.restore(column.kind, values, list(column.categories)), rows)

    @property
    def kind(self) -> str:
        return self._values.kind

    @property
    def categories(self) -> list[str]:
        return self._values.categories

    def held(self) -> int:
        return self._values.size

    def rows(self) -> np.ndarray:
        """The rows that hold a value, ascending (a view: do not modify it)."""
        return self._rows[: self._values.size]

    def values(self) -> np.ndarray:
        """Their values, as ``Column.view`` holds them (a view)."""
        return self._values.view()

    def nbytes(self) -> int:
        return self._values.nbytes() + self._values.size * self._rows.itemsize

    def extend(self, chunk: Chunk, count: int) -> None:
        """Append ``count`` rows from ``chunk``: its held values and their rows."""
        if chunk.kind == "null":
            self.size += count
            return
        present = np.flatnonzero(_present(chunk.kind, chunk.values))
        self.add(Held(present, Chunk(chunk.kind, chunk.values[present], chunk.categories)), count)

    def add(self, held: Held, count: int) -> None:
        """Append ``count`` rows, of which ``held.rows`` hold ``held.values``."""
        values = convert(held.values, "float") if held.values.kind == "int" else held.values
        self._add_rows(self.size + held.rows)
        self._values.extend(values, len(held.rows))
        self.size += count

    def put(self, value: Any) -> bool:
        """As ``Column.put``: a float into a ``float`` column, else nothing (and False)."""
        if type(value) is not float or self.kind != "float":
            return False
        self._add_rows(np.array([self.size]))
        self._values.put(value)
        self.size += 1
        return True

    def _add_rows(self, rows: np.ndarray) -> None:
        held, needed = self._values.size, self._values.size + len(rows)
        if needed > len(self._rows):
            grown = np.empty(max(needed, len(self._rows) * 3 // 2, 16), np.int64)
            grown[:held] = self._rows[:held]
            self._rows = grown
        self._rows[held:needed] = rows

    def view(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` (every row: the defaults) as ``Column.view`` would hold them, missing
        values included: O(those rows), a new array."""
        span, held, at = self._within(start, stop)
        dense = np.full(len(span), MISSING[self.kind], dtype=NUMPY_DTYPES[self.kind])
        dense[at] = self._values.view()[held]
        return dense

    def numbers(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` as float64, NaN where none is held or it is not a number."""
        span, held, at = self._within(start, stop)
        dense = np.full(len(span), np.nan)
        dense[at] = self._values.numbers(held.start, held.stop)
        return dense

    def _within(self, start: int, stop: int | None) -> tuple[range, slice, np.ndarray]:
        """Rows ``start:stop``, the held values among them, and where those are in them."""
        span, rows = range(self.size)[start:stop], self.rows()
        first, last = (int(at) for at in np.searchsorted(rows, [span.start, span.stop]))
        return span, slice(first, last), rows[first:last] - span.start

    def series(self) -> pd.api.extensions.ExtensionArray:
        """A pandas ``SparseArray`` of every row (``Held.series``)."""
        return self.held_values().series(self.size)

    def for_frame(self, *, sparse: bool) -> Held | Any:
        """What ``RunReader.frame_columns`` hands out: ``held_values`` (sparse), else the dense
        series a ``Column`` of the same rows would give (O(rows))."""
        return self.held_values() if sparse else self.dense().series()

    def held_values(self) -> Held:
        """The rows that hold a value and those values, as they stand (views: rows are never
        changed once held): O(1), the same object until a value is added."""
        held = self._held
        if held is None or len(held.rows) != self._values.size or held.values.kind != self.kind:
            categories = list(self.categories) if self.kind == "cat" else ()
            held = self._held = Held(self.rows(), Chunk(self.kind, self._values.view(), categories))
        return held

    def dense(self) -> Column:
        """The same rows as a ``Column`` (O(rows))."""
        return Column.restore(self.kind, self.view(), list(self.categories))


@dataclass(slots=True)
class Held:
    """Rows of a chunk of which only a few hold a value: their positions in it (ascending) and
    their values (a chunk without a missing value); ``chunks_of`` makes them for rare keys."""

    rows: np.ndarray
    values: Chunk

    def series(self, length: int) -> pd.api.extensions.ExtensionArray:
        """``length`` rows as a pandas ``SparseArray`` (missing: NaN): numbers as float64, anything
        else as objects; O(values held)."""
        values, dtype = self.values.values, np.float64
        if self.values.kind not in ("float", "int"):
            values, dtype = as_python(self.values.kind, values, self.values.categories), object
        return pd.arrays.SparseArray.from_indices(values, self.rows, length, fill_value=np.nan, dtype=dtype)

    def chunk(self, count: int) -> Chunk:
        """The same ``count`` rows as a dense chunk, missing values included."""
        kind = "float" if self.values.kind == "int" else self.values.kind
        values = convert(self.values, kind).values if kind != self.values.kind else self.values.values
        dense = np.full(count, MISSING[kind], dtype=NUMPY_DTYPES[kind])
        dense[self.rows] = values
        return Chunk(kind, dense, self.values.categories)


def chunks_of(rows: list[dict[str, Any]]) -> dict[str, Chunk | Held]:
    """Typed chunks, one per key seen in any of ``rows`` (absent = missing), in order of first
    appearance; a key held by few of them (``SPARSE_AT``) as ``Held``, found in one pass over the
    rows that costs their fields, not rows × keys."""
    counts = Counter(chain.from_iterable(rows))
    del counts["event"]
    rare = {key for key, count in counts.items() if count * SPARSE_AT <= len(rows)}
    found: dict[str, tuple[list[int], list[Any]]] = {key: ([], []) for key in rare}
    if rare:
        for index, row in enumerate(rows):
            for key in rare.intersection(row):
                if row[key] is not None:  # null is absent
                    found[key][0].append(index)
                    found[key][1].append(row[key])
    chunks: dict[str, Chunk | Held] = {}
    for key in counts:
        if key not in rare:
            chunks[key] = chunk_from_pylist([row.get(key) for row in rows])
        elif found[key][0]:
            chunks[key] = Held(np.array(found[key][0], dtype=np.int64), chunk_from_pylist(found[key][1]))
    return chunks


def _present(kind: str, values: np.ndarray | None) -> np.ndarray:
    """Per row of a chunk or column of ``kind``, whether it holds a value."""
    if kind == "int":
        return np.ones(len(values), dtype=bool)
    if kind == "float":
        return ~np.isnan(values)
    if kind == "object":
        return np.array([value is not None for value in values.tolist()], dtype=bool)
    return values >= 0


class Table:
    """The records of one event: equal-length columns in order of first appearance, each a
    ``Column``, or a ``SparseColumn`` while it holds a value on few rows (``SPARSE_AT``): a key
    logged every thousand records, or first after thousands of them, costs what it holds."""

    def __init__(self) -> None:
        self.size = 0
        self.columns: dict[str, Column | SparseColumn] = {}

    def extend(self, chunks: Mapping[str, Chunk | Held], count: int) -> None:
        """Append ``count`` rows; a column absent from ``chunks`` gets missing values."""
        for name, chunk in chunks.items():
            self._extend_column(name, chunk, count)
        self._end_rows(count)

    def append(self, row: dict[str, Any]) -> None:
        """``extend`` by one record (its ``event`` left out), each float or int that fits its
        column's kind stored as it is (``Column.put``): a live append of a record of hundreds of keys
        made a typed chunk, a numpy array, per key."""
        columns = self.columns
        for name, value in row.items():
            column = columns.get(name)
            if name != "event" and (column is None or not column.put(value)):
                self._extend_column(name, chunk_from_pylist([value]), 1)
        self._end_rows(1)

    def _extend_column(self, name: str, chunk: Chunk | Held, count: int) -> None:
        column = self.columns.get(name)
        held = isinstance(chunk, Held)
        if column is None:
            if not held and chunk.kind == "null":
                return  # never held a value: not a column yet (module docstring)
            column = SparseColumn(self.size) if self.size or held else Column("null", 0)
            self.columns[name] = column
            if isinstance(column, Column):
                column.extend(chunk, count)
                self._settle(name, column)  # a first chunk that holds few values
                return
        if isinstance(column, SparseColumn) and held:
            column.add(chunk, count)
        else:
            column.extend(chunk.chunk(count) if held else chunk, count)

    def _end_rows(self, count: int) -> None:
        """Give the columns the rows just added left out missing values, count the rows, and
        store a column sparse or dense as what it holds now says: a sparse one that got values,
        a dense one whose buffer missing values grew (O(rows) once per growth)."""
        settle, missing = [], Chunk("null", None)
        for name, column in self.columns.items():
            if column.size == self.size:  # absent from what was added
                column.extend(missing, count)
                if isinstance(column, Column) and column.recount:
                    column.recount = False
                    settle.append(name)
            elif isinstance(column, SparseColumn):
                settle.append(name)
        for name in settle:
            self._settle(name, self.columns[name])
        self.size += count

    def _settle(self, name: str, column: Column | SparseColumn) -> None:
        """Store ``column`` sparse or dense, as what it holds says."""
        if isinstance(column, SparseColumn):
            if column.held() * DENSE_AT > column.size:
                self.columns[name] = column.dense()
        elif column.kind != "int" and column.held() * SPARSE_AT <= column.size:
            self.columns[name] = SparseColumn.of(column)

    def nbytes(self) -> int:
        return sum(column.nbytes() for column in self.columns.values())


class PendingRows:
    """Records the per-line parser found, kept as dicts per event until ``flush`` columnarises them:
    for a refresh of a few records, creating the small arrays a vectorised form needs costs more
    than parsing the records."""

    __slots__ = ("by_event", "count")

    def __init__(self) -> None:
        self.by_event: dict[str, list[dict[str, Any]]] = {}
        self.count = 0

    def add(self, rows: list[dict[str, Any]], versions: dict[int, int]) -> None:
        """Keep ``rows`` (in file order) and count them by ``schema_version`` into ``versions``."""
        by_event, self.count = self.by_event, self.count + len(rows)
        kinds = set(map(_EVENT_AND_VERSION, rows))
        if len(kinds) == 1:  # one event of one version (a live append): no loop in Python
            ((event, version),) = kinds
            by_event.setdefault(event, []).extend(rows)
            versions[version] = versions.get(version, 0) + len(rows)
            return
        event, per_event = None, []
        for row in rows:
            version = row["schema_version"]
            versions[version] = versions.get(version, 0) + 1
            if row["event"] != event:  # a run of one event's rows finds its list once
                event, per_event = row["event"], by_event.setdefault(row["event"], [])
            per_event.append(row)

    def flush(self, tables: dict[str, Table]) -> None:
        """Append the rows kept to their event's table (created if new), and keep none."""
        for event, rows in self.by_event.items():
            table = tables.setdefault(event, Table())
            if len(rows) == 1:  # a live append
                table.append(rows[0])
            else:
                table.extend(chunks_of(rows), len(rows))
        self.by_event.clear()
        self.count = 0
