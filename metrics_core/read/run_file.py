"""File access for the read side: the one seam between the readers and where a run's bytes live.

Everything above this module (``lines``, ``reader``, ``digest``, ``runs``) reads a run's file
through a ``RunFile``: what the file is now (``stat``), its bytes by range (``read``), and whether
a writer holds it (``writer_alive``).  ``LocalFile`` is the one for a local or network file
system; another backend (a bucket) is one more class with the same methods.

Contract of a ``RunFile``:

* ``stat()`` describes the file at its path *now* (None when nothing is there at the moment: a
  rotation or a copy in progress, looked at again later).  ``FileStat.identity`` changes with any
  write or replacement; ``FileStat.version`` changes only when the path names another file.
* ``open()`` pins the file the path names now; ``read`` and ``size`` then answer for that file,
  even after the path is replaced, until the next ``open()``.  ``opened_version`` is its version.
  It never waits and reads only a regular file: anything else at the path (a FIFO, a directory,
  a device), or a file the OS refuses to open, is a ``RunFileError`` naming the path and why.
  A ``LocalFile`` given ``within`` (its runs root) opens only a file that lies inside it: see
  ``open_regular``.
* ``read(offset, count)`` returns at most ``count`` bytes (fewer at the end of the file).
* ``cache_key()`` names the opened file for ``metrics_core.read.column_cache`` (None: do not cache it).
"""

from __future__ import annotations

import os
import stat as stat_mode
from pathlib import Path
from typing import NamedTuple, Protocol

from metrics_core.errors import RunFileError, RunNotFoundError
from metrics_core.write.crash_safety import lock_is_held
from metrics_core.write.writer import METRICS_FILENAME


class FileStat(NamedTuple):  # a tuple: built per refresh without a frozen dataclass's setattr per field
    """What a file is at one moment: ``identity`` changes with any write (size, mtime and ctime:
    ``cp -p`` over a run keeps size and mtime, but no write keeps ctime) or replacement."""

    identity: tuple[int, ...]
    version: int  # the inode: another value means another file at the same path
    size: int


class RunFile(Protocol):
    """One run's metrics file, wherever it lives; see the module docstring."""

    path: Path

    def stat(self) -> FileStat | None: ...

    def open(self) -> None: ...

    @property
    def opened_version(self) -> int | None: ...

    def size(self) -> int: ...

    def read(self, offset: int, count: int) -> bytes: ...

    def writer_alive(self) -> bool | None: ...

    def cache_key(self) -> str | None: ...

    def close(self) -> None: ...


def file_stat(stat: os.stat_result) -> FileStat:
    """A ``FileStat`` of an ``os.stat`` result."""
    return FileStat((stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns), stat.st_ino, stat.st_size)


_KINDS = {
    stat_mode.S_IFDIR: "a directory",
    stat_mode.S_IFIFO: "a FIFO (named pipe)",
    stat_mode.S_IFSOCK: "a socket",
    stat_mode.S_IFCHR: "a character device",
    stat_mode.S_IFBLK: "a block device",
}


def not_regular(mode: int) -> str | None:
    """Why a file of ``mode`` (``st_mode``) is no metrics file, or None for a regular file."""
    if stat_mode.S_ISREG(mode):
        return None
    kind = _KINDS.get(stat_mode.S_IFMT(mode), "a file of an unknown kind")
    return f"is {kind}, not a regular file"


OUTSIDE = "leads outside the runs root (a link, or a swap since the run was listed): not read"


