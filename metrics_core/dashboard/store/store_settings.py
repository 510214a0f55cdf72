"""What a ``RunStore`` is told at construction, as one value: how it watches the root, when it
re-reads a run, which runs keep their readers, where it caches, and its clock.

One frozen object, not a dozen keyword arguments: the dashboard's process-wide store
(``dashboard.settings``), the tests and the benchmarks each name only what they change, and a
setting added here reaches every caller without touching a signature.  The store reads the fields;
what each means for the store's work is its module docstring's (``run_store``: "Cost model",
"Memory").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from metrics_core.read.column_cache import CachePolicy
from metrics_core.roots.locations import LIST_INTERVAL_S

if TYPE_CHECKING:
    from metrics_core.dashboard.store.snapshot import RunView

IDLE_S = 60.0  # a run neither changed nor viewed for this long is idle: not "open in a page", not appending
RECENT_S = 10.0  # a run viewed this lately is on a page that refreshes (20 refreshes at the default 0.5 s)
VIEW_BUDGET_RECORDS = 4_000_000  # records the readers of viewed, not live, runs may hold
SAVER_DELAY_S = 10.0  # a cache save waits this long: a page drawing the run's first charts goes first


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """A ``RunStore``'s settings.

    ``force_polling``: a directory root's watcher polls (a file system whose events do not arrive).
    ``list_interval``: how often a bucket root is listed.  ``safety_interval``: a run's file is
    stat'ed at least this often without a watcher hint (0: at every look).  ``load_budget_s``: how
    long the first ``runs_table()`` reads cold runs before it leaves the rest to the loader.
    ``loader_delay_s``: how long the loader lets the page that listed the runs draw them before it
    takes a core (on a small machine a page that lists a big root draws sooner and steadier).
    ``saver_delay_s``: how long a cache save waits, so the pages draw first (``cache_saver``).
    ``cache``: where readers keep a columnar copy of big runs, so that a restarted server reopens
    them at a few percent of a cold parse (``metrics_core.read.column_cache``); never in the root.
    ``idle_s`` / ``recent_s`` / ``view_budget_records``: which runs keep their readers
    (``run_store``, "Memory").  ``warm``: called with the view of each read ``prepare`` started, on
    its thread, once the pages may have it (``page_reads``).  ``clock``: monotonic seconds.
    """

    force_polling: bool = False
    list_interval: float = LIST_INTERVAL_S
    safety_interval: float = 2.0
    load_budget_s: float = 0.1
    loader_delay_s: float = 1.0
    saver_delay_s: float = SAVER_DELAY_S
    cache: CachePolicy | None = None
    idle_s: float = IDLE_S
    recent_s: float = RECENT_S
    view_budget_records: int = VIEW_BUDGET_RECORDS
    warm: Callable[[RunView], object] | None = None
    clock: Callable[[], float] = time.monotonic


DEFAULT_SETTINGS = StoreSettings()
