"""A run's snapshot for the pages: ``RunView``, immutable, built from a reader and shared by every tab.

``build_view`` takes what a reader holds at one refresh (each event's columns, supersession and
``redone_by``, sessions, ingest health, lost work); given the previous snapshot of the same reader,
it extends what a live append left unchanged instead of recomputing it: the events that got no
record keep their columns (and the frames built from them) and masks, those that did get the
reader's new columns (O(columns + new rows)) and masks extended in buffers the ``Lineage`` keeps.
Anything else (a new session, a reset) is built from scratch.  The train records' throughput
(``tokens_per_s``, unless the run logs its own) is the snapshot's own column, extended the same
way: the charts, the compare page and the session overlay read it instead of recomputing it.

A frame is built only when asked for, of only the fields asked for (``EventColumns``): a page
draws a few of the keys a run logs, and a frame of all of them per snapshot costs O(fields)
however few are drawn.  A field the reader holds sparse (``column_table.SparseColumn``: a key on
few records) is kept as its ``Held`` rows and values, and made a pandas ``SparseArray`` when asked
for: a snapshot too costs what such keys hold, and a live append O(such keys), not their values.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.dashboard.store.grown_arrays import EXTENDED_TYPES, Appended, MaskBuffer, read_only
from metrics_core.dashboard.store.rows import event_rows, grown_in_last_session
from metrics_core.read.column_table import Held
from metrics_core.read.columns import Chunk
from metrics_core.read.health import IngestHealth
from metrics_core.read.run_reader import RunReader
from metrics_core.read.session_model import LostWork, Session
from metrics_core.read.throughput import tokens_per_second_rows

EVENTS = ("train", "validation", "checkpoint", "session_start", "session_end", "config")
# Per run, the values of this many ``bounded`` keys are kept, least recently used dropped first:
# such keys come one per page options asked for (figures of a smoothing, a theme, a filter, a zoom),
# and a client may ask for any number of them.  Tabs in use ask for a few at a time.  A key is a
# tuple of plain values (``ChartOptions.key``): hashing it here runs none of the callers' code.
BOUNDED_KEPT = 16
EMPTY: Any = object()  # ``Kept.value`` before anything is kept


class Kept:
    """One key's place in a ``Slots``: ``value`` (``EMPTY`` until the caller stores one) and
    ``lock``, which whoever computes or replaces the value holds meanwhile.  The store hands the
    place out and never computes: the caller computes, under ``lock``, and stores the value, so
    a snapshot is read by the layers above it and never calls back into them."""

    __slots__ = ("lock", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value: Any = EMPTY


class Slots:
    """Values by key, each in its ``Kept``; thread-safe.  ``kept(key)`` is the one call a caller
    makes: asked for the first time, a key gets an empty place.  Whoever takes its lock first
    computes the value; the others wait and read it.  One lock per key: a computation may ask for
    another key, and two threads asking for different keys do not wait for each other."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the dicts below; never held while a caller computes
        self._kept: dict[Hashable, Kept] = {}
        self._recent: OrderedDict[Hashable, None] = OrderedDict()  # the bounded keys, least recent first

    def kept(self, key: Hashable, *, bounded: bool = False) -> Kept:
        """The place of ``key``.  ``bounded``: a key of which there may be many (``BOUNDED_KEPT``
        are kept: a dropped one gets an empty place when next asked for, and a value stored in
        its old place meanwhile is lost with it)."""
        with self._lock:
            found = self._kept.get(key)
            if found is None:
                found = self._kept[key] = Kept()
            if bounded:
                self._recent[key] = None
                self._recent.move_to_end(key)
                while len(self._recent) > BOUNDED_KEPT:
                    del self._kept[self._recent.popitem(last=False)[0]]
            return found

    def holds(self, key: Hashable) -> bool:
        """Whether a value is kept under ``key``."""
        with self._lock:
            found = self._kept.get(key)
            return found is not None and found.value is not EMPTY


