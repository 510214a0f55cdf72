"""Where a runs root lives, behind the one interface the dashboard's store talks to: a local
directory (``LocalRoot``) or a prefix of a bucket (S3-compatible, Cloud Storage or Azure Blob
Storage: ``bucket_root.BucketRoot``), so
that the store and its pages never know which.

A root answers, each at a stated cost:

* which runs are there (``discover``; ``structure_generation`` moves when that may have changed)
  and which run a name names (``resolve``, refusing a name that would read outside the root);
* which runs' files changed since the last call (``take_changed``: hints, by run name);
* a reader for a run (``reader``), a file's size to order cold runs (``size``), and what a run's
  file is now without reading it (``stamp``), to tell whether a run that failed changed since;
* whether a run a reader once read is still as that reader left it (``unchanged``), and whether a
  run of a given status is looked at every safety interval even with no hint (``polls``).

``LocalRoot`` is a directory, its ``watcher.RunsWatcher`` and ``runs.discover_runs``: the watcher's
hints make a changed run due at once, and every run is still ``stat``-ed each safety interval
whatever the hints say (a lost inotify event, a network file system never mean stale data).
Every file it opens for a run is one inside the directory (``run_file.open_regular``'s
``within``), judged on the descriptor at each open: a run that other users can write to cannot
lead a read to a file outside the root, by a link or by a swap after discovery listed it.
``BucketRoot`` has no watcher: its hints come from a listing made at most once per interval, and
only a live run is looked at without one (module ``metrics_core.roots.bucket_root``).

``import metrics_core`` loads none of this (it imports the readers, and watchdog for a watched
directory).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from metrics_core.errors import RunNotFoundError
from metrics_core.read.run_file import LocalFile, RunFile
from metrics_core.read.run_reader import RunReader
from metrics_core.roots.discovery import RunInfo, RunListing, discover_runs, resolve_run
from metrics_core.roots.locations import LIST_INTERVAL_S, is_bucket_url

if TYPE_CHECKING:
    from metrics_core.read.column_cache import CachePolicy


class RunsRoot(Protocol):
    """A runs root wherever it lives; see the module docstring.  Thread-safe."""

    location: Path | str  # as the user named it: a directory, or ``s3://bucket/prefix``
    mode: str  # how changes are found: "inotify", "polling", "listing", "once" (not watched)
    mode_reason: str  # why, in a few words

    @property
    def structure_generation(self) -> int:
        """Moves whenever a run may have appeared or gone."""
        ...

    def discover(self) -> RunListing:
        """The runs and the entries that could not be looked into; ``MetricsError`` when the root
        itself cannot be listed."""
        ...

    def resolve(self, name: str) -> RunInfo:
        """The run called ``name``: ``RunPathError`` for a name leading outside the root,
        ``RunNotFoundError`` when no run is there."""
        ...

    def take_changed(self) -> set[str]:
        """Names of the runs whose file changed since the previous call (hints, not the truth)."""
        ...

    def reader(self, info: RunInfo, *, cache: CachePolicy | None) -> RunReader:
        """A new reader of the run, nothing read yet."""
        ...

    def peek_file(self, info: RunInfo) -> RunFile | None:
        """The run's file to peek at a big cold run's tail in, not opened, or None (no peek)."""
        ...

    def size(self, info: RunInfo) -> int:
        """The run's file size now or as last listed (0 when unknown)."""
        ...

    def stamp(self, info: RunInfo) -> tuple[int, ...] | None:
        """What the run's file is now, to compare with a later stamp (None: cannot tell)."""
        ...

    def unchanged(self, info: RunInfo, identity: tuple[int, ...] | None, *, hinted: bool) -> bool:
        """Whether the run's file is as a reader that read ``identity`` (``RunReader.read_identity``)
        left it, or gone; ``hinted``: a hint named the run since that read."""
        ...

    def polls(self, status: str) -> bool:
        """Whether a run of ``status`` is looked at every safety interval without a hint."""
        ...

    def relative(self, path: str) -> str:
        """``path`` (a run's file, as an error names it) said relative to the root."""
        ...

    def close(self) -> None: ...


def open_root(
    location: str | os.PathLike[str],
    *,
    force_polling: bool = False,
    list_interval: float = LIST_INTERVAL_S,
    watch: bool = True,
) -> RunsRoot:
    """The root at ``location``: ``s3://bucket/prefix``, ``gs://bucket/prefix`` or
    ``az://container/prefix`` is a bucket (its module imported only then), anything else a
    directory; ``RunNotFoundError`` when a directory is not there.  ``watch=False``: a root read
    once (``export``), so a directory gets no watcher (no thread, no inotify watches, no watchdog)."""
    if is_bucket_url(location):
        from metrics_core.roots.bucket_root import BucketRoot

        return BucketRoot(str(location), list_interval=list_interval)
    return LocalRoot(location, force_polling=force_polling, watch=watch)


class LocalRoot:
    """A directory of runs, watched unless read once (``watch=False``: the dashboard's hints about
    ``--runs`` are not the command's then); see the module docstring."""

    def __init__(self, root: str | os.PathLike[str], *, force_polling: bool = False, watch: bool = True) -> None:
        self.location = Path(root)
        if not self.location.is_dir():
            hint = (
                (
                    " (point --runs or METRICS_RUNS_DIR at a directory of runs, or add --demo to create it with a "
                    "demo run)"
                )
                if watch
                else ""
            )
            raise RunNotFoundError(f"{self.location}: the runs root does not exist or is not a directory{hint}")
        self.real = self.location.resolve()  # what every file read for a run must lie inside
        self.watcher = None
        self.mode, self.mode_reason = "once", "read once, not watched"
        if watch:
            from metrics_core.roots.watcher import RunsWatcher

            self.watcher = RunsWatcher(self.location, force_polling=force_polling).start()
            self.mode, self.mode_reason = self.watcher.mode, self.watcher.mode_reason

    @property
    def structure_generation(self) -> int:
        return 0 if self.watcher is None else self.watcher.structure_generation

    def discover(self) -> RunListing:
        return discover_runs(self.location)

    def resolve(self, name: str) -> RunInfo:
        return resolve_run(self.location, name)

    def take_changed(self) -> set[str]:
        """The watcher's changed run directories, named as discovery names them."""
        names = set()
        for directory in () if self.watcher is None else self.watcher.take_dirty():
            if directory.is_relative_to(self.location):
                names.add(directory.relative_to(self.location).as_posix())
        return names

    def reader(self, info: RunInfo, *, cache: CachePolicy | None) -> RunReader:
        return RunReader(info.directory, cache=cache, file=self._file(info))

    def peek_file(self, info: RunInfo) -> LocalFile:
        return self._file(info)

    def _file(self, info: RunInfo) -> LocalFile:
        return LocalFile(info.metrics_path, within=self.real)

    def size(self, info: RunInfo) -> int:
        try:
            return os.stat(info.metrics_path).st_size
        except OSError:
            return 0

    def stamp(self, info: RunInfo) -> tuple[int, ...] | None:
        """One ``stat``: the file's identity (``run_file.FileStat``), None when it cannot be read."""
        try:
            found = LocalFile(info.metrics_path).stat()
        except OSError:
            return None
        return None if found is None else found.identity

    def unchanged(self, info: RunInfo, identity: tuple[int, ...] | None, *, hinted: bool) -> bool:
        """One ``stat``, whatever the hints say (they only make a run due sooner)."""
        stamp = self.stamp(info)
        return stamp is None or stamp == identity

    def polls(self, status: str) -> bool:
        return True

    def relative(self, path: str) -> str:
        return os.path.relpath(path, self.location)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
