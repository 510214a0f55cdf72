"""The store's columnar cache saves, written by one background thread beside the pages.

A save writes about a run's resident column bytes (``metrics_core.read.column_cache``): once after a
cold parse, then every ``interval_s`` while the run grows.  Written by whichever refresh noticed it
was due, it would land in a page's request, a user's page held up for it.  The store's readers only
mark a save due (``CachePolicy.save_inline`` off); the entry that saw it queues a job here, which
takes what to write under the run's lock (O(columns + sessions): views of the rows) and writes it
without the lock, so no page waits for the disk.

A run is queued at most once at a time (its key), so a live run that stays due for a few refreshes
costs one save; the queue is bounded by the runs of the root.  The thread waits ``delay_s`` before
it takes a batch of jobs: a save is for the next start, and the one due after a cold parse would
otherwise take a core from the page drawing that run's first charts.  ``close`` writes what is
queued at once, then stops the thread: a server stopped right after a cold parse keeps the cache
it paid for.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

_log = logging.getLogger(__name__)


class CacheSaver:
    """Jobs by key, run in order by one daemon thread started on demand; thread-safe."""

    def __init__(self, stats: dict[str, int], *, delay_s: float) -> None:
        self._stats = stats
        self.delay_s = delay_s
        self._closing = threading.Event()  # cuts the delay short
        self._lock = threading.Lock()
        self._jobs: OrderedDict[Hashable, Callable[[], None]] = OrderedDict()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, key: Hashable, job: Callable[[], None]) -> None:
        """Run ``job`` on the saver's thread, unless a job of ``key`` is already waiting."""
        with self._lock:
            if self._closed or key in self._jobs:
                return
            self._jobs[key] = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="RunStore cache saver", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Run the jobs queued, then stop; no job is taken after."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._closing.set()
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        """After ``delay_s``, take jobs until none is left; the thread ends then (the next ``submit``
        starts another)."""
        self._closing.wait(self.delay_s)
        while True:
            with self._lock:
                if not self._jobs:
                    self._thread = None
                    return
                _, job = self._jobs.popitem(last=False)
            try:
                job()
                self._stats["cache_saves"] += 1
            except Exception:  # a save that cannot be written is no cache, never a dead saver
                _log.warning("a columnar cache save failed", exc_info=True)