class Lineage(Slots):
    """State carried from one snapshot of a run to the next (incremental charts, throttled checks).

    Shared by every snapshot built from one reader, so a live update can extend what the previous
    snapshot computed instead of recomputing the run; a new reader (a reset after a failure)
    starts a new lineage.  A caller carries a key by taking its place's lock and replacing its
    value by the next one, computed from it (``EMPTY``: nothing carried yet).
    """


class EventColumns:
    """One event's records as of one snapshot: an array per field, in the reader's order, each as
    a frame's column holds it (``RunReader.frame_columns``), and frames of any set of the fields,
    each built when first asked for and kept.

    pandas checks every column a frame is given: a frame of every field of a run logging hundreds
    of keys costs that many checks per snapshot, however few of them a page draws.  The columns of
    an event that got no record are the previous snapshot's object, frames included.  Immutable
    once built; thread-safe (two threads asking at once may both build a frame, and both get the
    one kept first).
    """

    __slots__ = ("_arrays", "_frames", "_into", "_parent", "_picked", "derived", "names", "rows")

    def __init__(self, arrays: Mapping[str, Any], rows: int, derived: Mapping[str, np.ndarray] | None = None) -> None:
        self.names = tuple(arrays)
        self.derived = tuple(derived or ())  # computed, never logged: in a frame only when named in its fields
        self.rows = rows
        self._arrays = {**(derived or {}), **arrays}
        self._frames: dict[tuple[str, ...], pd.DataFrame] = {}
        self._parent: EventColumns | None = None
        self._picked: slice | np.ndarray | None = None
        self._into: Callable[[str, Any, Any], Any] | None = None

    def picked(self, rows: slice | np.ndarray, into: Callable[[str, Any, Any], Any] | None = None) -> EventColumns:
        """The rows ``rows`` picks (a slice, or a boolean mask of ``self.rows``), in order; each
        field is taken from this one when first asked for: O(fields asked for).  ``into(name,
        values, rows)``: how a field's pick is made (else ``values[rows]``)."""
        count = len(range(self.rows)[rows]) if isinstance(rows, slice) else int(np.count_nonzero(rows))
        taken = EventColumns({}, count)
        taken.names, taken.derived, taken._parent, taken._picked = self.names, self.derived, self, rows
        taken._into = into
        return taken

    def extended_pick(self, previous: EventColumns, before: int, extend: Callable[[str, Any, Any], Any]) -> None:
        """Take, as this pick's fields, those ``previous`` (the pick of the same rows of the
        previous snapshot's columns, whose first ``before`` rows these columns hold unchanged)
        made, each ``extend(name, its values, the rows from before on)``: O(new rows) a field
        instead of a new pick of every row.  A field whose type changed is picked when asked for."""
        for name, head in dict(previous._arrays).items():  # a page thread may be adding to it
            if isinstance(head, EXTENDED_TYPES) and self._parent.held(name) is None:
                new = self._parent.array(name)[before:]
                if new.dtype == head.dtype and type(new) is type(head):
                    self._arrays[name] = extend(name, head, new)

    def array(self, name: str) -> Any:
        """Field ``name``'s values (a numpy array or a pandas extension array: a ``SparseArray``
        for a field held on few rows, made when first asked for); KeyError if none."""
        found = self._arrays.get(name)
        if found is None:
            if self._parent is None:
                raise KeyError(name)
            values = self._parent.array(name)
            found = values[self._picked] if self._into is None else self._into(name, values, self._picked)
            found = self._arrays.setdefault(name, found)
        elif isinstance(found, Held):
            found = self._arrays[name] = found.series(self.rows)
        return found

    def held(self, name: str) -> Held | None:
        """Field ``name``'s rows that hold a value and their values, where it is held sparse (of
        this snapshot's every row, not a pick); else None.  O(1)."""
        found = self._arrays.get(name) if self._parent is None else None
        return found if isinstance(found, Held) else None

    def kind(self, name: str) -> str:
        """The numpy kind of field ``name``'s values ("f" for a sparse field of numbers), without
        making its array; KeyError if none."""
        found = self._arrays.get(name)
        if isinstance(found, Held):
            return "f" if found.values.kind in ("int", "float") else "O"
        return (found if found is not None else self.array(name)).dtype.kind

    def kinds(self) -> dict[str, str]:
        """``kind`` of every field the reader holds, in its order: one call for a run's every key."""
        return {name: self.kind(name) for name in self.names}

    def frame(self, fields: Collection[str] | None = None) -> pd.DataFrame:
        """A frame of the fields among ``fields`` (every field: None), in the reader's order; the
        same object for the same fields.  Do not modify it: every tab shares it."""
        names = self.names if fields is None else tuple(name for name in self.names + self.derived if name in fields)
        found = self._frames.get(names)
        if found is None:
            built = pd.DataFrame({name: self.array(name) for name in names}, index=pd.RangeIndex(self.rows), copy=False)
            found = self._frames.setdefault(names, built)
        return found


