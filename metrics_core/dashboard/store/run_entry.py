"""One run as the server-wide store holds it: its reader, when it is re-read, its status, its
row of the runs table and its snapshot.

``run_store.RunStore`` keeps one ``RunEntry`` per run and owns what spans runs (which runs there are,
the watcher's hints, which runs are viewed, the memory budget, the cold loader, the table); what
one run's data is and how it is kept up to date lives here, so the rule that decides whether a
run is re-read is written once, next to the state it reads.  Every entry of one store shares an
``EntryContext``: the root, the cache, the intervals, the clock and the work counters.

Locking: ``lock`` guards the entry.  ``snapshot``, ``refresh_row``, ``read_cold`` and ``peek``
take it themselves; ``update``, ``release_if_idle`` and ``set_row`` are called with it held;
``held`` needs none.  A row that changed is signalled to the store (``EntryContext.row_changed``)
under the entry's lock: the store's lock may be taken inside an entry's, never the other way round.

Refresh policy (``next_due``, the one rule): a run is re-read when the root's hints say its file
changed, and in any case when its last refresh is older than ``safety_interval`` seconds if the
root polls a run of its status (a local root polls every run: a no-change refresh is one ``stat``,
so a lost inotify event or a network filesystem never means stale data; a bucket polls live runs
only, one HEAD each).  A settled run (``run_status.SETTLED``: only a write can change it, and the
root's hints say when) is polled every ``settled_interval`` instead: ten thousand finished runs
cost a ``stat`` each every few minutes, not per refresh.

Failure containment: one run never takes a page down.  Whatever reading or snapshotting a run
raises (a reader bug, a permission error, a value pandas cannot hold) becomes a ``RunViewError``
naming the run and the cause in plain text, and the run's row says so with status ``error``.
The failed run's reader is discarded (its state is unknown after an exception mid-refresh) and
the failure is remembered: the file is re-read from the start only once it changed and
``safety_interval`` has passed, so a broken run costs one ``stat`` per refresh, not a full
re-read.  A reason names paths relative to the root (``display_text.under_root``): pages show run
names, never where the server keeps its files.

Release: a reader is closed once its run is idle (``release_if_idle``: not live, neither changed
nor viewed for ``idle_s``); the entry keeps its summary, its row and what ``run_status`` needs
(``run_status.StatusRecord``), so a released run whose file did not change costs one ``stat`` per
``safety_interval`` (and, not ended, a lock probe: stalled may become crashed).  A settled run's
released facts are handed to the store's ``kept_summaries`` as it is released, and ``update``
takes them back in a restarted server (its file checked unchanged): released without a read.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import pandas as pd

from metrics_core.dashboard.display_text import under_root
from metrics_core.dashboard.store.kept_summaries import KeptSummaries
from metrics_core.dashboard.store.rows import (
    LossTrend,
    MetricTails,
    error_row,
    event_rows,
    peek_row,
    runs_table_row,
)
from metrics_core.dashboard.store.run_config import run_config
from metrics_core.dashboard.store.snapshot import Lineage, RunView, build_view
from metrics_core.errors import MetricsError, RunFileError, RunNotFoundError
from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.read_progress import ReadProgress
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import END_STATUSES, SETTLED, StatusRecord, run_status, stop_reason
from metrics_core.read.run_summary import RunSummary, summarise
from metrics_core.roots.discovery import RunInfo
from metrics_core.roots.runs_root import RunsRoot

_log = logging.getLogger(__name__)


class RunViewError(MetricsError, RuntimeError):
    """A run's data could not be read or shown; ``cause`` says why in plain text (no traceback)."""

    def __init__(self, name: str, cause: str) -> None:
        super().__init__(f"run {name!r} cannot be shown: {cause}")
        self.name = name
        self.cause = cause