def open_regular(path: str | os.PathLike[str], *, within: Path | None = None) -> int:
    """A read-only descriptor of the regular file at ``path``, or ``RunFileError`` naming the path
    and why not (another kind of file, the OS refused, or it lies outside ``within``), without
    ever waiting.

    ``O_NONBLOCK`` makes opening a FIFO return at once instead of waiting for a writer (a plain
    open would wait forever); the descriptor's ``fstat`` then decides, so a file swapped in
    between a check and the open cannot slip through.  Blocking mode is restored for the regular
    file, whose reads some network and FUSE file systems would otherwise fail with ``EAGAIN``.

    ``within`` (a resolved directory: the runs root): the opened file must be one that lies
    inside it (``lies_within``), judged on the descriptor, so that no link and no swap between
    discovery's look and this open leads a read to a file outside the root (another user's
    ``metrics.jsonl`` turned into a link to the owner's private run).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise RunFileError(str(path), f"cannot be opened: {exc.strerror}", exc.errno) from exc
    try:
        reason = not_regular(os.fstat(fd).st_mode)
        if reason is None and within is not None and not lies_within(fd, path, within):
            reason = OUTSIDE
        if reason is not None:
            raise RunFileError(str(path), reason)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def lies_within(fd: int, path: str | os.PathLike[str], within: Path) -> bool:
    """Whether the file open at ``fd`` (opened at ``path``) lies inside the resolved directory
    ``within``.

    Where ``/proc`` names a descriptor's file (Linux), that name decides: it is the kernel's own
    path of the opened file, so no swap before or after the open changes it (one ``readlink``).
    Elsewhere ``path`` is resolved (every link followed) and the file found there now must be the
    opened one (same device and inode): a link swapped in before the open and out again before
    this check resolves inside, but names another file (one ``lstat`` per component).  Either way
    a file of another directory cannot pass but by a hard link, and no one can make one to a
    file in a directory they cannot enter (the owner's 0700 one).
    """
    try:
        named = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        named = ""
    if named.startswith("/"):
        return _inside(named, within)
    real = os.path.realpath(path)
    if not _inside(real, within):
        return False
    try:
        found, opened = os.lstat(real), os.fstat(fd)
    except OSError:
        return False
    return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)


def _inside(name: str, directory: Path) -> bool:
    """Whether the absolute, resolved ``name`` is ``directory`` or lies below it (a string test:
    a fifth of ``Path.is_relative_to``'s cost, paid once per open)."""
    return name == str(directory) or name.startswith(os.path.join(directory, ""))


def run_file_path(run: str | os.PathLike[str]) -> Path:
    """The ``metrics.jsonl`` of a run directory, else ``run`` itself: a directory called
    ``metrics.jsonl`` is a metrics file that is no regular file, not a run holding one."""
    path = Path(run)
    return path / METRICS_FILENAME if path.is_dir() and path.name != METRICS_FILENAME else path


def named_directory(run: str | os.PathLike[str]) -> Path:
    """The resolved directory a run named by its user (a command's argument) is read within: the
    run directory itself, or the directory of a file named as the run, so that its file cannot be
    a link elsewhere (``open_regular``'s ``within``)."""
    path = Path(run)
    return (path if path.is_dir() and path.name != METRICS_FILENAME else path.parent).resolve()


def metrics_path(run: str | os.PathLike[str]) -> Path:
    """The ``metrics.jsonl`` of a run directory, or the file itself; RunNotFoundError if neither,
    RunFileError if it is there but no regular file (a FIFO, a directory)."""
    path = run_file_path(run)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise RunNotFoundError(
            f"{path}: no such run directory or metrics file (expected a directory holding {METRICS_FILENAME})"
        ) from None
    reason = not_regular(mode)
    if reason is not None:
        raise RunFileError(str(path), reason)
    return path


class LocalFile:
    """A ``RunFile`` on a local or network file system: ``stat`` of the path, ``pread`` of a
    descriptor held from ``open()`` (so a replaced file is read to its end, then noticed).

    ``within``: the resolved runs root; every ``open()`` (the first, and each after the path was
    replaced) opens only a file inside it (``open_regular``), and every read is of that
    descriptor, so no read reaches a file outside the root.  None: the file the path names,
    wherever it is.
    """

    def __init__(self, path: str | os.PathLike[str], *, within: Path | None = None) -> None:
        self.path = Path(path)
        self.within = within
        self._name = os.fspath(self.path)  # what os.stat takes without converting a Path each call
        self._fd: int | None = None
        self._version: int | None = None

    def stat(self) -> FileStat | None:
        try:
            return file_stat(os.stat(self._name))
        except FileNotFoundError:
            return None

    def open(self) -> None:
        self.close()
        self._fd = open_regular(self.path, within=self.within)
        self._version = os.fstat(self._fd).st_ino

    @property
    def opened_version(self) -> int | None:
        return self._version if self._fd is not None else None

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def read(self, offset: int, count: int) -> bytes:
        return os.pread(self._fd, count, offset)

    def writer_alive(self) -> bool | None:
        """Whether a ``MetricsWriter`` holds the file's lock now (None: not open, cannot tell)."""
        return None if self._fd is None else lock_is_held(self._fd)

    def cache_key(self) -> str | None:
        """A name for the opened file that no other file has while it exists (device and inode),
        for the columnar cache; None when not open."""
        if self._fd is None:
            return None
        stat = os.fstat(self._fd)
        return f"{stat.st_dev:x}-{stat.st_ino:x}"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()
