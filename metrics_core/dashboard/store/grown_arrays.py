"""Arrays a run's snapshots extend in place from one snapshot to the next, kept in its ``Lineage``
(``snapshot``).

A live append adds rows after the ones a snapshot holds; a fresh full-length array per append
would cost O(rows), allocated, page-faulted and copied, while the previous snapshot still holds
its own.  Each buffer here has slack and hands out prefixes: rows are only ever written after the
longest prefix handed out, so a snapshot holding one never sees it change (as
``row_conversions.Derived`` keeps a column's conversions), and an append costs the new rows.

* ``MaskBuffer``: a snapshot's supersession mask or ``redone_by``, extended with a fill;
* ``Appended``: an array extended with new values (the snapshot's derived ``tokens_per_s``; an
  event's effective rows of one field, ``RunView.effective``), or filled with the rows a mask picks.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pandas as pd

# What ``Appended`` extends: a numpy array, or a pandas extension array that slices as a view and
# takes slice assignment (a frame's session ids and times).  Anything else is copied per snapshot.
EXTENDED_TYPES = (np.ndarray, pd.Categorical, pd.arrays.DatetimeArray)


class MaskBuffer:
    """A snapshot mask extended in place with a fill (False; -1 for ``redone_by``): a buffer with
    slack (a quarter more than its rows) whose prefixes are handed out read-only."""

    __slots__ = ("_buffer", "_fill", "_size")

    def __init__(self, fill: bool | int) -> None:
        self._fill = fill
        self._buffer = np.zeros(0, dtype=bool)
        self._size = 0

    def extended(self, mask: np.ndarray, rows: int) -> np.ndarray:
        """``mask`` with the fill for the rows after it: O(new rows) when ``mask`` is the last
        prefix this buffer handed out; else (a mask built from scratch, a full buffer) one copy
        into a new buffer, which earlier prefixes do not share."""
        if mask.base is not self._buffer or len(mask) != self._size or rows > len(self._buffer):
            grown = np.full(rows + rows // 4 + 64, self._fill, dtype=mask.dtype)
            grown[: len(mask)] = mask
            self._buffer = grown
        else:
            self._buffer[self._size : rows] = self._fill
        self._size = rows
        return read_only(self._buffer[:rows])


class Appended:
    """One array (of ``EXTENDED_TYPES``) extended in place: a buffer with slack (an eighth more
    than its rows) whose prefixes are handed out, numpy ones read-only.  An append to the last
    prefix handed out costs the new rows; anything else one copy into a new buffer, which the
    prefixes handed out before keep alive as long as they are held.  Thread-safe."""

    __slots__ = ("_buffer", "_last", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffer: Any = None
        self._last: Any = None  # the last prefix handed out

    def extended(self, head: Any, new: Any) -> Any:
        """``head`` (None: nothing; else of ``new``'s type and dtype) followed by ``new``."""
        with self._lock:
            kept = 0 if head is None else len(head)
            rows = kept + len(new)
            if head is None or head is not self._last or rows > len(self._buffer):
                grown = _empty(new, rows)
                if kept:
                    grown[:kept] = head
                self._buffer = grown
            self._buffer[kept:rows] = new
            return self._handed(rows)

    def picked(self, values: Any, rows: np.ndarray) -> Any:
        """``values[rows]`` (``rows`` a boolean mask) in a new buffer, with slack to be extended."""
        with self._lock:
            count = int(np.count_nonzero(rows))
            self._buffer = _empty(values, count)
            if isinstance(values, np.ndarray):
                np.compress(rows, values, out=self._buffer[:count])
            else:
                self._buffer[:count] = values[rows]
            return self._handed(count)

    def _handed(self, rows: int) -> Any:
        prefix = self._buffer[:rows]
        self._last = read_only(prefix) if isinstance(prefix, np.ndarray) else prefix
        return self._last


def _empty(like: Any, rows: int) -> Any:
    size = rows + rows // 8 + 256
    if isinstance(like, np.ndarray):
        return np.empty(size, dtype=like.dtype)
    return type(like)._empty((size,), dtype=like.dtype)


def read_only(mask: np.ndarray) -> np.ndarray:
    mask.flags.writeable = False
    return mask
