"""A runs root in a bucket (``s3://bucket/prefix``, S3-compatible; ``gs://bucket/prefix``, Google
Cloud Storage; ``az://container/prefix``, Azure Blob Storage), with a bounded request cost.

The same ``runs_root.RunsRoot`` as a local directory, so the dashboard's store serves it unchanged;
run names are the keys under the prefix, as directories are under a local root.  Optional: needs
``pyarrow`` (``object_storage``); ``import metrics_core`` never loads this module.

Request cost, which is what a bucket charges for (TensorBoard lists and re-reads every object each
cycle, so its cost grows with the runs kept, not with the runs alive):

* The root is listed at most once per ``list_interval``, lazily, by whichever call needs it
  first, flat (``bucket_runs.discover_bucket_runs``): one ListObjectsV2 request per 1,000 keys
  on S3, one objects.list request per 1,000 objects on Cloud Storage, one List Blobs request per
  5,000 blobs on Azure (azure-storage-blob's; pyarrow's Azure client lists by hierarchy, a
  request per directory, so per run, and is used only where azure-storage-blob is not installed).
  The listing gives each object's size and modification time for free: an object whose pair
  differs from the previous listing's is a changed run (``take_changed``), the only thing that
  makes a run that is not live due again.
* A live run (``polls``) is looked at once per safety interval, in one request whether it grew or
  not: a ranged GET from the last complete line read on (``ObjectFile.stat``), whose answer gives
  the object's size and version, the line the follower compares to notice a rewrite, and the new
  bytes (``object_storage``'s docstring says what a rewrite that keeps that line does).  That
  GET is each cloud's own client's (``object_reads.OneRequestReads``: botocore, google-auth,
  azure-storage-blob); where it is not installed, pyarrow's asks for the object's size first: a
  HEAD (a metadata request; Get Blob Properties on Azure), plus a GET when it grew
  (``ArrowReads``): pyarrow opens an object by path only, never from a size it was given.  A run
  ``sync`` uploads as parts: one listing of its parts, and a GET of a new part when there is one.
* Any other run (ended, or older than the stall rule: its status cannot change with no new
  record, as no writer lock crosses a bucket) costs nothing once read, until a listing shows its
  object changed.  A run whose reading failed costs nothing either until then.
* A run's first read is one HEAD and one GET of the whole object (or the columnar cache's copy
  and the tail).

So at a refresh every ``r`` seconds the steady cost per minute is ``60 / list_interval`` listings
plus ``60 / r`` requests per live run (the same for a run in parts, plus a GET per new part),
whatever the number of finished runs.  Without the cloud's own client a live run that grew costs a
GET more, and on ``az://`` each listing costs about a request per run.

Status: ``ObjectFile.writer_alive()`` is None, so ``runs.run_status`` falls back to the record-age
rule (``live`` while the last record is recent, then ``stalled``; never ``crashed`` from a lock).

Failures are one line naming the root or the object: a bucket that does not exist or refuses the
credentials is a ``RunNotFoundError`` from ``discover`` (and ``resolve``), retried no more often
than every ``RETRY_S``; an object deleted between the request that sized it and a GET of its
bytes is the reader's ``RunFileError``; an object gone at the next listing is a run gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from pyarrow import fs as pafs

from metrics_core.buckets.addresses import bucket_filesystem, parse_bucket_url
from metrics_core.buckets.bucket_runs import BucketRun, discover_bucket_runs
from metrics_core.buckets.cloud_reads import reads_for
from metrics_core.buckets.object_reads import ObjectReads
from metrics_core.errors import MetricsError, RunNotFoundError, RunPathError
from metrics_core.read.run_reader import RunReader
from metrics_core.roots.discovery import RunInfo, RunListing
from metrics_core.roots.locations import LIST_INTERVAL_S
from metrics_core.write.writer import METRICS_FILENAME

if TYPE_CHECKING:
    from metrics_core.read.column_cache import CachePolicy
    from metrics_core.read.run_file import RunFile

RETRY_S = 10.0  # a listing that failed (no such bucket, refused credentials) is tried again this often at most


def open_run_file(filesystem: pafs.FileSystem, run: BucketRun, reads: ObjectReads) -> RunFile:
    """The one place a bucket run's ``RunFile`` is made."""
    return run.file(filesystem, reads=reads)


