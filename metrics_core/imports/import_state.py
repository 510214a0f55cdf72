"""What an import has written into a run, so that importing again adds nothing.

Each imported run directory holds ``.import-state.json`` beside its ``metrics.jsonl``: the source,
and per source file (an event file, a CSV) its session, the records of it imported and the bytes
they spanned; plus ``metrics_end``, the size of ``metrics.jsonl`` when the state was saved.

Contract
--------
* The state is saved (written whole, then renamed over the old one) after the records it counts
  are in ``metrics.jsonl``.  An import killed between the two leaves records past ``metrics_end``
  that the state does not count; ``cut_unsaved`` cuts them before the next import writes, under
  the writer's lock, so they are imported once, not twice.
* A run directory whose ``metrics.jsonl`` exists without a state was written by something else
  (a training job, another tool): ``ImportState.load`` refuses to import into it.

Assumed: one importer per run directory at a time; the writer's lock enforces it while it writes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from metrics_core.imports.event_files import ImportSourceError
from metrics_core.write.crash_safety import lock_exclusive
from metrics_core.write.writer import METRICS_FILENAME

STATE_FILENAME = ".import-state.json"


@dataclass
class SourceFile:
    """One source file's part of a run: its session, and how much of it is in the run."""

    name: str
    session_id: str
    first_wall: float = 0.0
    last_wall: float = 0.0
    records: int = 0  # complete records (or rows) of the source consumed
    offset: int = 0  # bytes of the source those span
    started: bool = False  # its session_start is written
    damaged: bool = False  # it ends on a torn or corrupt record


@dataclass
class ImportState:
    """A run's import state (module docstring)."""

    source: str
    origin: str
    metrics_end: int = 0
    files: list[SourceFile] = field(default_factory=list)
    plugins: dict[str, str] = field(default_factory=dict)
    ended: bool = False  # the last session's session_end is written

    @classmethod
    def load(cls, run_dir: Path, *, source: str, origin: str) -> ImportState:
        """The saved state of ``run_dir``, a new one for a new run; refuses a run no import wrote."""
        path = run_dir / STATE_FILENAME
        try:
            saved: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            if (run_dir / METRICS_FILENAME).exists():
                raise ImportSourceError(
                    f"{run_dir} holds a run that no import wrote (no {STATE_FILENAME}); "
                    "import into another root or run name"
                ) from None
            return cls(source=source, origin=origin)
        except (OSError, ValueError) as exc:
            raise ImportSourceError(f"{path}: unreadable import state ({exc})") from None
        if saved.get("source") != source:
            raise ImportSourceError(f"{run_dir} was imported from {saved.get('source')!r}, not {source!r}")
        files = [SourceFile(**entry) for entry in saved.pop("files", [])]
        return cls(**{**saved, "files": files})

    def save(self, run_dir: Path) -> None:
        """Write the state whole, then rename it into place (module docstring)."""
        self.metrics_end = os.stat(run_dir / METRICS_FILENAME).st_size
        temporary = run_dir / (STATE_FILENAME + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(asdict(self), file)
        os.replace(temporary, run_dir / STATE_FILENAME)

    def file(self, name: str) -> SourceFile | None:
        return next((entry for entry in self.files if entry.name == name), None)

    def cut_unsaved(self, run_dir: Path) -> int:
        """Cut records an import wrote after its last saved state (module docstring); the bytes cut."""
        path = run_dir / METRICS_FILENAME
        if not self.files or not path.exists():
            return 0
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            lock_exclusive(fd)  # BlockingIOError while another importer writes: refuse below
            extra = os.fstat(fd).st_size - self.metrics_end
            if extra > 0:
                os.ftruncate(fd, self.metrics_end)
            return max(extra, 0)
        except BlockingIOError:
            raise ImportSourceError(f"{path}: another process is writing this run") from None
        finally:
            os.close(fd)  # releases the lock
