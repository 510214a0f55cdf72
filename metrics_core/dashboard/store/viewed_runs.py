"""The runs a page is on, and the memory their readers may hold: a ``RunStore``'s viewed runs.

A run shown by ``RunStore.view()`` (or asked for by ``RunStore.prepare``) is marked viewed here;
each view then releases, least recently viewed first, the readers of the viewed runs no page is
on any more, by the store's ``idle_s``, ``recent_s`` and ``view_budget_records``
(``store_settings.StoreSettings``).  The whole rule, what the other runs keep and why, is the store's
"Memory" (``run_store``); a released run is ``RunEntry``'s to reopen.  Each view also gives freed
memory back to the OS, at most once per ``TRIM_S`` (``ViewedRuns.return_memory``).

Thread-safe: one lock guards the viewed runs and each entry's ``viewed_at``; an entry is released
only under its own lock, taken without waiting (a busy run stays viewed and is tried again).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from metrics_core.dashboard.store.run_entry import RunEntry
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.read.columns import return_memory_to_os

TRIM_S = 5.0  # freed memory is given back to the OS at most this often (``ViewedRuns.return_memory``)


class ViewedRuns:
    """The viewed runs of one ``RunStore``, least recently viewed first; see the module docstring."""

    def __init__(self, settings: StoreSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._viewed: OrderedDict[str, RunEntry] = OrderedDict()  # viewed runs, least recently viewed first
        self._returned_at = float("-inf")  # the clock when freed memory was last given back (``return_memory``)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._viewed

    def mark(self, entry: RunEntry) -> RunEntry:
        """``entry`` viewed now: the most recently viewed, not released as idle for ``idle_s``."""
        with self._lock:
            entry.viewed_at = self._clock()
            self._viewed[entry.name] = entry
            self._viewed.move_to_end(entry.name)
        return entry

    def trim(self, *, keep: RunEntry) -> None:
        """Forget viewed runs not viewed for ``idle_s``, and, least recently viewed first, those not
        viewed for ``recent_s`` while the viewed runs hold more than ``view_budget_records``
        (``keep``, just viewed, stays even if its snapshot took longer than ``recent_s``), and
        release their readers unless they are live or changed lately (a busy or re-viewed one stays
        viewed: ``unview``).  O(viewed runs)."""
        with self._lock:
            now = self._clock()  # under the lock: a view after it sets viewed_at >= now, too recent to pick
            viewed = [(entry, entry.viewed_at) for entry in self._viewed.values()]
        held = sum(entry.held for entry, _ in viewed)
        kept = self.settings
        for entry, viewed_at in viewed:
            age = now - viewed_at
            if entry is keep or age < kept.recent_s or (age < kept.idle_s and held <= kept.view_budget_records):
                continue
            held -= self.unview(entry, viewed_at)

    def unview(self, entry: RunEntry, viewed_at: float) -> int:
        """Forget ``entry`` as viewed and release its reader if idle, unless it was viewed again
        since ``viewed_at`` (a page is on it: the next runs page must not release it) or another
        thread holds its lock (it stays viewed, and the next ``trim`` tries again: forgotten
        unreleased, nothing would ever release it while no runs page runs).  Returns the records
        it held if it was forgotten, else 0."""
        if not entry.lock.acquire(blocking=False):
            return 0
        try:
            with self._lock:
                if entry.viewed_at != viewed_at:
                    return 0
                entry.viewed_at = float("-inf")
                del self._viewed[entry.name]
            held = entry.held
            entry.release_if_idle()
            return held
        finally:
            entry.lock.release()

    def return_memory(self) -> None:
        """Give freed memory back to the OS at most once per ``TRIM_S``: a live page's snapshots,
        figures and payloads are arrays a little bigger at each append, and the heap keeps the
        freed ones in pages it never returns, so a server's RSS would grow with time, not with the
        data it holds.  Cost: a walk of the heap's free lists, well under a millisecond when done
        this often."""
        with self._lock:
            now = self._clock()
            if now - self._returned_at < TRIM_S:
                return
            self._returned_at = now
        return_memory_to_os()
