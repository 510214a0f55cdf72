"""inotify watches on the directories discovery walks, and nothing else.

An inotify watch is a kernel object counted against the user's limit (``max_user_watches``,
shared by every process of the user on the node): a watcher that watched the whole tree would let
anyone who can write into the runs root (a ``.git`` of 20,000 folders, a checkpoint tree deeper
than discovery looks) spend them.  ``InotifyTree`` watches the root and each directory
``discovery.walked`` says discovery looks into: not a hidden one, nor one deeper than
``discovery.MAX_DEPTH``, nor a link (a run reached through a link is found by the store's safety
``stat``).  A directory created later gets its watch (and those of its walked subdirectories) when
its creation is read, and is then listed once, so a run written into it before the watch existed
is reported too.

What is reported, on the tree's thread, to ``on_event(directory, name, kind)``: ``kind`` is
``"changed"`` (a file written or closed after writing), ``"entry"`` (a file created, deleted or
moved), ``"directory"`` (a directory created, deleted or moved) or ``"lost"`` (the kernel's queue
overflowed: anything may have changed; ``directory`` is the root).  Opening or reading a file is
not asked for (no ``IN_OPEN``/``IN_CLOSE_NOWRITE``): a reader's own reads cost no event.

The libc calls go through ``ctypes``; nothing else is imported.  ``OSError`` from ``start``
(``ENOSPC``: out of watches; ``EMFILE``: out of instances) leaves no watch and no thread behind.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from metrics_core.roots.discovery import walked

IN_MODIFY, IN_CLOSE_WRITE = 0x2, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED = 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW, IN_EXCL_UNLINK, IN_ISDIR = 0x01000000, 0x02000000, 0x04000000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
WATCH_MASK = (
    IN_MODIFY
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
_libc = None

OnEvent = Callable[[Path, str, str], None]


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # the process's own libc (no ``find_library``: it runs ldconfig)
    return _libc


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class InotifyTree:
    """Watches the walked directories under ``root``; see the module docstring.  ``start`` adds
    the watches and the reading thread, ``stop`` ends both."""

    def __init__(self, root: Path, on_event: OnEvent) -> None:
        self.root = Path(root)
        self._on_event = on_event
        self._fd = -1
        self._wake_r = self._wake_w = -1
        self._paths: dict[int, tuple[Path, tuple[str, ...]]] = {}  # wd -> (directory, its parts below root)
        self._thread: threading.Thread | None = None

    @property
    def watches(self) -> int:
        """Directories watched now."""
        return len(self._paths)

    def start(self) -> InotifyTree:
        self._fd = _check(_lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")
        try:
            self._add(self.root, (), strict=True)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            self._paths.clear()
            raise
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=f"inotify {self.root}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            os.write(self._wake_w, b"x")
            self._thread.join(timeout=5)
            self._thread = None
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
        if self._fd >= 0:
            os.close(self._fd)  # drops every watch
            self._fd = -1
        self._paths.clear()

    def _add(self, directory: Path, parts: tuple[str, ...], *, strict: bool = False) -> list[Path]:
        """Watch ``directory`` and the walked directories below it; returns the runs' files found
        there (present before their watch could report them).  ``strict``: a failure to watch
        ``directory`` itself raises (the root); below it, a directory that vanished or cannot be
        read is skipped, and running out of watches raises."""
        wd = _lib().inotify_add_watch(self._fd, os.fsencode(directory), WATCH_MASK)
        if wd < 0:
            code = ctypes.get_errno()
            if strict or code in (errno.ENOSPC, errno.ENOMEM):
                raise OSError(code, f"inotify_add_watch {directory}: {os.strerror(code)}")
            return []
        self._paths[wd] = (directory, parts)
        found = []
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            return found
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False) and walked((*parts, entry.name)):
                    found += self._add(Path(entry.path), (*parts, entry.name))
                elif entry.is_file(follow_symlinks=False):
                    found.append(Path(entry.path))
            except OSError:
                continue
        return found

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                return
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                continue
            self._dispatch(data)

    def _dispatch(self, data: bytes) -> None:
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _, length = _HEADER.unpack_from(data, offset)
            name = os.fsdecode(data[offset + _HEADER.size : offset + _HEADER.size + length].rstrip(b"\0"))
            offset += _HEADER.size + length
            if mask & IN_Q_OVERFLOW:
                self._on_event(self.root, "", "lost")
                continue
            if mask & IN_IGNORED:
                self._paths.pop(wd, None)  # the directory went: the kernel dropped its watch
                continue
            watched = self._paths.get(wd)
            if watched is None:
                continue
            directory, parts = watched
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                self._on_event(directory, "", "directory")
            elif mask & IN_ISDIR:
                if mask & (IN_CREATE | IN_MOVED_TO) and walked((*parts, name)):
                    try:
                        files = self._add(directory / name, (*parts, name))
                    except OSError:
                        files = []  # out of watches: the store's safety poll and rediscovery still see it
                    for path in files:
                        self._on_event(path.parent, path.name, "entry")
                self._on_event(directory, name, "directory")
            elif mask & (IN_MODIFY | IN_CLOSE_WRITE):
                self._on_event(directory, name, "changed")
            else:
                self._on_event(directory, name, "entry")
