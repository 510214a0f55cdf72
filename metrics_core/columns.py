"""Compact, append-only columnar storage for the records of one event of one run.

Why not a list of dicts or a growing DataFrame: a dict per record costs ~1 KB resident and
``pd.concat`` per refresh is O(history).  Here each field is one typed numpy buffer that grows
geometrically (amortised O(1) appends), so a refresh costs O(new records) and a record costs
about 8 bytes per numeric field.

Column kinds, chosen from the values seen and widened when a later value needs it:

* ``int``   — int64; becomes ``float`` the first time a value is missing, fractional or beyond
  the int64 range;
* ``float`` — float64, NaN = missing (JSON has no NaN, so NaN is never a real value here);
* ``bool``  — int8, -1 = missing;
* ``cat``   — int32 codes into a list of strings, -1 = missing (run/session ids, statuses);
* ``object``— Python objects, for a field whose type changes between records (a buggy writer);
  its numbers are floats, whichever order the types arrived in (an ``int`` column with a gap is
  already ``float`` when a string turns it into ``object``: one rule gives one answer);
* ``null``  — only missing values so far; takes the kind of the first real value.

A field that never held a value (absent, or ``null`` in every record so far) is not a column:
``null`` and absent are one thing in JSON lines, and pyarrow cannot tell them apart.

Rows are only ever appended, never changed, so a slice handed out by ``view`` stays valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

_NUMPY_DTYPES = {"int": np.int64, "float": np.float64, "bool": np.int8, "cat": np.int32, "object": object}
_MISSING = {"float": np.nan, "bool": -1, "cat": -1, "object": None}


class Chunk:
    """One batch of values for one column, already typed (the unit both parsers produce)."""

    __slots__ = ("categories", "kind", "values")

    def __init__(self, kind: str, values: np.ndarray | None, categories: Sequence[str] = ()) -> None:
        self.kind = kind
        self.values = values  # None for kind "null"
        self.categories = categories


def chunk_from_pylist(values: list[Any]) -> Chunk:
    """Type a list of JSON scalars (None = missing) as the narrowest column kind that holds it."""
    kinds = set(map(type, values))
    has_missing = type(None) in kinds
    kinds.discard(type(None))
    if not kinds:
        return Chunk("null", None)
    if kinds == {int} and not has_missing:
        try:
            return Chunk("int", np.array(values, dtype=np.int64))
        except OverflowError:
            pass  # beyond int64: read as the nearest floats, as pyarrow reads such a column
    if kinds <= {int, float}:
        return Chunk("float", np.array([np.nan if v is None else v for v in values], dtype=np.float64))
    if kinds == {bool}:
        return Chunk("bool", np.array([-1 if v is None else v for v in values], dtype=np.int8))
    if kinds == {str}:
        categories: dict[str, int] = {}
        codes = [-1 if v is None else categories.setdefault(v, len(categories)) for v in values]
        return Chunk("cat", np.array(codes, dtype=np.int32), list(categories))
    array = np.empty(len(values), dtype=object)
    array[:] = [float(v) if type(v) is int else v for v in values]
    return Chunk("object", array)


class Column:
    """A growable typed buffer; see the module docstring for the kinds."""

    __slots__ = ("_buffer", "_index", "categories", "kind", "size")

    def __init__(self, kind: str = "null", size: int = 0) -> None:
        self.kind = kind
        self.size = size
        self.categories: list[str] = []
        self._index: dict[str, int] = {}
        self._buffer: np.ndarray | None = None if kind == "null" else np.empty(0, _NUMPY_DTYPES[kind])

    @classmethod
    def restore(cls, kind: str, values: np.ndarray | None, categories: Sequence[str] = ()) -> Column:
        """A column holding ``values`` (its own buffer, of the kind's dtype), as a cache saved it."""
        column = cls(kind, 0 if values is None else len(values))
        if values is not None:
            column._buffer = values
            column.categories = list(categories)
            column._index = {category: code for code, category in enumerate(column.categories)}
        return column

    def view(self) -> np.ndarray | None:
        """The filled part of the buffer (a view: rows are never modified once written)."""
        return None if self._buffer is None else self._buffer[: self.size]

    def nbytes(self) -> int:
        return 0 if self._buffer is None else self.size * self._buffer.itemsize

    def extend(self, chunk: Chunk, count: int) -> None:
        """Append ``count`` rows from ``chunk`` (kind ``null`` = ``count`` missing values)."""
        kind = chunk.kind
        if kind == "null":
            if self.kind == "int":
                self._retype("float")
            if self.kind != "null":
                self._reserve(count)
                self._buffer[self.size : self.size + count] = _MISSING[self.kind]
            self.size += count
            return
        if self.kind != kind:
            kind = self._widen(kind)
            if kind != chunk.kind:
                chunk = _convert(chunk, kind)
        values = chunk.values
        if kind == "cat":
            values = self._recode(chunk)
        self._reserve(count)
        self._buffer[self.size : self.size + count] = values
        self.size += count

    def _widen(self, incoming: str) -> str:
        """Retype this column so that it can take ``incoming`` values; return the common kind."""
        if self.kind == "null":
            self._buffer = np.empty(0, _NUMPY_DTYPES[incoming])
            self.kind = incoming
            if self.size:
                missing = self.size
                self.size = 0
                self.extend(Chunk("null", None), missing)
            return incoming
        if self.kind == "object":
            return "object"
        if {self.kind, incoming} == {"int", "float"}:
            self._retype("float")
            return "float"
        self._retype("object")
        return "object"

    def _retype(self, kind: str) -> None:
        old = self.view()
        if kind == "object":
            new = np.empty(self.size, dtype=object)
            new[:] = as_python(self.kind, old, self.categories)
            self.categories, self._index = [], {}
        else:
            new = old.astype(_NUMPY_DTYPES[kind])
        self.kind, self._buffer = kind, new

    def _recode(self, chunk: Chunk) -> np.ndarray:
        codes = []
        for category in chunk.categories:
            code = self._index.get(category)
            if code is None:
                code = self._index[category] = len(self.categories)
                self.categories.append(category)
            codes.append(code)
        mapping = np.array([*codes, -1], dtype=np.int32)
        return mapping[chunk.values]  # code -1 indexes the trailing -1: missing stays missing

    def _reserve(self, extra: int) -> None:
        needed = self.size + extra
        if needed > len(self._buffer):
            grown = np.empty(max(needed, len(self._buffer) * 3 // 2, 64), dtype=self._buffer.dtype)
            grown[: self.size] = self._buffer[: self.size]
            self._buffer = grown

    def numbers(self) -> np.ndarray:
        """The column as float64: NaN where a value is missing or not a number (a string, a bool)."""
        if self.kind in ("int", "float"):
            return self.view().astype(np.float64, copy=False)
        if self.kind == "object":
            return np.array([v if type(v) is float else np.nan for v in self.view().tolist()], dtype=np.float64)
        return np.full(self.size, np.nan)

    def series(self) -> pd.Series | np.ndarray:
        """The column as what a DataFrame should hold: numeric, boolean, categorical or object."""
        return _as_pandas(self.kind, self.view(), self.categories, self.size)


def _convert(chunk: Chunk, kind: str) -> Chunk:
    if kind == "float":
        return Chunk("float", chunk.values.astype(np.float64))
    array = np.empty(len(chunk.values), dtype=object)
    array[:] = as_python(chunk.kind, chunk.values, chunk.categories)
    return Chunk("object", array)


def as_python(kind: str, values: np.ndarray, categories: Sequence[str]) -> list[Any]:
    """Values of a typed column as the Python objects an ``object`` column holds."""
    if kind in ("int", "float"):
        return [None if v != v else float(v) for v in values.tolist()]
    if kind == "bool":
        return [None if v < 0 else bool(v) for v in values.tolist()]
    if kind == "cat":
        return [None if c < 0 else categories[c] for c in values.tolist()]
    return values.tolist()


def _as_pandas(kind: str, values: np.ndarray | None, categories: Sequence[str], size: int) -> Any:
    if kind == "null":
        return np.full(size, np.nan)
    if kind == "cat":
        return pd.Categorical.from_codes(values, categories=list(categories))
    if kind == "bool":
        return pd.array([None if v < 0 else bool(v) for v in values.tolist()], dtype="boolean")
    return values


class Table:
    """The records of one event: equal-length columns in order of first appearance."""

    def __init__(self) -> None:
        self.size = 0
        self.columns: dict[str, Column] = {}

    def extend(self, chunks: dict[str, Chunk], count: int) -> None:
        """Append ``count`` rows; a column absent from ``chunks`` gets missing values."""
        for name, chunk in chunks.items():
            column = self.columns.get(name)
            if column is None:
                if chunk.kind == "null":
                    continue  # never held a value: not a column yet (module docstring)
                column = self.columns[name] = Column("null", self.size)
            column.extend(chunk, count)
        for column in self.columns.values():
            if column.size == self.size:  # absent from ``chunks``
                column.extend(Chunk("null", None), count)
        self.size += count

    def nbytes(self) -> int:
        return sum(column.nbytes() for column in self.columns.values())