class BucketRoot:
    """The runs under ``s3://bucket/prefix``, ``gs://bucket/prefix`` or ``az://container/prefix``;
    see the module docstring."""

    mode = "listing"

    def __init__(
        self,
        url: str,
        *,
        list_interval: float = LIST_INTERVAL_S,
        filesystem: pafs.FileSystem | None = None,
        reads: ObjectReads | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        address = parse_bucket_url(url)
        self.location = address.url
        self.list_interval = list_interval
        self.mode_reason = f"the bucket is listed at most every {list_interval:g} s, live runs at each refresh"
        self._filesystem = filesystem if filesystem is not None else bucket_filesystem(address)
        self._reads = reads_for(address, filesystem, reads)
        self._clock = clock
        self._lock = threading.Lock()
        self._runs: dict[str, BucketRun] = {}
        self._listing = RunListing((), ())
        self._listed_at = float("-inf")
        self._failure: MetricsError | None = None
        self._changed: set[str] = set()
        self._generation = 0
        self.listings = 0  # listings made, for the tests and the benchmark

    def _list_if_due(self) -> None:
        """List the root unless the last listing is younger than the interval (``RETRY_S`` after a
        failure); then raise the failure, if it failed.  The caller holds ``_lock``."""
        wait = self.list_interval if self._failure is None else min(self.list_interval, RETRY_S)
        if self._clock() - self._listed_at >= wait:
            self._listed_at = self._clock()
            self.listings += 1
            try:
                found = discover_bucket_runs(self.location, filesystem=self._filesystem, reads=self._reads)
            except MetricsError as exc:
                self._failure = exc
            else:
                self._failure = None
                runs = {run.name: run for run in found}
                self._changed.update(
                    name
                    for name, run in runs.items()
                    if name in self._runs and _listed(self._runs[name]) != _listed(run)
                )
                if runs.keys() != self._runs.keys():
                    self._generation += 1
                self._runs = runs
                self._listing = RunListing(tuple(RunInfo(run.name, _directory(run)) for run in found), ())
        if self._failure is not None:
            raise self._failure

    @property
    def structure_generation(self) -> int:
        with self._lock:
            return self._generation

    def discover(self) -> RunListing:
        with self._lock:
            self._list_if_due()
            return self._listing

    def resolve(self, name: str) -> RunInfo:
        """The run ``name`` as the last listing found it (a run newer than that is found by the next)."""
        if not name or "\x00" in name:
            raise RunPathError(f"{name!r}: empty or invalid run name")
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts:
            raise RunPathError(f"{name!r}: a run name is a path relative to the runs root, without '..'")
        with self._lock:
            self._list_if_due()
            run = self._runs.get(path.as_posix())
        if run is None:
            raise RunNotFoundError(f"{name!r}: no run there (no {METRICS_FILENAME} under it at the last listing)")
        return RunInfo(run.name, _directory(run))

    def take_changed(self) -> set[str]:
        with self._lock:
            try:
                self._list_if_due()
            except MetricsError:
                return set()  # the listing's failure is said by discover and resolve
            changed, self._changed = self._changed, set()
            return changed

    def reader(self, info: RunInfo, *, cache: CachePolicy | None) -> RunReader:
        with self._lock:
            run = self._runs.get(info.name)
        if run is None:
            raise RunNotFoundError(f"{info.name!r}: no run there (gone at the last listing)")
        file = open_run_file(self._filesystem, run, self._reads)
        return RunReader(file.path, file=file, cache=cache)

    def size(self, info: RunInfo) -> int:
        with self._lock:
            run = self._runs.get(info.name)
        return 0 if run is None else run.size

    def stamp(self, info: RunInfo) -> tuple[int, ...] | None:
        """The object as the last listing found it: no request."""
        with self._lock:
            run = self._runs.get(info.name)
        return None if run is None else _listed(run)

    def unchanged(self, info: RunInfo, identity: tuple[int, ...] | None, *, hinted: bool) -> bool:
        """No request: a listing since the last read saw the object change, or it did not."""
        return not hinted

    def polls(self, status: str) -> bool:
        return status == "live"

    def peek_file(self, info: RunInfo) -> RunFile | None:
        return None  # a peek would cost a HEAD and a GET per big run: read it instead

    def relative(self, path: str) -> str:
        return path.removeprefix(self.location + "/")

    def close(self) -> None:
        pass


def _listed(run: BucketRun) -> tuple[int, int]:
    return (run.size, run.mtime_ns)


def _directory(run: BucketRun) -> Path:
    """A name for the run's place, as ``RunInfo.directory`` wants one (never opened locally)."""
    return Path(run.location.fs_path)
