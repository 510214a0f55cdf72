"""Compact, append-only columnar storage for the records of one event of one run.

Why not a list of dicts or a growing DataFrame: a dict per record costs an order of magnitude more memory and
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
``null`` and absent are one thing in JSON lines, and pyarrow cannot tell them apart.  A field held
on few of its event's rows (a per-task evaluation every thousand steps) is stored as those rows and
their values instead (``column_table.SparseColumn``), so that it costs what it holds.

Rows are only ever appended, never changed, so a slice handed out by ``view`` stays valid, and so
does every conversion of a row: ``series``, ``times`` and ``codes`` convert each row for pandas once
and keep the result (``Derived``), so a frame after an append costs O(appended rows), not O(rows).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.read.row_conversions import CategoryTypes, Derived, code_dtype, empty_times, utc_times

NUMPY_DTYPES = {"int": np.int64, "float": np.float64, "bool": np.int8, "cat": np.int32, "object": object}
MISSING = {"float": np.nan, "bool": -1, "cat": -1, "object": None}
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


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

    __slots__ = ("_buffer", "_derived", "_index", "_types", "categories", "kind", "recount", "size")

    def __init__(self, kind: str = "null", size: int = 0) -> None:
        self.kind = kind
        self.size = size
        self.categories: list[str] = []
        self._index: dict[str, int] = {}
        self._buffer: np.ndarray | None = None if kind == "null" else np.empty(0, NUMPY_DTYPES[kind])
        self._derived: dict[str, tuple[Any, Derived]] = {}  # name -> (what it was made for, rows)
        self._types = CategoryTypes()
        self.recount = False  # missing values grew the buffer: ``column_table.Table`` may hold it sparse

    @classmethod
    def restore(cls, kind: str, values: np.ndarray | None, categories: Sequence[str] = ()) -> Column:
        """A column holding ``values`` (of the kind's dtype), as a cache saved it.

        ``values`` may be a view of a larger buffer (the cache file's table, read once): rows are
        never written once held, and the first append grows the column into a buffer of its own.
        """
        column = cls(kind, 0 if values is None else len(values))
        if values is not None:
            column._buffer = values
            column.categories = list(categories)
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
                self.recount |= self.size + count > len(self._buffer)  # O(rows) at most once per growth
                self._reserve(count)
                self._buffer[self.size : self.size + count] = MISSING[self.kind]
            self.size += count
            return
        if self.kind != kind:
            kind = self._widen(kind)
            if kind != chunk.kind:
                chunk = convert(chunk, kind)
        values = chunk.values
        if kind == "cat":
            values = self._recode(chunk)
        self._reserve(count)
        self._buffer[self.size : self.size + count] = values
        self.size += count

    def put(self, value: Any) -> bool:
        """Append ``value`` if it is a float and this a ``float`` column, or an int64 and this an
        ``int`` one, as ``extend`` with its one-row chunk would; else append nothing and say so."""
        if not (
            (type(value) is float and self.kind == "float")
            or (type(value) is int and self.kind == "int" and _INT64_MIN <= value <= _INT64_MAX)
        ):
            return False
        self._reserve(1)
        self._buffer[self.size] = value
        self.size += 1
        return True

    def _widen(self, incoming: str) -> str:
        """Retype this column so that it can take ``incoming`` values; return the common kind."""
        if self.kind == "null":
            self._buffer = np.empty(0, NUMPY_DTYPES[incoming])
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
            new = old.astype(NUMPY_DTYPES[kind])
        self.kind, self._buffer = kind, new
        self._derived.clear()  # conversions of the old kind: never read again

    def _recode(self, chunk: Chunk) -> np.ndarray:
        if len(self._index) != len(self.categories):  # restored from a cache: indexed when first needed
            self._index = {category: code for code, category in enumerate(self.categories)}
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

    def held(self) -> int:
        """How many rows hold a value (O(rows))."""
        values = self.view()
        if self.kind in ("null", "int"):
            return 0 if values is None else len(values)
        if self.kind == "float":
            return len(values) - int(np.count_nonzero(np.isnan(values)))
        if self.kind == "object":
            return sum(value is not None for value in values.tolist())
        return int(np.count_nonzero(values >= 0))

    def numbers(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` as float64: NaN where a value is missing or not a number (a string, a bool)."""
        rows = range(self.size)[start:stop]
        if self.kind in ("int", "float"):
            return self.view()[rows.start : rows.stop].astype(np.float64, copy=False)
        if self.kind == "object":
            values = self.view()[rows.start : rows.stop].tolist()
            return np.array([v if type(v) is float else np.nan for v in values], dtype=np.float64)
        return np.full(len(rows), np.nan)

    def series(self) -> np.ndarray | pd.api.extensions.ExtensionArray:
        """The column as what a DataFrame should hold: numeric, boolean, categorical or object.

        O(rows converted since the last call): numbers and objects are views, categories and
        booleans come from conversions kept per column (``Derived``).
        """
        if self.kind == "cat":
            return pd.Categorical.from_codes(self.codes(), dtype=self._types.of(self.categories), validate=False)
        if self.kind == "bool":
            values = self._converted("bool", partial(np.empty, dtype=bool), lambda rows: rows > 0)
            missing = self._converted("missing", partial(np.empty, dtype=bool), lambda rows: rows < 0)
            return pd.arrays.BooleanArray(values, missing, copy=False)
        return np.full(self.size, np.nan) if self.kind == "null" else self.view()

    def codes(self, mapping: np.ndarray | None = None, categories: int | None = None) -> np.ndarray:
        """This ``cat`` column's codes, -1 = missing, in the integer type pandas keeps for
        ``categories`` categories (default: this column's), so that a ``Categorical`` takes them
        without a copy; through ``mapping`` (this column's code -> another code) when given.

        Each row is converted once: between calls ``mapping`` may gain entries, never change one.
        """
        dtype = code_dtype(len(self.categories) if categories is None else categories)
        empty = partial(np.empty, dtype=dtype)
        if mapping is None:
            return self._converted("codes", empty, lambda rows: rows.astype(dtype), made_for=dtype)
        through = np.append(mapping, -1).astype(dtype)  # code -1 indexes the trailing -1: missing stays missing
        return self._converted("mapped", empty, through.__getitem__, made_for=dtype)

    def times(self) -> pd.api.extensions.ExtensionArray:
        """This ``int`` column of nanoseconds since the epoch as UTC datetimes (each row converted once)."""
        return self._converted("times", empty_times, utc_times)

    def _converted(
        self, name: str, empty: Callable[[int], Any], convert: Callable[[np.ndarray], Any], made_for: Any = None
    ) -> Any:
        """``convert`` of every row, from the kept conversion ``name`` extended with the new rows;
        a new one when the kept one was ``made_for`` something else (a narrower dtype)."""
        made, derived = self._derived.get(name, (None, None))
        if derived is None or made != made_for:
            derived = Derived(empty)
            self._derived[name] = (made_for, derived)
        return derived.extend(self.view(), convert, capacity=len(self._buffer))


def convert(chunk: Chunk, kind: str) -> Chunk:
    """``chunk`` as a chunk of ``kind``, a kind it widens to (``float`` or ``object``)."""
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


def return_memory_to_os() -> None:
    """Give back freed memory: pyarrow's pool and glibc both keep it for reuse, which after a cold
    load of a large run is several times the data kept, and which a long-lived process that
    allocates arrays of ever larger sizes (a live run's) fragments into pages it never returns."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    with contextlib.suppress(AttributeError, OSError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


# glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``, at their defaults: an allocation this big
# or bigger is mapped on its own and unmapped when freed, and the heap's free top is given back past
# this size.  glibc starts there, then raises both with each mapped block freed (up to 32 and 64 MiB),
# after which a run's arrays come from the heap, whose freed pages stay resident until a trim.
HEAP_THRESHOLD = 128 << 10


def return_large_frees_at_once() -> None:
    """Make freed memory go back to the OS as soon as it is freed, for every allocation of
    ``HEAP_THRESHOLD`` or more and at the heap's top (a server's policy: call it once in the
    process; setting the thresholds stops glibc from raising them).  A page's snapshots, figures
    and encodings are arrays of a run's length, made and dropped per snapshot; on the heap the
    freed pages stayed resident until the next ``return_memory_to_os``, so the peak was the
    charts' level plus whatever a snapshot's work had freed since.  pyarrow is made to allocate
    from the same heap: its own allocator (mimalloc) kept what a cold read's parse threads had
    allocated until a later ``return_memory_to_os``, tens of MB on a long run."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    with contextlib.suppress(AttributeError, OSError):  # not glibc: its own policy
        libc = ctypes.CDLL(None)
        libc.mallopt(-1, HEAP_THRESHOLD)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, HEAP_THRESHOLD)  # M_MMAP_THRESHOLD
