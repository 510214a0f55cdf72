"""Alerts on a runs root: rules over what the read path knows, sent once to a webhook.

A run that goes NaN at night, hangs in a collective or dies on a node is otherwise found only by
someone who opens the page.  ``AlertEvaluator`` watches every run under one root and says when a
condition starts (``firing``) and when it stops (``cleared``); ``Delivery`` posts each alert to a
webhook; ``alerter.Alerter`` ties the two and is what ``python -m metrics_core alerts`` runs
headless and what a dashboard server runs once per root (never once per viewer).

Rules are in ``rules``, the webhook bodies and their delivery in ``webhooks``.

Promises:

* **One alert per condition per run until it clears**: a condition that stays true sends nothing
  more, whatever its message says meanwhile; conditions are functions of the run's current state,
  so re-reading a run from its start (after a rewrite, or a reopen) re-derives them and sends
  nothing twice.  Runs whose last record is older than ``ignore_after_h`` raise no new alert: an
  alerter started on a root of old crashed runs pages no one.
* **Incremental**: a pass reads only the bytes appended since the last one (``stats["bytes_read"]``
  counts them); a run with nothing new costs one ``stat``, and a run that ended (finished, failed,
  interrupted, crashed) holds no open file and no parsed state beyond its active conditions until
  its file changes, when it is read again from its start.  Memory per followed run is its
  sessions and ``spike_windows`` floats, not its records.  The root is walked for runs that
  appeared or went once per ``rediscover_s`` (a minute by default: the walk is most of an idle
  pass over a big root, and a stall takes a minute to show anyway).  No numpy or pandas: the
  headless command runs on a training node with ``metrics_core`` alone.
* **Delivery** is at least once per firing alert, in order (``webhooks``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from metrics_core.alerts.rules import AlertConfig, Condition, RunRules
from metrics_core.alerts.webhooks import Alert
from metrics_core.errors import MetricsError
from metrics_core.read.line_follower import LineFollower
from metrics_core.read.records import MAX_RECORD_BYTES
from metrics_core.read.run_digest import batches
from metrics_core.read.run_file import LocalFile
from metrics_core.read.run_status import SETTLED, StatusSource, run_status, write_failure
from metrics_core.read.run_summary import FollowedLog
from metrics_core.read.session_accounting import SessionLog
from metrics_core.roots.discovery import RunInfo, find_runs

REDISCOVER_S = 60.0  # a new run is noticed within a minute: alerts wait at least that long for a stall
RECENT_ALERTS = 1000  # transitions kept for a page to show
_log = logging.getLogger(__name__)


# -- one run, followed -------------------------------------------------------------------------


class RunFeed(FollowedLog):
    """One run's file followed for the rules: the read layers up to ``SessionLog`` (what
    ``run_status`` reads) and a ``RunRules``, nothing per record (unlike ``run_digest.RunDigest``,
    which keeps each record's step for replay accounting the rules do not need)."""

    def __init__(
        self, path: Path, config: AlertConfig, *, max_record_bytes: int = MAX_RECORD_BYTES, within: Path | None = None
    ) -> None:
        """``within``: the resolved runs root, which the file read must lie inside (``LocalFile``)."""
        self.path = path
        self.file = LocalFile(path, within=within)
        self._follower = LineFollower(self.file, max_record_bytes=max_record_bytes)
        self.config = config
        self.log = SessionLog()
        self.rules = RunRules(config)

    def refresh(self, pace: Callable[[], None] | None = None) -> tuple[int, int]:
        """Read what was appended since the last call: (bytes read, records).  ``pace`` is called
        after each block read (``lines.READ_CHUNK`` bytes at most)."""
        start, records = self._follower.offset, 0
        for batch in batches(self._follower):
            if batch.reset is not None:  # rewritten or replaced: everything is read again
                start, records = 0, 0
                self.log, self.rules = SessionLog(), RunRules(self.config)
            self.log.add(batch.records)
            self.rules.add(batch.records)
            records += len(batch.records)
            if pace is not None:
                pace()
        return self._follower.offset - start, records

    @property
    def read_identity(self) -> tuple[int, ...] | None:
        return self._follower.read_identity

    def close(self) -> None:
        self._follower.close()


# -- what an evaluator follows of a run ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunState:
    """What the rules read of a run besides its records: its status (``run_status``), the age of
    its last record in seconds, and for a failed run the failed write if that is why."""

    status: str
    age_s: float | None
    failure: str | None

    @classmethod
    def of(cls, source: StatusSource, now: datetime) -> RunState:
        status, last = run_status(source, now=now), source.last_record_time
        failure = write_failure(source) if status == "failed" else None
        return cls(status, None if last is None else (now - last).total_seconds(), failure and failure.error)

    def conditions(self, rules: RunRules) -> tuple[list[Condition], float | None]:
        """What holds for the run now, and the age of its last record."""
        return rules.conditions(self.status, age_s=self.age_s, failure=self.failure), self.age_s


class RunFollow(Protocol):
    """One run as an evaluator follows it: ``FileFollow`` reads its file (the headless command);
    a dashboard server's reads what its store already read (``dashboard.alerting.StoreFollow``),
    so that the server parses each run once."""

    def conditions(self, now: datetime, stats: dict[str, int]) -> tuple[list[Condition], float | None] | None:
        """What holds now and the age of the last record; None: as before.  Counts into ``stats``."""

    def close(self) -> None:
        """Let go of the run's file and parsed state: the next ``conditions`` reads it again."""


class FileFollow:
    """A run read by its own ``RunFeed``: O(appended bytes) per pass; a settled run holds no
    feed, and costs one ``stat`` per pass until its file changes, when it is read again from its
    start.  ``pace``: ``AlertEvaluator``'s; ``within``: ``RunFeed``'s."""

    def __init__(
        self, path: Path, config: AlertConfig, pace: Callable[[], None] | None = None, *, within: Path | None = None
    ) -> None:
        self.path, self.config, self.pace, self.within = path, config, pace, within
        self.feed: RunFeed | None = None  # None: not read yet, or settled and let go (``stamp`` says as of when)
        self.stamp: tuple[int, ...] | None = None

    def conditions(self, now: datetime, stats: dict[str, int]) -> tuple[list[Condition], float | None] | None:
        if self.feed is None:
            if self.stamp is not None:
                stat = LocalFile(self.path).stat()
                if stat is None or stat.identity == self.stamp:
                    return None
            self.feed, self.stamp = RunFeed(self.path, self.config, within=self.within), None
            stats["runs_read"] += 1
        feed = self.feed
        read, records = feed.refresh(self.pace)
        stats["bytes_read"] += read
        stats["records"] += records
        state = RunState.of(feed, now)
        if state.status in SETTLED:
            self.stamp, self.feed = feed.read_identity, None
            feed.close()
        return state.conditions(feed.rules)

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()
        self.feed = self.stamp = None


# -- the evaluator of a root ---------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    follow: RunFollow
    active: dict[str, Alert] = field(default_factory=dict)


class AlertEvaluator:
    """Every run under ``root``, evaluated incrementally; see the module docstring.  Thread-safe:
    a server's pages may read ``firing``/``recent`` while its alert thread evaluates, and are not
    held up by a pass (a first pass over a big root takes as long as reading it): each run's
    alerts are published as its evaluation ends."""

    def __init__(
        self,
        root: str | Path,
        config: AlertConfig | None = None,
        *,
        rediscover_s: float = REDISCOVER_S,
        clock: Callable[[], float] = time.monotonic,
        firing: Mapping[str, Iterable[str]] | None = None,
        pace: Callable[[], None] | None = None,
        follow: Callable[[RunInfo], RunFollow] | None = None,
        runs: Callable[[], list[RunInfo]] | None = None,
    ) -> None:
        """``rediscover_s``: how often the root is walked for runs that appeared or went (the walk,
        a ``scandir`` per directory, is most of an idle pass over a big root).  ``firing``: per
        run, the conditions an earlier process already alerted on (``alerts --state``): they
        count as firing, and alert again only after they have cleared.  ``pace``: called after
        each block of a run read (``RunFeed.refresh``), where a pass may wait: a dashboard
        server's alerter shares its process, and Python's lock, with the pages.  ``follow``: how a
        run found under the root is followed (``FileFollow``, reading its file, by default).
        ``runs``: what lists the runs instead of a walk, asked at every pass (a server's store,
        which walks only when its root says runs came or went, and says which runs changed)."""
        self.root = Path(root)
        self.pace = pace
        self.config = config or AlertConfig()
        within = self.root.resolve()  # no run's read leads outside it (``run_file.open_regular``)
        self._follow = follow or (lambda info: FileFollow(info.metrics_path, self.config, pace, within=within))
        self.rediscover_s = 0.0 if runs is not None else rediscover_s
        self._list_runs = runs or (lambda: find_runs(self.root))
        self._clock = clock
        self._found_at = -math.inf
        self._runs: dict[str, _Run] = {}
        self._earlier = {name: list(conditions) for name, conditions in (firing or {}).items()}
        self._pass = threading.Lock()  # one pass at a time: guards ``_runs`` and ``stats``
        self._lock = threading.Lock()  # guards what is published: ``_firing`` and ``_recent``
        self._firing: dict[str, tuple[Alert, ...]] = {}
        self._recent: deque[Alert] = deque(maxlen=RECENT_ALERTS)
        # Work counters, read by the tests that bound a pass's cost (work is counted, not timed).
        self.stats = {"passes": 0, "walks": 0, "bytes_read": 0, "records": 0, "runs_read": 0, "errors": 0}

    def evaluate(self, *, now: datetime) -> list[Alert]:
        """One pass over the root: the alerts that started or stopped holding since the last pass."""
        with self._pass:
            self.stats["passes"] += 1
            alerts = []
            if self._clock() - self._found_at >= self.rediscover_s:
                try:
                    alerts = self._rediscover(now)
                except (OSError, MetricsError):  # the root is gone for now (an NFS hiccup): keep its runs
                    _log.warning("alerts: the runs root %s could not be walked", self.root, exc_info=True)
                    self.stats["errors"] += 1
            for name, run in self._runs.items():
                try:
                    found = run.follow.conditions(now, self.stats)
                except Exception:  # one unreadable run must not stop the alerts of the others
                    _log.warning("alerts: run %r could not be read", name, exc_info=True)
                    self.stats["errors"] += 1
                    run.follow.close()
                    continue
                if found is not None:
                    alerts += self._publish(name, run, self._transitions(name, run, *found, now))
            return alerts

    def _publish(self, name: str, run: _Run | None, alerts: list[Alert]) -> list[Alert]:
        """Make ``alerts`` of run ``name`` (None: gone) visible to ``firing`` and ``recent``."""
        if alerts:
            with self._lock:
                self._recent.extend(alerts)
                self._firing.pop(name, None)
                if run is not None and run.active:
                    self._firing[name] = tuple(run.active.values())
        return alerts

    def _rediscover(self, now: datetime) -> list[Alert]:
        """Walk the root: follow the runs that appeared, forget those that went (their alerts clear)."""
        infos = self._list_runs()
        self._found_at = self._clock()
        self.stats["walks"] += 1
        names = {info.name: info for info in infos}
        alerts = []
        for name in [name for name in self._runs if name not in names]:
            run = self._runs.pop(name)
            run.follow.close()
            alerts += self._publish(
                name, None, [Alert(name, key, "cleared", "the run is gone", now) for key in run.active]
            )
        for name, info in names.items():
            if name not in self._runs:
                run = self._runs[name] = _Run(self._follow(info))
                for key in self._earlier.pop(name, ()):
                    run.active[key] = Alert(name, key, "firing", "alerted on by an earlier alerter", now)
                if run.active:
                    with self._lock:
                        self._firing[name] = tuple(run.active.values())
        return alerts

    def _transitions(
        self, name: str, run: _Run, found: list[Condition], age: float | None, now: datetime
    ) -> list[Alert]:
        horizon = self.config.ignore_after_h * 3600.0
        fresh = not horizon or age is None or age <= horizon
        alerts = []
        holding = {condition.name for condition in found}
        for key in [key for key in run.active if key not in holding]:
            del run.active[key]
            alerts.append(Alert(name, key, "cleared", "no longer holds", now))
        for condition in found:
            if condition.name not in run.active and fresh:
                alert = Alert(name, condition.name, "firing", condition.message, now, condition.step)
                run.active[condition.name] = alert
                alerts.append(alert)
        return alerts

    def firing(self) -> dict[str, list[Alert]]:
        """The alerts firing now, per run (for the runs page and a run's page)."""
        with self._lock:
            return {name: list(alerts) for name, alerts in self._firing.items()}

    def recent(self) -> list[Alert]:
        """The last ``RECENT_ALERTS`` firing and cleared alerts, oldest first."""
        with self._lock:
            return list(self._recent)

    def close(self) -> None:
        with self._pass:
            for run in self._runs.values():
                run.follow.close()
