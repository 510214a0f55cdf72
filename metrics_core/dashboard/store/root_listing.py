"""Which runs a store's root holds, walked again only when that may have changed.

The walk (the root's ``discover``: a ``scandir`` per directory) is most of what an idle server of
ten thousand runs would otherwise spend.  The root is walked again when it says a run or directory
came or went (``structure_generation``), and without a word from it every ``REDISCOVER_S`` (a watch
can miss a new directory) or, on a root whose walk costs more, as often as keeps walking to
``WALK_SHARE`` of the time.  ``generation`` moves only when the runs or the entries that could not
be looked into changed.  ``refresh`` is not thread-safe (``run_store.RunStore`` calls it under its
lock); ``resolve`` is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from metrics_core.roots.discovery import RunInfo, UnreadableEntry
from metrics_core.roots.runs_root import RunsRoot

REDISCOVER_S = 10.0  # walked at least this often even without a watcher event (a watch can miss a new directory)
WALK_SHARE = 0.005  # of the time, at most, spent walking a root whose walk is long, without a watcher event


class RootListing:
    """The runs of ``source`` as last walked; see the module docstring.  ``stats["find_runs"]``
    counts the walks."""

    def __init__(self, source: RunsRoot, *, clock: Callable[[], float], stats: dict[str, int]) -> None:
        self.source, self._clock, self._stats = source, clock, stats
        self.runs: list[RunInfo] = []
        self.names: dict[str, RunInfo] = {}
        self.unreadable: tuple[UnreadableEntry, ...] = ()  # entries of the root the last walk could not look into
        self.generation = 0
        self._walked: tuple[int, float] | None = None  # (structure generation, clock) of the last walk
        self._every = REDISCOVER_S  # grows with what a walk costs
        self._resolve_lock = threading.Lock()
        self._resolved: dict[str, tuple[tuple[int, float], RunInfo]] = {}  # name -> (when, as resolved)

    def refresh(self) -> None:
        """Walk the root again if it is due (the module docstring)."""
        structure, now = self.source.structure_generation, self._clock()
        if self._walked is not None and self._walked[0] == structure and now - self._walked[1] < self._every:
            return
        began = time.perf_counter()
        found = self.source.discover()
        self._every = max(REDISCOVER_S, (time.perf_counter() - began) / WALK_SHARE)
        runs = list(found.runs)
        if (runs, found.unreadable) != (self.runs, self.unreadable):  # a rediscovery alone is no change
            self.runs, self.unreadable = runs, found.unreadable
            self.names = {info.name: info for info in runs}
            self.generation += 1
        self._walked = (structure, now)
        self._stats["find_runs"] += 1

    def resolve(self, name: str, interval: float) -> RunInfo:
        """The root's ``resolve(name)``, reused for up to ``interval`` seconds while the root saw no run
        or directory appear or go: a local root's realpath checks (a few ``lstat`` per path component)
        are most of what a refresh that finds nothing new costs each tab.  Refusals are not reused.
        ``stats["resolves"]`` counts the root's."""
        if interval <= 0:
            self._stats["resolves"] += 1
            return self.source.resolve(name)
        key = (self.source.structure_generation, self._clock() // interval)
        with self._resolve_lock:
            found = self._resolved.get(name)
        if found is not None and found[0] == key:
            return found[1]
        info = self.source.resolve(name)
        self._stats["resolves"] += 1
        with self._resolve_lock:
            if len(self._resolved) > len(self.runs) + 64:  # names that never became runs
                self._resolved.clear()
            self._resolved[name] = (key, info)
        return info
