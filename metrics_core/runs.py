"""Run discovery under a runs root, safe resolution of run names, and run health from the log.

Discovery promises: every directory under ``root`` (down to ``max_depth``) that holds a
``metrics.jsonl`` is a run, named by its path relative to ``root`` with ``/`` separators.
Hidden directories (``.git``, ``.cache`` ...) are skipped; a symlink is followed only when its
target stays inside ``root``, and a directory reached twice (through a link) is listed once.

Status comes from the file alone, never from a heartbeat thread:

* ``finished`` / ``failed`` / ``interrupted`` — the last record is a ``session_end`` with that status;
* ``live``     — the last record is recent: younger than ``max(60 s, 5 × the usual gap)``;
* ``stalled``  — no recent record, but a writer still holds the file's lock (a hung job) or we
  cannot tell;
* ``crashed``  — no recent record and no writer holds the lock: the process ended without a
  ``session_end`` (SIGKILL, OOM, node loss); also a torn last line with no writer behind it;
* ``empty``    — the file holds no complete record yet.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from metrics_core.errors import RunNotFoundError, RunPathError
from metrics_core.reader import RunReader
from metrics_core.writer import METRICS_FILENAME

STALL_FLOOR_S = 60.0
STALL_GAPS = 5.0
END_STATUSES = ("finished", "failed", "interrupted")


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A discovered run: its name relative to the root and its directory."""

    name: str
    directory: Path

    @property
    def metrics_path(self) -> Path:
        return self.directory / METRICS_FILENAME


def _real_root(root: str | os.PathLike[str]) -> Path:
    path = Path(root)
    if not path.is_dir():
        raise RunNotFoundError(f"{path}: the runs root does not exist or is not a directory")
    return path.resolve()


def find_runs(root: str | os.PathLike[str], *, max_depth: int = 6) -> list[RunInfo]:
    """Every run under ``root``, sorted by name; see the module docstring for the rules."""
    real_root = _real_root(root)
    runs: list[RunInfo] = []
    seen: set[Path] = {real_root}

    def visit(directory: Path, relative: tuple[str, ...]) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda entry: (entry.is_symlink(), entry.name))
        except OSError:
            return  # unreadable or vanished: nothing to list
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.name == METRICS_FILENAME and relative and _inside(Path(entry.path), real_root):
                if entry.is_file():
                    runs.append(RunInfo("/".join(relative), directory))
                continue
            if len(relative) >= max_depth or not entry.is_dir():
                continue
            real = Path(entry.path).resolve()
            if real in seen or not _inside(real, real_root):
                continue
            seen.add(real)
            visit(Path(entry.path), (*relative, entry.name))

    if (real_root / METRICS_FILENAME).is_file():
        runs.append(RunInfo(".", Path(root)))
    visit(Path(root), ())
    return sorted(runs, key=lambda run: run.name)


def _inside(path: Path, real_root: Path) -> bool:
    return path.resolve().is_relative_to(real_root)


def resolve_run(root: str | os.PathLike[str], name: str) -> RunInfo:
    """The run called ``name`` under ``root``, refusing anything that would read outside it."""
    real_root = _real_root(root)
    if not name or "\x00" in name:
        raise RunPathError(f"{name!r}: empty or invalid run name")
    candidate = Path(name)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise RunPathError(f"{name!r}: a run name is a path relative to the runs root, without '..'")
    directory = Path(root) / candidate
    if not _inside(directory, real_root):
        raise RunPathError(f"{name!r}: resolves outside the runs root {real_root} (symlink escape)")
    if not (directory / METRICS_FILENAME).is_file():
        raise RunNotFoundError(f"{name!r}: no run there (no {METRICS_FILENAME} under {directory})")
    if not _inside(directory / METRICS_FILENAME, real_root):
        raise RunPathError(f"{name!r}: its {METRICS_FILENAME} links outside the runs root")
    return RunInfo(candidate.as_posix(), directory)


def run_status(reader: RunReader, *, now: datetime) -> str:
    """The run's health from its log and its writer lock; see the module docstring."""
    last = reader.last_record_time
    if last is None:
        return "empty"
    if reader.last_event == "session_end":
        status = reader.last_end_status
        return status if status in END_STATUSES else "finished"
    alive = reader.writer_alive()
    if reader.pending_bytes and alive is False:
        return "crashed"
    gap = reader.typical_gap_s() or 0.0
    if (now - last).total_seconds() <= max(STALL_FLOOR_S, STALL_GAPS * gap):
        return "live"
    return "crashed" if alive is False else "stalled"
