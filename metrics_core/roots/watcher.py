"""One filesystem watcher per process over the runs root: which runs changed, and when runs appear.

Contract
--------
* It watches what discovery walks and nothing else (``discovery.walked``: no hidden directory,
  nothing deeper than discovery looks): with inotify (``inotify_tree``) one watch per such
  directory, so files another user writes into the root cannot spend the user's inotify watches;
  polling lists only those directories.
* The watching thread only bumps counters under a lock: a per-run-directory change count and a
  structure generation (runs or directories created, moved or deleted).  Readers are refreshed by
  their owners, when ``take_dirty`` says their run changed.  A lost batch of events (the kernel's
  queue overflowed) counts as a change of every run and of the structure.
* The reader's own ``open``/``close`` of a metrics file are not watched for (inotify), or ignored
  (polling), or every read would trigger the next one.
* inotify does not see writes made by other hosts to a network filesystem (NFS, Lustre, GPFS,
  CIFS ...).  The root's filesystem type is read from ``/proc/mounts``; on a network filesystem,
  when inotify limits are exhausted, or when asked (``force_polling``), watchdog's polling observer
  stats the walked tree every ``poll_interval`` seconds instead, and ``mode_reason`` says why.
* A watcher is a hint, not the source of truth: owners of open readers should still refresh them
  every few seconds (a no-change refresh is one ``stat``), so a lost event never means stale data.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from watchdog.events import (
    EVENT_TYPE_CLOSED_NO_WRITE,
    EVENT_TYPE_OPENED,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserverVFS

from metrics_core.roots.discovery import find_runs, hidden, walked
from metrics_core.roots.inotify_tree import InotifyTree
from metrics_core.write.writer import METRICS_FILENAME

NETWORK_FILESYSTEMS = frozenset(
    (
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "beegfs",
        "9p",
        "afs",
        "panfs",
        "wekafs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.juicefs",
    )
)
_IGNORED = (EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE)


def filesystem_type(path: Path, *, mounts_file: str | os.PathLike[str] = "/proc/mounts") -> str | None:
    """The type of the filesystem holding ``path`` (longest matching mount point), or None."""
    real = str(Path(path).resolve())
    best, kind = "", None
    try:
        with open(mounts_file, encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind


class _Counters(FileSystemEventHandler):
    """Runs on the watching thread: counts, nothing else."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changes: dict[Path, int] = {}
        self.structure = 0
        self.lost = 0  # batches of events the kernel dropped: every run may have changed

    def count(self, directory: Path, name: str, kind: str) -> None:
        """One event (``inotify_tree``'s kinds): ``name`` in ``directory`` changed, came or went."""
        with self.lock:
            if kind in ("directory", "lost"):
                self.structure += 1
                self.lost += kind == "lost"
            elif name == METRICS_FILENAME:
                self.changes[directory] = self.changes.get(directory, 0) + 1
                self.structure += kind == "entry"

    def on_any_event(self, event: FileSystemEvent) -> None:
        """A polling observer's event, counted as ``count`` counts ``inotify_tree``'s."""
        if event.event_type in _IGNORED or (event.is_directory and event.event_type == "modified"):
            return
        written = event.event_type in ("modified", "closed")
        kind = "directory" if event.is_directory else "changed" if written else "entry"
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if raw:
                path = Path(os.fsdecode(raw))
                self.count(path.parent, path.name, kind)
                if event.is_directory:
                    return


class RunsWatcher:
    """Watches ``root`` recursively; see the module docstring.  Use as a context manager."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        force_polling: bool = False,
        poll_interval: float = 1.0,
        mounts_file: str | os.PathLike[str] = "/proc/mounts",
    ) -> None:
        self.root = Path(root)
        self.poll_interval = poll_interval
        self._counters = _Counters()
        self._taken: dict[Path, int] = {}
        self._observer: BaseObserver | None = None
        self._tree: InotifyTree | None = None
        self._lost_taken = 0
        fs_type = filesystem_type(self.root, mounts_file=mounts_file)
        if force_polling:
            self.mode, self.mode_reason = "polling", "polling forced"
        elif fs_type in NETWORK_FILESYSTEMS:
            self.mode, self.mode_reason = (
                "polling",
                f"{fs_type} does not report other hosts' writes to inotify",
            )
        else:
            self.mode, self.mode_reason = "inotify", f"local filesystem ({fs_type or 'unknown'})"

    def start(self) -> RunsWatcher:
        """Start watching; falls back to polling when inotify cannot be set up."""
        if self.mode == "inotify":
            try:
                self._tree = InotifyTree(self.root, self._counters.count).start()
                return self
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                    raise
                self.mode = "polling"
                self.mode_reason = f"inotify limit reached ({errno.errorcode.get(exc.errno, exc.errno)})"
        observer = PollingObserverVFS(os.stat, self._walked_entries, polling_interval=self.poll_interval)
        self._observer = self._start(observer)
        return self

    def _walked_entries(self, directory: str | None) -> list[os.DirEntry]:
        """What the polling observer lists of ``directory``: its files, and the directories
        discovery walks into (``discovery.walked``), links to directories aside."""
        parts = Path(directory or ".").relative_to(self.root).parts
        kept = []
        with os.scandir(directory) as listing:
            for entry in listing:
                if hidden(entry.name):
                    continue
                try:
                    if entry.is_dir() and (entry.is_symlink() or not walked((*parts, entry.name))):
                        continue
                except OSError:
                    continue
                kept.append(entry)
        return kept

    def _start(self, observer: BaseObserver) -> BaseObserver:
        observer.schedule(self._counters, str(self.root), recursive=True)
        observer.daemon = True
        try:
            observer.start()
        except BaseException:
            observer.stop()
            raise
        return observer

    @property
    def watches(self) -> int:
        """inotify watches held (0 when polling)."""
        return 0 if self._tree is None else self._tree.watches

    def stop(self) -> None:
        if self._tree is not None:
            self._tree.stop()
            self._tree = None
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None

    def __enter__(self) -> RunsWatcher:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def structure_generation(self) -> int:
        """Bumped whenever a run or directory may have appeared or gone: time to rediscover."""
        with self._counters.lock:
            return self._counters.structure

    def take_dirty(self) -> set[Path]:
        """Run directories whose metrics file changed since the previous call."""
        with self._counters.lock:
            changes, lost = dict(self._counters.changes), self._counters.lost
        dirty = {path for path, count in changes.items() if self._taken.get(path) != count}
        self._taken = changes
        if lost != self._lost_taken:  # events were dropped: every run may have changed
            self._lost_taken = lost
            dirty |= {run.directory for run in find_runs(self.root)}
        return dirty