class _Frames(Mapping[str, pd.DataFrame]):
    """``RunView.frames``: each event's frame of every field, built when first asked for."""

    def __init__(self, view: RunView) -> None:
        self._view = view

    def __getitem__(self, event: str) -> pd.DataFrame:
        return self._view.frame(event)

    def __iter__(self) -> Iterator[str]:
        return iter(self._view.columns)

    def __len__(self) -> int:
        return len(self._view.columns)


@dataclass(frozen=True, eq=False)
class RunView:
    """Everything a page shows about one run, as of one refresh.

    Immutable, so anything derived from it (figures, diagnostics) is computed once per snapshot
    in its memo (``kept``) and shared by every tab: on a long run the charts and the diagnostics take far
    too long to build to redo per tab per refresh.
    """

    name: str
    records: int
    sessions: list[Session]
    columns: dict[str, EventColumns]  # per event; ``frame`` and ``frames`` build frames of them
    superseded: dict[str, np.ndarray]
    redone_by: np.ndarray  # per train row, the index of the session that redid it, -1: none
    ingest: IngestHealth
    last_record_time: datetime | None
    status: str
    lost_work: LostWork
    lineage: Lineage = field(default_factory=Lineage, repr=False)
    reason: str | None = None  # why the run stopped (``run_status.stop_reason``)
    _memo: Slots = field(default_factory=Slots, init=False, repr=False)

    def kept(self, key: Hashable, *, bounded: bool = False) -> Kept:
        """The place of ``key`` in this snapshot's memo (``Slots.kept``): anything derived from
        the snapshot (its charts, findings, a zoomed chart) is computed once, by the first caller
        to take its lock, and shared by every tab.  ``bounded``: a key of which there may be many
        (one per page options)."""
        return self._memo.kept(key, bounded=bounded)

    @property
    def frames(self) -> Mapping[str, pd.DataFrame]:
        """Each event's frame of every field (``frame(event)``)."""
        return _Frames(self)

    def rows(self, event: str) -> int:
        """How many ``event`` records there are."""
        return self.columns[event].rows

    def frame(self, event: str, fields: Collection[str] | None = None) -> pd.DataFrame:
        """``event``'s records, with the fields among ``fields`` (every field: None); O(those
        fields) the first time, then kept (``EventColumns.frame``)."""
        return self.columns[event].frame(fields)

    def effective(self, event: str, fields: Collection[str] | None = None) -> pd.DataFrame:
        """``frame(event, fields)`` of the records no later session redid: the frame itself when
        none was redone (a run that never resumed), not an O(rows × fields) copy per snapshot."""
        superseded = self.superseded[event]
        if not superseded.any():
            return self.frame(event, fields)
        kept = self.kept(("effective", event))
        with kept.lock:
            if kept.value is EMPTY:
                kept.value = self.columns[event].picked(~superseded, functools.partial(_pick_into, self.lineage, event))
        return kept.value.frame(fields)


