"""When each run of a store is next looked at, so that a runs page costs the runs due, not all.

``run_store.RunStore`` lists ten thousand runs; refreshing the runs table must not call into each of
them (a lock, a due check, a ``stat``) per page refresh, nor every alert pass.  Each run is in a
heap at the clock time ``RunEntry.next_due`` says (the one refresh rule, with the entry's state):
a refresh takes the runs due now, O(due runs · log runs), and puts each back at its next due once
looked at.  Whoever else refreshes a run (a page's ``view``, the alerter's ``read_run``) or marks
it due (a hint from the root) reschedules it: an earlier due replaces the item, a later one is
found when the old item comes up (it is put back at its real due then).  Thread-safe.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Mapping
from typing import Generic, Protocol, TypeVar


class Scheduled(Protocol):
    name: str

    def next_due(self) -> float: ...


E = TypeVar("E", bound=Scheduled)
I = TypeVar("I")  # noqa: E741 - the run's info, as the store passes it


class RunSchedule(Generic[E, I]):
    """The heap of (due, tie-breaker, entry), and per run the due of its live item (an older item
    of a run is skipped when it comes up); see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, E]] = []
        self._due: dict[str, float] = {}
        self._order = itertools.count()

    def put(self, entry: E, due: float | None = None) -> None:
        """Look at ``entry`` at ``due`` (its ``next_due()`` by default), unless it is due no later
        already; never for ``inf`` (a run the root does not poll: a hint puts it here again)."""
        due = entry.next_due() if due is None else due
        with self._lock:
            current = self._due.get(entry.name)
            if due == float("inf") or (current is not None and current <= due):
                return
            self._due[entry.name] = due
            heapq.heappush(self._heap, (due, next(self._order), entry))

    def take_due(self, now: float, infos: Mapping[str, I]) -> list[tuple[I, E]]:
        """The runs due at ``now`` among ``infos`` (the runs listed), taken off the schedule; a run
        gone from ``infos`` is dropped, one whose due moved later is put back at it."""
        due, later = [], []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                when, _, entry = heapq.heappop(self._heap)
                if self._due.get(entry.name) != when:
                    continue  # an older item of a run scheduled again since
                del self._due[entry.name]
                info = infos.get(entry.name)
                if info is not None:
                    (due if entry.next_due() <= now else later).append((info, entry))
        for _, entry in later:
            self.put(entry)
        return due
