"""Run discovery under a runs root, and safe resolution of run names.

Discovery promises: every directory under ``root`` (down to ``max_depth``) that holds a
``metrics.jsonl`` is a run, named by its path relative to ``root`` with ``/`` separators.  One
that is no regular file (a FIFO, a directory) is listed too: its readers refuse it naming the
path and why (``run_file.open_regular``), so it shows as a run in error, not as no run.
Hidden directories (``.git``, ``.cache`` ...) are skipped: which directories discovery looks into
is one rule, ``walked``, that the watcher (``roots.watcher``) watches by too; a symlink is followed only when its
target stays inside ``root``, and a directory reached twice (through a link) is listed once.
An entry that cannot be looked into (a directory the OS refuses to list, a symlink loop, a link
through a file) never hides the others: ``discover_runs`` lists every other run and names each such
entry, relative to ``root``, with the reason (``UnreadableEntry``).  A link to nothing hides no run
(nothing is there) and is skipped, like an entry removed during the walk.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from metrics_core.errors import RunNotFoundError, RunPathError
from metrics_core.write.writer import METRICS_FILENAME

MAX_DEPTH = 6  # directories below the root discovery looks into, at most


def hidden(name: str) -> bool:
    """Whether an entry is hidden (``.git``, ``.cache``): discovery never looks at it."""
    return name.startswith(".")


def walked(parts: tuple[str, ...], *, max_depth: int = MAX_DEPTH) -> bool:
    """Whether discovery looks into the directory whose path below the root is ``parts`` (``()``:
    the root): none of them hidden, at most ``max_depth`` of them.  A run is a ``metrics.jsonl``
    in such a directory; the watcher watches these directories and no others."""
    return len(parts) <= max_depth and not any(hidden(part) for part in parts)


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


@dataclass(frozen=True, slots=True)
class UnreadableEntry:
    """An entry under the runs root that discovery could not look into, so no run below it is
    listed: its path relative to the root (``.`` for the root itself) and why."""

    name: str
    reason: str  # "symlink loop", "permission denied", "not a directory", or the OS's words

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


@dataclass(frozen=True, slots=True)
class RunListing:
    """What one walk of the runs root found: the runs, and the entries it could not look into,
    each sorted by name."""

    runs: tuple[RunInfo, ...]
    unreadable: tuple[UnreadableEntry, ...]


_REASONS = {
    errno.ELOOP: "symlink loop",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "not a directory",
}


def _reason(exc: OSError) -> str:
    return _REASONS.get(exc.errno) or exc.strerror or type(exc).__name__


def discover_runs(root: str | os.PathLike[str], *, max_depth: int = MAX_DEPTH) -> RunListing:
    """Every run under ``root`` and every entry that could not be looked into; see the module
    docstring for the rules.  Raises ``RunNotFoundError`` only when ``root`` itself is no directory.

    Cost: one ``scandir`` per directory, plus one ``stat`` per symlink (to follow it) and one
    ``realpath`` per symlink to a directory; a plain entry costs no system call of its own.
    """
    real_root = _real_root(root)
    runs: list[RunInfo] = []
    unreadable: list[UnreadableEntry] = []
    # Paths as strings: a ``Path`` per directory is most of a walk of ten thousand runs.
    inside = str(real_root).rstrip("/") + "/"
    seen: set[str] = {str(real_root)}

    def visit(directory: str, real_directory: str, relative: tuple[str, ...]) -> None:
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: (entry.is_symlink(), entry.name))
        except FileNotFoundError:
            return  # removed since its parent was listed
        except OSError as exc:
            unreadable.append(UnreadableEntry("/".join(relative) or ".", _reason(exc)))
            return
        for entry in entries:
            if hidden(entry.name):
                continue
            link = entry.is_symlink()  # from the directory listing: no system call
            try:
                if link:
                    entry.stat()  # follows it (kept for is_dir/is_file): a loop or a file on the way raises here
                if entry.name == METRICS_FILENAME:
                    if not link or _inside(Path(entry.path), real_root):  # any type: readers name a FIFO
                        runs.append(RunInfo("/".join(relative) or ".", Path(directory)))
                    continue
                if not walked((*relative, entry.name), max_depth=max_depth) or not entry.is_dir():
                    continue
            except FileNotFoundError:
                continue  # a link to nothing, or removed since the listing
            except OSError as exc:
                unreadable.append(UnreadableEntry("/".join((*relative, entry.name)), _reason(exc)))
                continue
            # Only a link can lead elsewhere: anything else is its real parent's real path plus its
            # name, so the walk resolves (an lstat per path component) links alone, not 1,000 runs.
            real = os.path.realpath(entry.path) if link else os.path.join(real_directory, entry.name)
            if real in seen or not real.startswith(inside):
                continue
            seen.add(real)
            visit(entry.path, real, (*relative, entry.name))

    visit(str(Path(root)), str(real_root), ())
    return RunListing(
        tuple(sorted(runs, key=lambda run: run.name)), tuple(sorted(unreadable, key=lambda entry: entry.name))
    )


def find_runs(root: str | os.PathLike[str], *, max_depth: int = MAX_DEPTH) -> list[RunInfo]:
    """Every run under ``root``, sorted by name; see the module docstring for the rules.  An entry
    that cannot be looked into is left out: ``discover_runs`` names them."""
    return list(discover_runs(root, max_depth=max_depth).runs)


def _inside(path: Path, real_root: Path) -> bool:
    """Whether ``path`` resolves inside ``real_root``; a symlink loop does not (resolving one raises
    RuntimeError on Python 3.11, OSError on later versions)."""
    try:
        return path.resolve().is_relative_to(real_root)
    except (RuntimeError, OSError):
        return False


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
        raise RunPathError(f"{name!r}: leads outside the runs root, or nowhere (a symlink escape or loop)")
    if not (directory / METRICS_FILENAME).exists():
        raise RunNotFoundError(f"{name!r}: no run there (no {METRICS_FILENAME} under {directory})")
    if not _inside(directory / METRICS_FILENAME, real_root):
        raise RunPathError(f"{name!r}: its {METRICS_FILENAME} links outside the runs root")
    return RunInfo(candidate.as_posix(), directory)
