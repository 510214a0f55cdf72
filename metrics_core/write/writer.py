"""Append-only ``metrics.jsonl`` writer for one training session: what a record is.

Contract
--------
* One record is one line: a JSON object terminated by ``\\n``, flat except for the ``config``
  record of ``write_config``, starting with ``BASE_FIELD_ORDER``.  The newline is the commit
  point: bytes after the last ``\\n`` are not a record, and every reader ignores them.
* Lines reach the file through ``metrics_core.write.crash_safety``: one writer per file (a lock), a
  write that fails half-way undone, and at most one torn last line left by a crash, which the
  next writer cuts with its first record.  The tail's length is that writer's
  ``discarded_bytes``, which its first record (``session_start``) carries.
* OS errors become ``WriteFailedError`` (a ``MetricsError`` and an ``OSError`` with the original
  ``errno``) naming the file, the cause and whether the record was written, and the writer
  leaves its failure note (``metrics_core.write.failure_note``) so the run reads ``failed`` with the
  reason instead of ``crashed``.
* Invalid input raises *before* anything touches the file: the file stays byte-identical.
* One process per writer.  A forked child (a DataLoader worker, a ``multiprocessing`` pool)
  inherits the parent's open writers, but it would write at the offset it remembers from the
  fork, over the parent's later records, and the parent over its own: so in the child each
  inherited writer lets go of its descriptors at once (the lock stays the parent's alone and ends
  with the parent's ``close``), and its first ``write`` raises ``WriterForkedError`` saying who
  opened it; nothing the parent wrote, before or after the fork, is touched.

Assumed: the clock is only used for the ``time`` field; ordering comes from the file.
"""

from __future__ import annotations

import math
import operator
import os
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from metrics_core.errors import (
    RecordTypeError,
    RecordValueError,
    WriteFailedError,
    WriterForkedError,
    WriterStateError,
    os_cause,
)
from metrics_core.write.crash_safety import LineAppender
from metrics_core.write.failure_note import FAILURE_NOTE_FILENAME, FailureNote

SCHEMA_VERSION = 1
METRICS_FILENAME = "metrics.jsonl"
# Every record starts with these, in this order (docs/FORMAT.md).
BASE_FIELD_ORDER = ("schema_version", "time", "run_id", "session_id", "event", "step", "tokens_seen", "skipped_updates")
BASE_FIELDS = frozenset(BASE_FIELD_ORDER)
# One config record holds a run's hyperparameters, not its artifacts; the cap keeps every reader's
# per-line cost bounded (a vocabulary or a dataset manifest belongs in a file whose path is logged).
MAX_CONFIG_BYTES = 64 * 1024
MAX_CONFIG_DEPTH = 64
_PLAIN_SCALARS = frozenset((int, str, bool, type(None)))


@dataclass
class RunContext:
    """Where a session writes and how its records are labelled."""

    directory: Path
    run_id: str
    session_id: str

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)


@dataclass
class TrainingState:
    """The three counters stamped on every record; any object with these attributes works."""

    step: int = 0
    tokens_seen: int = 0
    skipped_updates: int = 0


class _HasCounters(Protocol):
    step: int
    tokens_seen: int
    skipped_updates: int


def json_scalar(where: str, value: Any) -> str | int | float | bool | None:
    """Return ``value`` as a plain JSON scalar, or raise naming ``where`` (``"'lr'"``, ``"config['lr']"``).

    numpy scalars are unwrapped with ``.item()`` (orjson refuses them without an option, and the
    training side must not import numpy just to recognise them).  NaN and ±Infinity are refused
    explicitly because orjson would silently write them as ``null``.
    """
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):
            raise RecordValueError(f"{where} is {value!r}: JSON has no NaN or Infinity, nothing was written")
        return value
    if kind is int or kind is str or kind is bool or value is None:
        return value
    if kind.__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return json_scalar(where, value.item())
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return json_scalar(where, float(value))
    if isinstance(value, str):
        return str(value)
    hint = " (call .item() on a 0-d tensor)" if hasattr(value, "item") else ""
    raise RecordTypeError(
        f"{where} has type {kind.__module__}.{kind.__qualname__}: expected a JSON scalar "
        f"(str, int, float, bool, None or a numpy scalar){hint}; nothing was written"
    )


