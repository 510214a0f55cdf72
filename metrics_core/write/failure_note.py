"""The writer's failure note: why a run's last write failed, told even on a full disk.

Contract
--------
* At open the writer pre-sizes a hidden sidecar beside ``metrics.jsonl``,
  ``.metrics.jsonl.failure`` (``NOTE_BYTES`` of real, allocated bytes).  When a write fails in the
  OS, the writer overwrites it in place, without growing it, so that it fits on a full disk and
  under a file-size limit, with one JSON object padded with spaces: ``session_id``, ``time``,
  ``error`` (``"No space left on device (ENOSPC)"``), ``end`` (offset after the last complete
  record) and ``size`` (the file's size).
* The note applies only while ``metrics.jsonl`` still has exactly that ``end`` and ``size``: any
  record written later, by this session or a resumed one, moves ``end`` and makes it stale, and
  the note never touches ``metrics.jsonl``.  ``metrics_core.roots.discovery`` reads it (``parse_note``) to
  report such a run as ``failed`` with the reason, instead of ``crashed``.
* A blank note, one read while it is being overwritten (torn) or one of another shape is no
  note: the run then reads as it would without one.
* Assumed: an ordinary, not copy-on-write filesystem (on btrfs or ZFS an in-place overwrite needs
  free space, so the note is best effort there).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import orjson

from metrics_core.errors import WriteFailedError, os_cause

# Hidden, so run discovery and file listings ignore it.
FAILURE_NOTE_FILENAME = ".metrics.jsonl.failure"
NOTE_BYTES = 1024
NOTE_FIELDS = {"session_id": str, "time": str, "error": str, "end": int, "size": int}


class FailureNote:
    """The pre-sized note at ``path``, held open to be overwritten when a write fails.

    Opening writes its ``NOTE_BYTES`` now, while the disk has room: real bytes, not
    ``ftruncate``, since a sparse file would need new blocks at the moment the disk is full.  An
    existing note is kept as it is: it is stale unless the metrics file is still exactly as the
    failed write left it (module docstring), and then it still tells the truth.  Raises
    ``WriteFailedError`` naming the note when the OS refuses it.
    """

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self._file = io.FileIO(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644), "r+")
        try:
            if os.fstat(self._file.fileno()).st_size != NOTE_BYTES:
                os.pwrite(self._file.fileno(), b" " * (NOTE_BYTES - 1) + b"\n", 0)
                os.ftruncate(self._file.fileno(), NOTE_BYTES)
                if fsync:
                    os.fsync(self._file.fileno())
        except OSError as exc:
            self._file.close()
            raise WriteFailedError(
                exc.errno,
                f"{path}: cannot reserve the writer's failure note: {os_cause(exc)}; nothing was written",
                str(path),
            ) from exc
        except BaseException:
            self._file.close()
            raise

    def tell(self, failure: WriteFailedError, *, session_id: str, time: str, error: str, end: int, size: int) -> None:
        """Overwrite the note in place with ``failure``'s facts; a note that cannot be written is
        told on ``failure`` instead, which is what must propagate."""
        note = orjson.dumps(
            # session_id bounded: the note must fit NOTE_BYTES
            {"session_id": session_id[:100], "time": time, "error": error, "end": end, "size": size}
        )
        try:
            os.pwrite(self._file.fileno(), note.ljust(NOTE_BYTES - 1) + b"\n", 0)
            if self.fsync:
                os.fsync(self._file.fileno())
        except OSError as exc:
            failure.add_note(f"{self.path}: the failure note could not be written either: {os_cause(exc)}")

    def close(self) -> None:
        self._file.close()


def parse_note(data: bytes) -> dict[str, Any] | None:
    """The note's fields from its bytes, or None for a blank, torn or foreign note."""
    try:
        note = orjson.loads(data or b"null")
    except orjson.JSONDecodeError:
        return None
    if isinstance(note, dict) and all(type(note.get(key)) is kind for key, kind in NOTE_FIELDS.items()):
        return note
    return None
