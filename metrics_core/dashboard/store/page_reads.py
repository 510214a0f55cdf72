"""Reads a page asked for, run beside it: one thread per run, and the pages woken when it ends.

A page that would wait for a big run's read asks ``RunStore.prepare`` instead.  The read runs on
a thread of its own (``PageReads.start``); the page draws its progress and reruns once the read
ended.  A page's progress fragment waits for that end for most of its period (``wait``) instead of
noticing it at its next run, half a period late on average.  Once the read's view is built and
the pages told, ``warm(view)`` computes on that same thread what every page computes of a fresh
view whatever its options (the diagnostics, ``settings`` says): beside the page's script run,
which builds the charts meanwhile, on the machine's other core.

Bounded by the runs of the root: at most one thread per run reads, and a run whose read runs is
not started again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from metrics_core.dashboard.store.snapshot import RunView

_log = logging.getLogger(__name__)


class PageReads:
    """The reads ``RunStore.prepare`` started, by run name; thread-safe."""

    def __init__(self, *, warm: Callable[[RunView], object] | None = None) -> None:
        self._warm = warm
        self._ended = threading.Condition()
        self._running: set[str] = set()

    def start(self, name: str, read: Callable[[], RunView]) -> None:
        """Run ``read()`` of run ``name`` on a thread of its own, then ``warm`` its view, unless a
        read of ``name`` runs.  A read that fails is the entry's to say (its ``failure``): the
        page's own ``view`` call raises it."""
        with self._ended:
            if name in self._running:
                return
            self._running.add(name)
        threading.Thread(target=self._run, args=(name, read), name="RunStore prepare", daemon=True).start()

    def wait(self, name: str, timeout: float) -> None:
        """Return once no read of run ``name`` runs, or ``timeout`` seconds from now."""
        with self._ended:
            self._ended.wait_for(lambda: name not in self._running, timeout=timeout)

    def _run(self, name: str, read: Callable[[], RunView]) -> None:
        view = None
        try:
            view = read()
        except Exception:  # the entry keeps why; the page's ``view`` says it
            pass
        finally:
            with self._ended:
                self._running.discard(name)
                self._ended.notify_all()
        if view is not None and self._warm is not None:
            try:
                self._warm(view)
            except Exception:  # the page computes it again, and says what went wrong there
                _log.exception("warming the view of run %r", name)