def config_tree(where: str, value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON (dicts with str keys, lists, scalars), or raise naming the key path.

    Mappings become dicts and tuples become lists (``betas=(0.9, 0.95)`` is a common
    hyperparameter); sets are refused because their order, and so the line, would vary between
    runs.  The depth cap turns a config that contains itself into an error instead of a
    RecursionError, and stays far below orjson's own nesting limit.
    """
    if isinstance(value, Mapping | list | tuple) and depth >= MAX_CONFIG_DEPTH:
        raise RecordValueError(
            f"{where} nests deeper than {MAX_CONFIG_DEPTH} levels (does the config contain itself?); "
            "nothing was written"
        )
    if isinstance(value, Mapping):
        tree: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                kind = type(key)
                raise RecordTypeError(
                    f"{where} has the key {key!r} of type {kind.__module__}.{kind.__qualname__}: "
                    "config keys must be str at every level; nothing was written"
                )
            tree[str(key)] = config_tree(f"{where}[{key!r}]", item, depth + 1)
        return tree
    if isinstance(value, list | tuple):
        return [config_tree(f"{where}[{index}]", item, depth + 1) for index, item in enumerate(value)]
    return json_scalar(where, value)


def config_value(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``config`` field ``write_config`` writes: ``config`` as plain JSON, or the error it raises.

    Public so that a process that writes nothing (a non-zero rank) refuses exactly what rank 0's
    writer would.
    """
    if not isinstance(config, Mapping):
        kind = type(config)
        raise RecordTypeError(
            f"config has type {kind.__module__}.{kind.__qualname__}: expected a mapping of str keys; "
            "nothing was written"
        )
    tree = config_tree("config", config)
    size = len(orjson.dumps(tree))
    if size > MAX_CONFIG_BYTES:
        raise RecordValueError(
            f"config is {size} bytes as JSON, over the limit of {MAX_CONFIG_BYTES} bytes; log large "
            "artifacts (vocabularies, file lists) as files and record their path; nothing was written"
        )
    return tree


def _counter(state: object, name: str) -> int:
    value = getattr(state, name)
    if isinstance(value, bool):
        raise RecordTypeError(f"state.{name} is a bool: expected an int")
    try:
        return operator.index(value)
    except TypeError:
        kind = type(value)
        raise RecordTypeError(f"state.{name} has type {kind.__module__}.{kind.__qualname__}: expected an int") from None


# The writers open in this process, for ``_let_go_after_fork``.
_OPEN_WRITERS: weakref.WeakSet[MetricsWriter] = weakref.WeakSet()


def _let_go_after_fork() -> None:
    """In a forked child: release every writer inherited from the parent (module docstring)."""
    for writer in list(_OPEN_WRITERS):
        writer._let_go_after_fork()
    _OPEN_WRITERS.clear()


os.register_at_fork(after_in_child=_let_go_after_fork)


class MetricsWriter:
    """Context manager owning ``run.directory / "metrics.jsonl"`` for one session.

    >>> with MetricsWriter(RunContext("runs/a", "a", "s1")) as w:
    ...     w.write("train", state, train_loss=2.3, lr=3e-4)

    ``fsync=True`` makes each record survive power loss too, at the cost of a disk flush per
    write; the default survives the death of the process (``metrics_core.write.crash_safety``).
    ``clock`` returns nanoseconds since the Unix epoch.
    """

    def __init__(
        self,
        run: RunContext,
        *,
        fsync: bool = False,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.run = run
        self.path = Path(run.directory) / METRICS_FILENAME
        self.note_path = Path(run.directory) / FAILURE_NOTE_FILENAME
        self.fsync = fsync
        self.discarded_bytes = 0
        self._clock = clock
        self._stamp_second = -1
        self._stamp_prefix = ""
        self._file: LineAppender | None = None
        self._note: FailureNote | None = None
        self._forked_from: int | None = None  # set in a forked child: the parent that opened it

    def __enter__(self) -> MetricsWriter:
        if self._file is not None:
            raise WriterStateError(f"{self.path}: this writer is already open")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        file = LineAppender(self.path, fsync=self.fsync)
        try:
            self._note = FailureNote(self.note_path, fsync=self.fsync)
        except BaseException:
            file.close()
            raise
        self.discarded_bytes = file.size - file.end
        self._file, self._forked_from = file, None
        _OPEN_WRITERS.add(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file and release the lock (idempotent).

        A torn tail found at open and not yet cut (nothing was written) stays for the next writer,
        which reports it.
        """
        if self._note is not None:
            self._note.close()
            self._note = None
        if self._file is not None:
            self._file.close()  # releases the lock
            self._file = None
        _OPEN_WRITERS.discard(self)

    def _let_go_after_fork(self) -> None:
        """Close this forked child's copies of the descriptors, which touches neither the file nor
        the lock (the parent's descriptors hold both); later writes raise ``WriterForkedError``."""
        self._forked_from = os.getppid()  # the parent is inside os.fork(): alive, and the opener
        self.close()

    def _not_open(self, method: str) -> Exception:
        """The error of ``method`` called while the file is not open here."""
        if self._forked_from is None:
            return WriterStateError(f"{self.path}: {method} outside the writer's with-block")
        return WriterForkedError(
            f"{self.path}: {method} in process {os.getpid()}, a fork of process {self._forked_from}, which "
            "opened this writer; nothing was written (both would write at one offset, over each other's "
            "records): a forked child (a DataLoader worker, a multiprocessing pool) must open its own "
            "MetricsWriter on its own run directory, or send its records to the parent to write"
        )

    def record(self, event: str, state: _HasCounters, values: Mapping[str, Any]) -> dict[str, Any]:
        """Build and validate the record ``write`` would append, without writing it.

        This is the hot path of every ``write``: plain ints, strs and finite floats take a
        branch each; anything else goes through ``json_scalar`` for unwrapping or a clear error.
        """
        if type(event) is not str or not event:
            raise RecordTypeError(f"event must be a non-empty str, got {event!r}")
        if not BASE_FIELDS.isdisjoint(values):
            clash = ", ".join(sorted(map(repr, BASE_FIELDS.intersection(values))))
            raise RecordValueError(
                f"{clash} collide with base fields set by the writer; rename them (nothing was written)"
            )
        step, tokens_seen, skipped = state.step, state.tokens_seen, state.skipped_updates
        if not (type(step) is int and type(tokens_seen) is int and type(skipped) is int):
            step, tokens_seen, skipped = (
                _counter(state, "step"),
                _counter(state, "tokens_seen"),
                _counter(state, "skipped_updates"),
            )
        record: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "time": self._timestamp(),
            "run_id": self.run.run_id,
            "session_id": self.run.session_id,
            "event": event,
            "step": step,
            "tokens_seen": tokens_seen,
            "skipped_updates": skipped,
            **values,
        }
        for value in values.values():
            kind = type(value)
            if kind is float:
                if value - value:  # nan (truthy) only for NaN and ±Infinity, else 0.0
                    break
            elif kind is not int and kind is not str and kind is not bool and value is not None:
                break
        else:
            return record
        for key, value in values.items():  # a value to unwrap or refuse: json_scalar names its key
            if type(value) not in _PLAIN_SCALARS:
                record[key] = json_scalar(repr(key), value)
        return record

    def _timestamp(self) -> str:
        """UTC ISO-8601 with offset; the date-time part is formatted once per second, not per call."""
        seconds, nanos = divmod(self._clock(), 1_000_000_000)
        if seconds != self._stamp_second:
            self._stamp_second = seconds
            self._stamp_prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(seconds))
        return f"{self._stamp_prefix}{str(nanos // 1000).zfill(6)}+00:00"  # zfill: cheaper than a format spec

    def write(self, event: str, state: _HasCounters, /, **values: Any) -> dict[str, Any]:
        """Append one record and flush it to the OS; return the record as written."""
        if self._file is None:
            raise self._not_open("write()")
        record = self.record(event, state, values)
        self._append(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
        return record

    def write_config(self, state: _HasCounters, config: Mapping[str, Any], /) -> dict[str, Any]:
        """Append the run's hyperparameters as one ``config`` record; return the record as written.

        The one record whose value may nest: ``{"config": {...}}`` holds dicts (str keys), lists
        and JSON scalars, so a dashboard can show and diff the configs of runs and sessions.  Every
        other event stays flat, which keeps the hot ``write`` path and the columnar reader simple.
        Refused before anything is written: a non-str key or a non-JSON value (RecordTypeError),
        NaN/Infinity or a config over ``MAX_CONFIG_BYTES`` once serialized (RecordValueError), each
        naming the key path such as ``config['optim']['lr']``.
        """
        if self._file is None:
            raise self._not_open("write_config()")
        record = self.record("config", state, {})
        record["config"] = config_value(config)
        self._append(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
        return record

    def _append(self, line: bytes) -> None:
        """Append one complete line; OS errors are raised as ``WriteFailedError`` after the failure note."""
        file = self._file
        start = file.end
        try:
            file.append(line)
        except OSError as exc:
            if file.end == start:
                consequence = "the file still ends on a complete record; this record was not written"
            else:  # the newline landed; the fsync, or the deferred cut, after it failed
                consequence = "this record was written, but the fsync or tail cut after it did not complete"
            cause = os_cause(exc)
            failure = WriteFailedError(exc.errno, f"{self.path}: write failed: {cause}; {consequence}", str(self.path))
            self._note.tell(
                failure,
                session_id=self.run.session_id,
                time=self._timestamp(),
                error=cause,
                end=file.end,
                size=file.size,
            )
            raise failure from exc
