"""The cold runs of a root (never read yet), read smallest file first: some by the page that lists
them, within its budget, the rest by one background thread, so a page never waits for a cold root.

The store (``run_store.RunStore``) owns the runs and how one is read; this module owns only the queue
and the thread: which run is read next, and that exactly one loader reads while any is queued.
A run is queued once (its ``queued`` flag stays set until the store has read it, and the runs page
shows it as ``loading`` meanwhile); a queued run bigger than what a page's caller may read is
peeked at first (``peek``: its row from its file's tail), so a root of big runs shows where each
one is long before it is parsed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    queued: bool  # waiting in the loader's queue (set by ``ColdLoader.queue``, cleared by the store)


E = TypeVar("E", bound=Queued)
I = TypeVar("I")  # noqa: E741 - the run's info, as the store passes it


class ColdLoader(Generic[E, I]):
    """The queue of cold runs and its one background reader; thread-safe.

    ``size(info)``: the run's file size (ordering, and whether a page's caller may read it);
    ``read(entry, info)``: read the run (the store's refresh); ``peek(entry, info)``: give a big
    run a row from its tail; ``delay_s``: how long the loader lets the page that listed the runs
    draw them before it takes a core; ``drained``: called by the loader once no run is queued
    (what reading a cold root freed is given back then)."""

    def __init__(
        self,
        *,
        size: Callable[[I], int],
        read: Callable[[E, I], None],
        peek: Callable[[E, I], None],
        big: int,
        delay_s: float,
        stats: dict[str, int],
        drained: Callable[[], None] = lambda: None,
    ) -> None:
        self._size, self._read, self._peek, self._drained = size, read, peek, drained
        self.big = big
        self.delay_s = delay_s
        self._stats = stats
        self._lock = threading.Lock()
        self._cold: list[tuple[int, E, I]] = []  # (file size, ...): runs never read, biggest first
        self._to_peek: list[tuple[E, I]] = []  # queued runs too big for a page's caller: peeked first
        self._thread: threading.Thread | None = None  # reads ``_cold``; None when idle
        self._closed = threading.Event()

    @property
    def busy(self) -> bool:
        """Whether the background loader is running."""
        with self._lock:
            return self._thread is not None

    def queue(self, jobs: list[tuple[E, I]]) -> bool:
        """Queue ``jobs`` (runs never read, not queued yet), smallest file first (most of a large root
        is listed soonest); True if the caller should read some itself, i.e. no loader is at it.
        One ``size`` per newly queued run."""
        sized = [(self._size(info), entry, info) for entry, info in jobs]
        with self._lock:
            for _, entry, _ in sized:
                entry.queued = True  # until read: the runs page shows it as loading meanwhile
            if sized:
                self._cold.extend(sized)
                self._cold.sort(key=lambda job: -job[0])  # popped from the end
                self._to_peek.extend((entry, info) for size, entry, info in sized if size > self.big)
            return bool(self._cold) and self._thread is None

    def take(self, *, up_to: int | None = None) -> tuple[E, I] | None:
        """The next queued run to read, or None; ``up_to``: only if its file holds at most that
        many bytes (a page's caller).  Without it (the loader), finding none ends the loader,
        atomically: a run queued right after starts a new one."""
        with self._lock:
            if self._cold and (up_to is None or self._cold[-1][0] <= up_to):
                _, entry, info = self._cold.pop()
                return entry, info
            if up_to is None:
                self._thread = None
            return None

    def start(self) -> None:
        """Start the loader unless one runs, nothing is queued or the loader was closed."""
        with self._lock:
            if self._thread is not None or not self._cold or self._closed.is_set():
                return
            self._thread = threading.Thread(target=self._load, name="RunStore loader", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the loader after the run it is reading; no other starts."""
        self._closed.set()

    def _load(self) -> None:
        """The loader thread: after ``delay_s``, peek at the big queued runs, then read queued runs,
        smallest first, until none is left or the loader closes.  However it ends, it gives up its
        place: a loader that died on an unforeseen error would otherwise stay set, and no later call
        would start another (the queued runs would read ``loading`` for good)."""
        try:
            if self._closed.wait(self.delay_s):
                return
            while True:
                with self._lock:
                    to_peek, self._to_peek = self._to_peek, []
                for entry, info in to_peek:
                    self._peek(entry, info)
                job = self.take()
                if job is None:
                    self._drained()
                    return
                if self._closed.is_set():
                    return
                self._read(*job)
                self._stats["background_reads"] += 1
        finally:
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None