@dataclass(frozen=True, slots=True)
class EntryContext:
    """What every entry of one store shares: where the runs are (``source``), the columnar
    ``cache``, the refresh and release intervals, the store's ``clock`` and work counters
    (``stats``), ``row_changed``, called when an entry's row changed, and ``save_later``, which
    writes a cache save beside the pages (``cache_saver.CacheSaver.submit``)."""

    source: RunsRoot
    cache: CachePolicy | None
    safety_interval: float
    settled_interval: float  # ``safety_interval`` for a run only a write can change (``RunEntry.next_due``)
    idle_s: float
    clock: Callable[[], float]
    stats: dict[str, int]
    row_changed: Callable[[], None]
    save_later: Callable[[Hashable, Callable[[], None]], None]  # a job for the store's cache saver
    kept: KeptSummaries | None = None  # where a settled run's facts are kept across restarts


@dataclass
class RunEntry:
    """One run's reader, summary, row and snapshot; see the module docstring."""

    name: str
    ctx: EntryContext
    reader: RunReader | None = None  # None: not read yet, or released (``released`` says what it knew)
    released: StatusRecord | None = None
    use_cache: bool = True  # False after a failure: a state the cache restored may be what failed
    viewed_at: float = float("-inf")  # the clock of the last ``RunStore.view()``
    changed_at: float = float("-inf")  # the clock of the last read that found new data (a first read aside)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # What the snapshots, the loss trend and the metric tails carry from one read to the next: made
    # with a reader and dropped with it, so a released run (most of a big root) holds none of it.
    lineage: Lineage | None = None
    refreshed_at: float = float("-inf")
    data_key: tuple[int, ...] | None = None  # what the summary and the view were built from
    view: RunView | None = None  # None: stale, rebuilt by the next ``snapshot()``
    # The last view built, stale or not, while anything (a page, the charts' lineage) still holds
    # it: what the next one extends.  Weak: a stale view must not pin the columns it was built on.
    built: weakref.ref[RunView] | None = None
    summary: RunSummary | None = None
    trend: LossTrend | None = None
    tails: MetricTails | None = None
    metrics: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)  # the row's, from ``tails``
    row: dict[str, Any] | None = None
    row_time: datetime | None = None  # the last record time ``row`` shows (its age is per call)
    config_key: tuple[int, int] | None = None  # (config records, resets) the summary's config is of
    failure: str | None = None  # why the last attempt failed, until the file changes
    failure_stamp: tuple[int, int, int, int] | None = None
    failed_at: float = float("-inf")
    hinted: bool = False  # the root said the run's file changed since its last read
    queued: bool = False  # waiting in the store's cold queue
    # The clock when a read with a new reader began, until it ends (``snapshot``: until the view it
    # is for is built), and the file's size as that read was asked for (``reading``).
    read_began: float | None = None
    read_size: int = 0

    @property
    def held(self) -> int:
        """Records this entry's reader holds; safe without its lock (another thread may release it)."""
        reader = self.reader
        return 0 if reader is None else reader.records

    def next_due(self) -> float:
        """The clock time from which ``update`` re-reads (or ``stat``-s) the run: at once when
        it was never read or a hint named it; else its last refresh plus the interval its status
        is polled at (never, for a status the root does not poll).  A failed run: when its
        failure is looked at again.  See the module docstring, "Refresh policy"."""
        ctx = self.ctx
        if self.failure is not None:  # refreshed_at: when the failure was last looked at again
            return max(self.failed_at, self.refreshed_at) + ctx.safety_interval
        if self.summary is None or self.hinted:
            return float("-inf")
        if not ctx.source.polls(self.summary.status):
            return float("inf")
        settled = self.summary.status in SETTLED
        return self.refreshed_at + (ctx.settled_interval if settled else ctx.safety_interval)

    def quiet(self, seen: tuple[object, ...] | None) -> bool:
        """Whether the run is settled, not due, and its data and status are as ``seen``
        (``status_key``) said: a reader of many runs (the server's alerter) skips it.  No lock:
        a change it misses is seen by the next call."""
        summary = self.summary
        return (
            summary is not None
            and summary.status in SETTLED
            and seen == self.status_key()
            and self.ctx.clock() < self.next_due()
        )

    def status_key(self) -> tuple[object, ...] | None:
        """What ``quiet`` compares: the data read and the status it reads as."""
        summary = self.summary
        return None if summary is None else (self.data_key, summary.status, self.failure)

    def reading(self, info: RunInfo, *, caller_bytes: int) -> tuple[ReadProgress | None, bool]:
        """Whether a snapshot would wait for a read, found without waiting: None if not (the run
        is read and held, its file holds at most ``caller_bytes``, or its last read failed: a
        snapshot says why at once), else how far the read has come; and whether a read must be
        started (none is under way).  O(1), plus one ``size`` for a run not held."""
        if not self.lock.acquire(blocking=False):
            return self.progress(), False  # None: the lock is held briefly (a refresh, a snapshot of a read run)
        try:
            if self.failure is not None or (self.reader is not None and self.summary is not None):
                return None, False
            size = self.ctx.source.size(info)
            if size <= caller_bytes:
                return None, False
            self.read_size = size
            return ReadProgress(0, size, 0.0), True
        finally:
            self.lock.release()

    def progress(self) -> ReadProgress | None:
        """How far the read under way with a new reader has come, or None if none is; no lock.
        Before the reader found the file's size, the size the read was asked for; once every byte is
        read, all of them, while the summary and the view are built."""
        began, reader = self.read_began, self.reader
        if began is None:
            return None
        done, total = (0, 0) if reader is None else reader.read_position
        return ReadProgress(done, total or self.read_size, self.ctx.clock() - began)

    def snapshot(self, info: RunInfo, now: datetime) -> RunView:
        """A fresh ``RunView`` of the run, extending the last one built while it is held.

        Raises RunViewError when the run cannot be read or shown, RunNotFoundError when it vanished.
        """
        with self.lock:
            try:
                self.update(info, now, need_reader=True, until_viewed=True)
                if self.view is None:
                    try:
                        previous = self.built() if self.built is not None else None
                        if self.lineage is None:
                            self.lineage = Lineage()
                        self.view = build_view(
                            info.name,
                            self.reader,
                            self.summary.status,
                            self.lineage,
                            previous=previous,
                            reason=self.summary.reason,
                        )
                        self.built = weakref.ref(self.view)
                    except Exception as exc:
                        raise self._failed(info, exc) from exc
                    self.ctx.stats["views"] += 1
                elif (self.view.status, self.view.reason) != (self.summary.status, self.summary.reason):
                    # same data, derived data rebuilt
                    self.view = replace(self.view, status=self.summary.status, reason=self.summary.reason)
                return self.view
            finally:
                self.read_began = None  # the view a cold read was for is built: a page may ask for it

    def update(self, info: RunInfo, now: datetime, *, need_reader: bool = False, until_viewed: bool = False) -> None:
        """Refresh the run if due and bring its summary up to date.  ``need_reader``: a snapshot is
        wanted, so a released run gets a reader again.  ``until_viewed``: the caller (``snapshot``)
        ends the read's ``progress`` once its view is built: a page told the read is over before
        then would wait for the view blind, on the lock.

        Cost when nothing changed: one ``stat`` (a bucket: a HEAD) per ``safety_interval`` for a run
        the root polls, else nothing until a hint (plus ``run_status`` for a run that has not
        ended); after an append, O(new records); a released run that changed or
        is viewed: a reopen (from the cache if there is one) or a cold parse.
        """
        ctx = self.ctx
        if self.failure is not None:
            stamp, self.refreshed_at = ctx.source.stamp(info), ctx.clock()
            if stamp == self.failure_stamp or ctx.clock() - self.failed_at < ctx.safety_interval:
                raise RunViewError(info.name, self.failure)
        if self.summary is None and self.reader is None and self.released is None:
            self._restore(info)  # whoever asks first (a page, the loader, the alerter): no read if kept
        due = self.summary is None or ctx.clock() >= self.next_due()
        if not due and (self.reader is not None or not need_reader):
            return
        hinted, self.hinted = self.hinted, False  # a hint from now on is about a later change
        try:
            if self.reader is None:
                if self.released is not None and not need_reader and self._still_released(info, now, hinted):
                    return
                self.read_began = ctx.clock()  # until the read ends: a page shows how far it came
                self.reader = ctx.source.reader(info, cache=ctx.cache if self.use_cache else None)
                if self.released is not None:
                    self.released = None
                    ctx.stats["reopens"] += 1
            self.reader.refresh()
            self.refreshed_at = ctx.clock()
            reader = self.reader
            if reader.cache_due:
                ctx.save_later(self.name, lambda: self._save_cache(reader))
            key = (reader.records, reader.resets, reader.bad_lines, reader.pending_bytes)
            if key != self.data_key or self.summary is None:
                if self.summary is not None:
                    self.changed_at = ctx.clock()
                self.view = None  # built on demand: the runs page never needs one
                self.data_key = key
                self._summarise(now)
            elif self.summary.status not in END_STATUSES or reader.last_event != "session_end":
                status = run_status(reader, now=now)
                if status != self.summary.status:
                    self._set_summary(replace(self.summary, status=status, reason=stop_reason(reader, status)))
        except RunNotFoundError:
            raise  # the run vanished: pages wait for it to come back
        except Exception as exc:
            raise self._failed(info, exc) from exc
        finally:
            if not until_viewed:
                self.read_began = None
        self.failure = self.failure_stamp = None

    def _save_cache(self, reader: RunReader) -> None:
        """The cache saver's job: what to save taken under the lock, written without it, so a page
        asking for the run meanwhile waits for no disk; nothing if ``reader`` is no longer the
        run's (released: its close saved; failed: its state is unknown)."""
        with self.lock:
            pending = reader.capture_cache() if self.reader is reader else None
        if pending is None:
            return
        written = pending.write()
        with self.lock:
            reader.cache_written(pending, written)

    def _still_released(self, info: RunInfo, now: datetime, hinted: bool) -> bool:
        """For a released run that is due: True, with its status brought up to date, if its file
        is as its last reader left it (or gone: the rediscovery drops it); False if it changed and
        needs a reader again.  What the root's ``unchanged`` costs (a local root: one ``stat``),
        plus a lock probe for a run that has not ended."""
        released = self.released
        if not self.ctx.source.unchanged(info, released.identity, hinted=hinted):
            return False
        self.refreshed_at = self.ctx.clock()
        if self.summary.status not in END_STATUSES or released.last_event != "session_end":
            status = run_status(released, now=now)  # type: ignore[arg-type]  # what it reads of a reader
            if status != self.summary.status:
                self._set_summary(replace(self.summary, status=status, reason=stop_reason(released, status)))
        return True

    def release_if_idle(self) -> None:
        """Release the reader unless the run is live, changed lately or open in a page (the store's
        docstring, "Memory")."""
        if self.reader is None or self.summary is None or self.summary.status == "live":
            return
        if self.ctx.clock() - max(self.viewed_at, self.changed_at) < self.ctx.idle_s:
            return
        released = StatusRecord.of(self.reader, identity=self.reader.read_identity)
        if self.ctx.kept is not None and self.failure is None:
            self.ctx.kept.keep(self.name, self.summary, self.metrics, self.data_key, released, self.reader.position())
        self.reader.close()  # saves the cache if it is behind: the reopen reads only what follows
        self.reader, self.released = None, released
        self.view = self.built = self.config_key = None  # data_key stays: a reopen finding it is no change
        self.lineage = self.trend = self.tails = None
        self.ctx.stats["releases"] += 1

    def _restore(self, info: RunInfo) -> None:
        """A run never read: take its facts as a previous server kept them, if it did and the file
        is still the one they were read from (``kept_summaries.KeptSummaries.take``): released, as if
        read and let go, and due at once, so ``update`` brings its status up to date for one ``stat``."""
        kept = self.ctx.kept.take(info) if self.ctx.kept is not None else None
        if kept is not None:
            self.released, self.data_key, self.metrics = kept.status, kept.data_key, kept.metrics
            self._set_summary(kept.summary)

    def _failed(self, info: RunInfo, exc: Exception) -> RunViewError:
        """Forget the reader (its state is unknown after an exception) and remember why."""
        _log.warning("run %r cannot be shown", info.name, exc_info=exc)
        if self.reader is not None:
            self.reader.close()
        self.reader = self.released = None  # the next read starts from scratch, without the cache
        self.use_cache = False
        self.lineage = self.trend = self.tails = None
        self.view = self.built = self.data_key = self.summary = self.config_key = None
        self.refreshed_at = float("-inf")
        self.failure, self.failure_stamp = _cause(exc, self.ctx.source), self.ctx.source.stamp(info)
        self.failed_at = self.ctx.clock()
        self.set_row(error_row(info.name, self.failure))
        return RunViewError(info.name, self.failure)

    def _summarise(self, now: datetime) -> None:
        """The summary from the tail of the reader's columns: O(records since the last one)."""
        self.ctx.stats["summaries"] += 1
        reader = self.reader
        config_key = (event_rows(reader, "config"), reader.resets)
        if config_key == self.config_key and self.summary is not None:
            config = self.summary.config
        else:  # config records are few; a new one is flattened with all before it (the changes need them)
            found = run_config(_config_frame(reader), reader.sessions) if config_key[0] else None
            config = found.values if found is not None else None
            self.config_key = config_key
        summary = summarise(reader, now=now)
        if self.trend is None or self.tails is None:
            self.trend, self.tails = LossTrend(), MetricTails()
        trend = self.trend.update(reader, summary.sessions)
        self.metrics = self.tails.update(reader, summary.sessions)
        self._set_summary(replace(summary, config=config, loss_trend=trend))

    def _set_summary(self, summary: RunSummary) -> None:
        self.summary = summary
        self.set_row(runs_table_row(self.name, summary, self.metrics), summary.last_record_time)

    def set_row(self, row: dict[str, Any], last_record_time: datetime | None = None) -> None:
        """The run's row of the runs table; the store hears of it only if it changed."""
        if row != self.row or last_record_time != self.row_time:
            self.row, self.row_time = row, last_record_time
            self.ctx.row_changed()

    def refresh_row(self, info: RunInfo, now: datetime, *, wait: bool = True) -> None:
        """Bring the row up to date and release the reader if idle; ``wait=False``: not if another
        thread is reading or snapshotting the run right now (its row is then the one it had,
        updated next time)."""
        if not self.lock.acquire(blocking=wait):
            return
        try:
            self.update(info, now)
            self.release_if_idle()
        except RunViewError:
            pass  # its row says why
        except Exception as exc:  # the run vanished, or the OS refused its path
            self.set_row(error_row(info.name, _cause(exc, self.ctx.source)))
        finally:
            self.lock.release()

    def read_cold(self, info: RunInfo, now: datetime) -> None:
        """The first read of a queued run (by a page's caller or the cold loader)."""
        self.refresh_row(info, now)
        self.queued = False

    def peek(self, info: RunInfo) -> None:
        """Give a big run not read yet the row ``peek_row`` finds, unless it was read meanwhile."""
        file = self.ctx.source.peek_file(info)
        if file is None or not self.lock.acquire(blocking=False):
            return  # none to peek at, or being read: its row comes with it
        try:
            if self.summary is None and self.failure is None:
                found = peek_row(info.name, file)
                if found is not None:
                    self.set_row(*found)
        finally:
            self.lock.release()


def _cause(exc: BaseException, root: RunsRoot) -> str:
    """An exception as one plain line: its type and message, no traceback; paths are said
    relative to the runs ``root``, as a page names runs (not the server's path)."""
    if isinstance(exc, RunFileError):
        return f"{root.relative(exc.filename)}: {exc.reason}"
    message = under_root(" ".join(str(exc).split()), root.location)
    if isinstance(exc, MetricsError):
        return message or type(exc).__name__
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _config_frame(reader: RunReader) -> pd.DataFrame:
    """The columns of the config records that ``run_config`` reads: a quarter of the cost of the
    whole ``frame("config")`` (no time or category conversions), paid by every run of a cold root."""
    columns = {name: reader.column("config", name) for name in ("config", "session_id", "step")}
    return pd.DataFrame({name: column.series() for name, column in columns.items() if column is not None})
