"""TensorBoard event files read with TensorBoard's own loader: the only module that imports it.

An event file is a sequence of TFRecords (a length, its checksum, a serialized ``Event``, its
checksum).  ``tensorboard.backend.event_processing.event_file_loader.RawEventFileLoader`` reads
them, checksums included, and stops before the first record that is incomplete (a writer still
writing it, or killed half-way) or fails its checksum, keeping its place: the next ``Load`` goes on
from there, which is how TensorBoard itself follows a live file.  ``Event`` protos are decoded by
TensorBoard's compiled protobuf classes, tensors by its ``tensor_util``: nothing here decodes
protobuf by hand.

Contract
--------
* ``EventFile.events()`` hands out each complete record once, in file order, as an ``Event``;
  ``offset`` is then the byte offset just past the last record handed out (a record's frame is
  its payload plus 16 bytes), so ``damage()`` can say where the file stops
  being readable and what is there: a torn record (fewer bytes than its frame) or a corrupt one
  (a whole frame whose checksum fails).  Nothing after damage is read, as in TensorBoard.
* ``EventFile(path, skip=n)`` starts after the first ``n`` records (a re-import): the loader has no
  seek, so they are read and checksummed again, not decoded.
* ``scalars(event, plugins)`` is a ``Summary``'s scalar values as floats exactly as TensorBoard's
  reader returns them (``simple_value``, or a rank-0 tensor of the ``scalars`` plugin); every
  other value is returned as skipped, with its kind.  A tensor's plugin is named only on its
  tag's first value: ``plugins`` (per run, across its files) remembers it, as TensorBoard's
  ``dataclass_compat`` does.

Assumed: the ``tensorboard`` extra (``pip install metrics-core[tensorboard]``) is installed;
without it ``load()`` raises ``ImportSourceError`` saying so.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrics_core.errors import MetricsError

FRAME_OVERHEAD = 16  # u64 length, u32 checksum of it, payload, u32 checksum of the payload
EVENT_FILE_MARK = "tfevents"
SCALARS_PLUGIN = "scalars"


class ImportSourceError(MetricsError, ValueError):
    """A source to import cannot be read: a missing extra, a file that is not what it claims."""


@dataclass(frozen=True, slots=True)
class Damage:
    """Where a file stops being readable: ``offset`` of the first unreadable byte, ``size`` of
    the file, and whether the bytes there are a ``torn`` record or a whole ``corrupt`` one."""

    offset: int
    size: int
    kind: str

    def describe(self, path: Path) -> str:
        what = "a torn record" if self.kind == "torn" else "a record that fails its checksum"
        return f"{path}: {self.size - self.offset} bytes at offset {self.offset} are {what}"


def load() -> Any:
    """TensorBoard's modules this package uses, or ``ImportSourceError`` naming the extra."""
    try:
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.compat.proto import event_pb2
        from tensorboard.util import tensor_util
    except ImportError as exc:
        raise ImportSourceError(
            f"reading TensorBoard event files needs TensorBoard: pip install 'metrics-core[tensorboard]' ({exc})"
        ) from None
    return event_file_loader, event_pb2, tensor_util


def is_event_file(name: str) -> bool:
    """Whether a file name is a TensorBoard event file's (``events.out.tfevents.*``)."""
    return EVENT_FILE_MARK in name and not name.startswith(".")


class EventFile:
    """One event file's complete records, handed out once each (module docstring)."""

    def __init__(self, path: Path, *, skip: int = 0) -> None:
        loader_module, event_pb2, _ = load()
        self.path = path
        self._parse = event_pb2.Event.FromString
        self._loader = loader_module.RawEventFileLoader(str(path))
        self._skip = skip
        self.records = 0  # complete records read, skipped ones included
        self.offset = 0

    def events(self) -> Iterator[Any]:
        """The new complete records, each an ``Event``; ``offset`` is past the last one handed out."""
        parse = self._parse
        for raw in self._loader.Load():
            self.offset += len(raw) + FRAME_OVERHEAD
            self.records += 1
            if self.records > self._skip:
                yield parse(raw)

    def first(self) -> Any | None:
        """The file's first event (its ``file_version``, stamped when the writer opened it), read
        with a loader of its own; None for an empty file."""
        loader_module, event_pb2, _ = load()
        for raw in loader_module.RawEventFileLoader(str(self.path)).Load():
            return event_pb2.Event.FromString(raw)
        return None

    def damage(self) -> Damage | None:
        """What lies past the last complete record, if anything (the file's bytes now)."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return None
        if size <= self.offset or self.records < self._skip:
            return None
        with open(self.path, "rb") as file:
            file.seek(self.offset)
            header = file.read(8)
        whole = len(header) == 8 and size - self.offset >= struct.unpack("<Q", header)[0] + FRAME_OVERHEAD
        return Damage(self.offset, size, "corrupt" if whole else "torn")


def scalars(event: Any, plugins: dict[str, str]) -> tuple[list[tuple[str, float]], list[tuple[str, str]]]:
    """``(scalars, skipped)`` of one event: ``(tag, value)`` and ``(tag, kind)`` (module docstring)."""
    if event.WhichOneof("what") != "summary":
        return [], []
    found, skipped = [], []
    for value in event.summary.value:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            found.append((value.tag, value.simple_value))
            continue
        if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
            plugins[value.tag] = value.metadata.plugin_data.plugin_name
        plugin = plugins.get(value.tag)
        if kind == "tensor" and plugin == SCALARS_PLUGIN:
            array = load()[2].make_ndarray(value.tensor)
            if array.ndim == 0 and array.dtype.kind in "fiu":
                found.append((value.tag, float(array.item())))
                continue
        skipped.append((value.tag, plugin or kind or "empty"))
    return found, skipped