def _effective_field(lineage: Lineage, event: str, name: str) -> Appended:
    """Where ``event``'s effective rows of field ``name`` are kept across a run's snapshots: a
    live append extends the previous snapshot's (``build_view``) instead of picking every row
    again while the previous snapshot still holds its pick."""
    return _buffer(lineage, ("effective", event, name), Appended)


def _pick_into(lineage: Lineage, event: str, name: str, values: Any, rows: np.ndarray) -> Any:
    if not isinstance(values, EXTENDED_TYPES):
        return values[rows]
    return _effective_field(lineage, event, name).picked(values, rows)


def _extend_into(lineage: Lineage, event: str, name: str, head: Any, new: Any) -> Any:
    return _effective_field(lineage, event, name).extended(head, new)


def _numeric_where_numbers(arrays: dict[str, Any]) -> dict[str, Any]:
    """``arrays`` with every mixed-type field that holds numbers made numeric.

    The reader keeps a field whose type changed between records (a string logged under
    ``train_loss`` once) as Python objects; every chart and check expects numbers there, and one
    string would break the loss-replay arithmetic.  As in ``Column.numbers``, only a number is a
    number: strings and booleans become missing values, drawn as gaps and counted by the
    diagnostics.  Only object fields pay; a well-formed run has none.
    """
    for name, values in arrays.items():
        if isinstance(values, np.ndarray) and values.dtype == object:
            numbers = _numbers(values)
            if not np.isnan(numbers).all():
                arrays[name] = numbers
        elif isinstance(values, Held) and values.values.kind == "object":
            numbers = _numbers(values.values.values)  # a field held on few rows: only those
            if not np.isnan(numbers).all():
                arrays[name] = Held(values.rows, Chunk("float", numbers))
    return arrays


def _numbers(values: np.ndarray) -> np.ndarray:
    """An object field's numbers as float64 (in the reader's object columns every number is a float)."""
    return np.array([value if type(value) is float else np.nan for value in values.tolist()], dtype=np.float64)


def _view_arrays(reader: RunReader, event: str) -> dict[str, Any]:
    arrays = reader.frame_columns(event, sparse=True)  # a key held on few rows costs what it holds
    # config records hold the nested "config" object: kept as written, never made numeric
    return arrays if event == "config" else _numeric_where_numbers(arrays)


def _throughput(lineage: Lineage, arrays: Mapping[str, Any], previous: EventColumns | None) -> dict[str, np.ndarray]:
    """The train records' ``tokens_per_s`` (unless the run logs its own, which is charted instead):
    with ``previous``, the train columns of the last snapshot when only the last session grew,
    the rows after it computed from the row before them and appended in a buffer the lineage
    keeps (O(new rows)); else all of them (O(rows), vectorised)."""
    if "tokens_per_s" in arrays or not len(arrays["step"]):
        return {}
    if previous is not None and "tokens_per_s" not in previous.derived:
        previous = None
    start = 0 if previous is None else previous.rows - 1
    times = arrays["time"][start:]
    times_ns = np.asarray(times.asi8, dtype=np.float64)
    times_ns[np.asarray(times.isna())] = np.nan
    rates = tokens_per_second_rows(
        np.asarray(arrays["tokens_seen"][start:], dtype=np.float64), times_ns, arrays["session_id"].codes[start:]
    )
    head = None if previous is None else previous.array("tokens_per_s")
    buffer = _buffer(lineage, ("derived", "tokens_per_s"), Appended)
    return {"tokens_per_s": buffer.extended(head, rates if head is None else rates[1:])}


