"""What a column's rows become for pandas, each row converted once and kept.

pandas wants categorical codes in the narrowest integer type, booleans with a mask, times
tz-aware, and checks a ``CategoricalDtype``'s categories whenever one is made: converting a whole
column per frame made each live append cost O(rows).  ``columns.Column`` keeps a ``Derived`` per
conversion and a ``CategoryTypes`` per list of categories, extended with the rows appended.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

_UTC = pd.DatetimeTZDtype("ns", "UTC")


class CategoryTypes:
    """The ``CategoricalDtype`` of a list of categories that only ever grows, made again only when
    it grew: pandas checks the categories of each one it is given (an index built and checked for
    repeats), which for every categorical column of every frame was most of a live append's frame."""

    __slots__ = ("_count", "_dtype")

    def __init__(self) -> None:
        self._count = -1
        self._dtype: pd.CategoricalDtype | None = None

    def of(self, categories: Sequence[str]) -> pd.CategoricalDtype:
        """The dtype of ``categories``: the list this was last asked for, grown or not."""
        if len(categories) != self._count:
            self._dtype, self._count = pd.CategoricalDtype(list(categories)), len(categories)
        return self._dtype


class Derived:
    """An array computed row by row from an append-only column, extended with the new rows only.

    pandas wants categorical codes in the narrowest integer type, booleans with a mask, times
    tz-aware: converting a whole column per frame made each live append cost O(rows).  Rows of
    the source never change, so neither do rows already converted, and a slice handed out stays
    valid while later rows are written after it (or into a grown copy).  The buffer is anything
    ``empty(n)`` makes that supports slice assignment and slicing as a view: a numpy array, or a
    pandas ``DatetimeArray``.
    """

    __slots__ = ("_buffer", "_empty", "filled")

    def __init__(self, empty: Callable[[int], Any]) -> None:
        self._empty = empty
        self._buffer: Any = None
        self.filled = 0

    def extend(self, source: np.ndarray, convert: Callable[[np.ndarray], Any], *, capacity: int) -> Any:
        """``convert(source)`` as a view, converting only the rows added since the last call
        (``source`` must be the previous one with rows appended).  A full buffer grows to
        ``capacity``, the source's own (it grows with its source, with the same slack)."""
        size = len(source)
        if size > self.filled:
            if self._buffer is None or size > len(self._buffer):
                grown = self._empty(max(size, capacity))
                if self.filled:
                    grown[: self.filled] = self._buffer[: self.filled]
                self._buffer = grown
            self._buffer[self.filled : size] = convert(source[self.filled : size])
            self.filled = size
        return self._buffer[:size]


def code_dtype(categories: int) -> type[np.signedinteger]:
    """The integer type ``pandas.Categorical`` keeps codes in for this many categories
    (``coerce_indexer_dtype``): codes of any other type are copied into it."""
    for dtype in (np.int8, np.int16, np.int32):
        if categories < np.iinfo(dtype).max:
            return dtype
    return np.int64


def empty_times(size: int) -> Any:
    return pd.array(np.zeros(size, dtype="M8[ns]"), dtype=_UTC)


def utc_times(rows: np.ndarray) -> Any:
    return pd.array(rows.view("M8[ns]"), dtype=_UTC)
