"""What the tools write is their user's alone, and what they read back as their own must be.

The columnar cache, a root's SQL export, DuckDB's spills and the export lock hold copies of parsed
runs, and a run may be private (in a 0700 directory): its copies must be as private.  Another
user of the node may also write wherever the permissions let them, and a cache file with a valid
checksum they planted would draw their numbers in the owner's charts.  So:

* every directory made here is 0700 and every file 0600, whatever the umask
  (``private_directory``, ``create_private``); a file is created anew (``O_EXCL``) and never
  through a link (``O_NOFOLLOW``);
* a directory or file read back as the tools' own (the cache directory, a cache file) is used
  only when this user owns it and no one else can write to it (``untrusted``).  Anything else is
  refused: ``refuse`` logs one warning per directory per process, and the caller goes on
  without it (a run is read from its file).

The runs' own files are not made here: their modes are the training job's to choose.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat as stat_mode
import threading
from pathlib import Path

from metrics_core.errors import MetricsError

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600
_log = logging.getLogger(__name__)
_warned: set[str] = set()  # directories a refusal was logged for: one warning each per process
_warned_lock = threading.Lock()
_FIX = "give --cache-dir or METRICS_CACHE_DIR a directory only you can write: mkdir -m 700"


class UntrustedCacheError(MetricsError, PermissionError):
    """A cache directory another user owns or can write to: its contents could be anyone's."""


def untrusted(found: os.stat_result) -> str | None:
    """Why a cache directory or file of this ``stat`` may hold another user's bytes, or None: it
    is another user's, or group or others may write to it."""
    uid = os.geteuid()
    if found.st_uid != uid:
        return f"is owned by another user (uid {found.st_uid}, not {uid})"
    if found.st_mode & (stat_mode.S_IWGRP | stat_mode.S_IWOTH):
        return f"is writable by group or others (mode {stat_mode.S_IMODE(found.st_mode):o})"
    return None


def directory_refusal(path: Path) -> str | None:
    """Why the cache directory ``path`` is not to be used, or None (it is this user's alone, or
    not there yet: ``private_directory`` makes it so).  One ``stat``."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be looked at: {exc.strerror}"
    return untrusted(found)


def check_directory(path: Path) -> None:
    """``UntrustedCacheError`` naming ``path`` and why, when ``directory_refusal`` finds a reason."""
    reason = directory_refusal(path)
    if reason is not None:
        raise UntrustedCacheError(f"{path}: the cache directory {reason}: refused ({_FIX})")


def refuse(directory: Path, what: Path, reason: str) -> None:
    """Log that ``what`` (a cache directory or a file in ``directory``) was refused, and why: once
    per ``directory`` per process, however many runs would have used it."""
    with _warned_lock:
        if str(directory) in _warned:
            return
        _warned.add(str(directory))
    _log.warning("%s %s: refused, runs are read without the cache (%s)", what, reason, _FIX)


def private_directory(path: Path, *, tighten: bool = False) -> Path:
    """``path`` as a directory, each missing one (parents included) made 0700.

    ``tighten``: a directory of the tools' own naming inside a trusted cache directory (an
    export's, the spills'), made 0700 if it is already there with more (an older version made
    it by the umask); another user's there is ``UntrustedCacheError``.
    """
    missing = []
    parent = path
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process
            os.mkdir(directory, DIRECTORY_MODE)  # the umask only takes bits away: 0700 at most
    if tighten and not missing:
        found = os.lstat(path)
        if found.st_uid != os.geteuid() or not stat_mode.S_ISDIR(found.st_mode):
            raise UntrustedCacheError(f"{path}: is not a directory of this user's: refused")
        if stat_mode.S_IMODE(found.st_mode) != DIRECTORY_MODE:
            os.chmod(path, DIRECTORY_MODE)
    return path


def create_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY) -> int:
    """A descriptor of a new file at ``path``, 0600, never one already there nor through a link."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