def build_view(
    name: str,
    reader: RunReader,
    status: str,
    lineage: Lineage | None = None,
    *,
    previous: RunView | None = None,
    reason: str | None = None,
) -> RunView:
    """A snapshot of ``reader``; with ``previous``, the last snapshot of the same reader, what did
    not change is taken from it instead of recomputed.

    Only the last session grew (a live run's append): the events that got no record keep their
    columns and masks; those that did get new columns (the reader's: O(columns + new rows)) and
    their masks extended with "not superseded" (``grown_in_last_session``) in buffers the lineage keeps
    (``grown_arrays.MaskBuffer``): no O(rows) supersession or replay pass, no O(rows) copy.  Anything else (a
    new session, a reset) is built from scratch.  The effective rows a page picked of the previous
    snapshot (``RunView.effective``) are extended the same way (``grown_arrays.Appended``), field by
    field: on a resumed run, an append no longer picks every row again.  Every mask is read-only: an extended one shares
    its buffer with the snapshots before it.  Not thread-safe per lineage: ``RunStore.view``
    builds a run's snapshots under its run's lock.
    """
    lineage = lineage or Lineage()
    sessions = reader.sessions
    if previous is not None and (previous.ingest.resets != reader.resets or len(previous.sessions) != len(sessions)):
        previous = None
    columns: dict[str, EventColumns] = {}
    superseded: dict[str, np.ndarray] = {}
    grown: dict[str, bool] = {}  # per event: extended from ``previous`` (True) or built anew (False)
    for event in EVENTS:
        rows = event_rows(reader, event)
        before = -1 if previous is None else previous.rows(event)
        if rows == before:
            columns[event], superseded[event] = previous.columns[event], previous.superseded[event]
            continue
        arrays = _view_arrays(reader, event)
        grown[event] = 0 < before < rows and grown_in_last_session(reader, event, before, sessions[-1].session_id)
        extends = previous.columns[event] if grown[event] else None
        columns[event] = EventColumns(arrays, rows, _throughput(lineage, arrays, extends) if event == "train" else None)
        if grown[event]:
            superseded[event] = _extended(lineage, ("superseded", event), previous.superseded[event], rows)
        else:
            superseded[event] = read_only(reader.superseded(event))
    if "train" not in grown:
        redone = previous.redone_by
    elif grown["train"]:
        redone = _extended(lineage, ("redone_by",), previous.redone_by, columns["train"].rows, fill=-1)
    else:
        redone = reader.redone_by("train")  # read-only, and never changed in place
    view = RunView(
        name=name,
        records=reader.records,
        sessions=sessions,
        columns=columns,
        superseded=superseded,
        redone_by=redone,
        ingest=reader.ingest_health(),
        last_record_time=reader.last_record_time,
        status=status,
        lost_work=reader.lost_work(),
        lineage=lineage,
        reason=reason,
    )
    for event, extended in grown.items():  # the effective rows a page picked, extended by the new ones
        key = ("effective", event)
        if extended and previous._memo.holds(key) and superseded[event].any():
            pick = columns[event].picked(~superseded[event], functools.partial(_pick_into, lineage, event))
            pick.extended_pick(
                previous._memo.kept(key).value, previous.rows(event), functools.partial(_extend_into, lineage, event)
            )
            view.kept(key).value = pick
    return view


def _extended(lineage: Lineage, key: Hashable, mask: np.ndarray, rows: int, *, fill: bool | int = False) -> np.ndarray:
    """``mask`` with ``fill`` for the rows after it, from the buffer ``lineage`` keeps under ``key``."""
    return _buffer(lineage, key, lambda: MaskBuffer(fill)).extended(mask, rows)


def _buffer(lineage: Lineage, key: Hashable, new: Callable[[], Any]) -> Any:
    """The buffer ``lineage`` keeps under ``key``, ``new()`` the first time."""
    kept = lineage.kept(key)
    with kept.lock:
        if kept.value is EMPTY:
            kept.value = new()
        return kept.value
