"""The dashboard server's alerts: one ``Alerter`` per runs root per server process, evaluating in a
daemon thread while the server runs, and what a page shows of it.

One evaluator per server, never one per viewer: ``settings.get_alerter`` holds a ``ServerAlerter``
in ``st.cache_resource``, so every tab reads the same alerts and a webhook gets each alert once
however many tabs are open.  It has the rules and the two settings (``--webhook``,
``--alerts-config``) of ``python -m metrics_core alerts``; without a webhook its alerts are only
shown.  Pages never wait for a pass: they read what the evaluator published (under its lock), and
say so while its first pass over the root is still reading.

One parse per run per process: the evaluator walks the root as the command does, but reads each
run through the server's ``RunStore`` (``StoreFollow``): a pass brings the run up to date as its
runs table row is (the store's reader, refreshed if due, or a read if the store never read it),
then feeds the rules the records the store read since the last pass, from its columns: O(new
records), and no copy of a run beside the store's.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import streamlit as st

from metrics_core.alerts.alerter import INTERVAL_S, Alerter
from metrics_core.alerts.evaluator import RunState
from metrics_core.alerts.needed_rows import needed_rows
from metrics_core.alerts.rules import AlertConfig, Condition, RunRules
from metrics_core.alerts.webhooks import Alert
from metrics_core.dashboard.display_text import md_text, shorten_words
from metrics_core.dashboard.store.rows import event_rows
from metrics_core.dashboard.store.run_store import RunStore, RunViewError
from metrics_core.read.columns import Column, as_python
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import SETTLED, StatusRecord, StatusSource
from metrics_core.roots.discovery import RunInfo
from metrics_core.text import clean

FIRING_SHOWN = 50  # firing alerts listed on the runs page; more are counted, not listed
CLEARED_SHOWN = 20  # recently cleared alerts listed behind the expander
READ_SHARE = 0.25  # of a core, at most, for the server alerter's reading (``Pacer``)
FEED_ROWS = 4096  # records fed to the rules between two calls of ``pace``
_log = logging.getLogger(__name__)


class Pacer:
    """Called by the alerter's thread after each block it read: waits until that thread's CPU time
    since the last call is at most ``share`` of the wall time since.

    The alerter parses in pure Python, holding the interpreter lock the pages' threads need; a
    first pass over a run of a million records is tens of seconds of it, and unpaced it makes
    every answer a live page waits for meanwhile several times slower (each time a page's thread
    lets the lock go, in numpy or I/O, it waits for the parser's next switch interval to get it
    back).  Paced, the pages get the lock free most of the time; a pass that reads little (an
    append) never waits, as the wall time since the last pass covers its CPU time.
    ``stop`` ends a wait early; ``cpu`` and ``wall`` are the thread's CPU clock and the wall clock."""

    def __init__(
        self,
        stop: threading.Event,
        *,
        share: float = READ_SHARE,
        cpu: Callable[[], float] = time.thread_time,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        self.share, self._stop, self._cpu, self._wall = share, stop, cpu, wall
        self._since: tuple[float, float] | None = None  # (CPU, wall) clocks at the last call

    def __call__(self) -> None:
        if self._since is not None:
            cpu, wall = self._since
            wait = (self._cpu() - cpu) / self.share - (self._wall() - wall)
            if wait > 0:
                self._stop.wait(wait)
        self._since = (self._cpu(), self._wall())


# The columns of one event's new records as ``StoreFollow`` takes them under the run's lock:
# (event, {field: (column kind, values, categories)}), the values views of the reader's.
_Taken = tuple[str, dict[str, tuple[str, np.ndarray, list[str]]]]


class StoreFollow:
    """A run as the server's alerter follows it (``evaluator.RunFollow``): through ``store``,
    which reads it once for the pages and the alerts.

    Each pass takes, under the run's lock, its state (``RunState``) and views of the columns
    the rules read of the rows added since the last pass (O(fields)), and feeds the rules those
    rows outside the lock, ``FEED_ROWS`` at a time with ``pace`` between: a page never waits on
    the rules.  The rules follow one reader: a new one (the store released the run and read it
    again, or a reset) starts them again from its first row, as a re-read does the command's.
    Nothing is held of the reader (a weak reference): the store's memory bound stands."""

    def __init__(self, store: RunStore, info: RunInfo, config: AlertConfig, pace: Callable[[], None] | None) -> None:
        self.store, self.info, self.config, self.pace = store, info, config, pace
        # Made by the first feed: most runs of a big root are settled past the horizon, never fed.
        self.rules: RunRules | None = None
        self._reader: weakref.ref[RunReader] | None = None  # the reader the rules were fed from
        self._key: Any = None  # the store's data key of what they were fed
        self._resets = 0  # the reader's resets when the rules started on it
        self._rows: dict[str, int] = {}  # per event: rows fed to the rules
        self._seen: tuple[object, ...] | None = None  # the store's ``status_key`` at the last pass

    def conditions(self, now: datetime, stats: dict[str, int]) -> tuple[list[Condition], float | None] | None:
        if self.store.quiet(self.info, self._seen):
            return None  # settled and unchanged since the last pass: its conditions stand
        take = lambda reader, released, key: self._take(reader, released, key, now)  # noqa: E731
        try:
            state, taken = self.store.read_run(self.info, take, now=now)
            if state is None:  # released before the rules had all it read: read again (the cache's)
                state, taken = self.store.read_run(self.info, take, now=now, need_reader=True)
        except RunViewError:
            return None  # the store's row says why; its active conditions stand until it reads again
        if state is None:
            return None
        rules = self.rules if self.rules is not None else RunRules(self.config)  # never fed: a fresh one's answer
        records = _records(taken, rules)
        for start in range(0, len(records), FEED_ROWS):
            rules.add(records[start : start + FEED_ROWS])
            if self.pace is not None:
                self.pace()
        stats["records"] += sum(len(columns["step"][1]) for _, columns in taken)
        return state.conditions(rules)

    def _take(
        self, reader: RunReader | None, released: StatusRecord | None, key: Any, now: datetime
    ) -> tuple[RunState | None, list[_Taken]]:
        """Under the run's lock: its state and the new rows' columns (``_Taken``); no state when
        the store holds no reader and the rules lack some of what it read."""
        if reader is None:
            if released is None or (key != self._key and not self._past_horizon(released, now)):
                return None, []
            self._key, self._seen = key, self.store.status_key(self.info)
            return RunState.of(released, now), []
        if key != self._key and self._past_horizon(reader, now):  # nothing it holds can alert: not fed
            self._reader, self._key, self._seen = None, key, self.store.status_key(self.info)
            return RunState.of(reader, now), []
        if self._reader is None or self._reader() is not reader or reader.resets != self._resets:
            if key == self._key and self._reader is not None:  # the same data read again: nothing new
                self._rows = {event: event_rows(reader, event) for event in reader.events}
            else:
                self.rules, self._rows = RunRules(self.config), {}
            self._reader, self._resets = weakref.ref(reader), reader.resets
        if self.rules is None:  # the rules were never made for the reader they follow: from its first row
            self.rules, self._rows = RunRules(self.config), {}
        taken = []
        for event in reader.events:
            fields = self.rules.fields(event)
            start, stop = self._rows.get(event, 0), event_rows(reader, event)
            if not fields or stop == start:
                continue
            self._rows[event] = stop
            columns = {"time": reader.column(event, "time")} if self.rules.across_events else {}
            columns.update((name, reader.column(event, name)) for name in fields if name != "event")
            taken.append(
                (event, {name: _slice(column, start, stop) for name, column in columns.items() if column is not None})
            )
        self._key = key
        self._seen = self.store.status_key(self.info)
        return RunState.of(reader, now), taken

    def _past_horizon(self, run: StatusSource, now: datetime) -> bool:
        """Whether a run can raise no new alert whatever its records hold: settled, and its last
        record older than ``ignore_after_h``.  Its rules are then not fed (for a released run the
        store would read it again for them: a year's root read twice); a write makes its data new,
        and the rules start again from its first record."""
        state = RunState.of(run, now)
        horizon = self.config.ignore_after_h * 3600.0
        return state.status in SETTLED and bool(horizon) and state.age_s is not None and state.age_s > horizon

    def close(self) -> None:
        """Forget the rules' state (the store's reader is the store's): the next pass feeds them
        the reader's records again from its first."""
        self._reader = self._key = self._seen = None


def _slice(column: Column, start: int, stop: int) -> tuple[str, np.ndarray, list[str]]:
    values = column.view()
    return column.kind, (np.full(stop - start, np.nan) if values is None else values[start:stop]), column.categories


def _records(taken: list[_Taken], rules: RunRules) -> list[dict[str, Any]]:
    """The rows ``taken`` as the records ``rules.add`` reads (the fields it reads alone; of a long
    run of train records, only those it needs: ``needed_rows``), each event's in file order, and
    all of them in the order they were logged when the rules read across events."""
    records: list[dict[str, Any]] = []
    for event, columns in taken:  # every event taken has its "step" column
        rows = needed_rows(columns, rules) if event == "train" else None
        names = list(columns)
        values = [_python(*columns[name], rows) for name in names]
        records += [{"event": event, **dict(zip(names, row, strict=True))} for row in zip(*values, strict=True)]
    if rules.across_events and len(taken) > 1:
        records.sort(key=lambda record: record["time"])  # stable: an event's records keep their order
    return records


def _python(kind: str, values: np.ndarray, categories: list[str], rows: np.ndarray | None) -> list[Any]:
    """A column's ``rows`` (None: all) as a record holds them (an integer stays one; a missing
    number is NaN, which every rule skips as it skips a missing field)."""
    values = values if rows is None else values[rows]
    return values.tolist() if kind in ("int", "float") else as_python(kind, values, categories)


class ServerAlerter:
    """An ``Alerter`` on ``store``'s root, reading through it (``StoreFollow``), run in a daemon
    thread from construction until ``close``.  Thread-safe: ``firing`` and ``recent`` are the
    evaluator's locked copies."""

    def __init__(
        self, store: RunStore, config: AlertConfig, *, webhook: str | None, interval: float = INTERVAL_S
    ) -> None:
        self._stop = threading.Event()
        pace = Pacer(self._stop)
        root = store.root
        self.alerter = Alerter(
            root,
            config,
            webhook=webhook,
            report=_log.warning,
            pace=pace,
            follow=lambda info: StoreFollow(store, info, config, pace),
            runs=store.runs,
        )
        self.interval = interval
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"alerts {root}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            # The first pass reads every run of the root, as the store's cold load does for the
            # first page: it starts one interval later, so the page a user opened goes first.
            if self._stop.wait(self.interval):
                return
            for alert in self.alerter.tick():  # the first pass, then the page's "reading" note goes
                _log.info("%s", alert.line())
            self._ready.set()
            self.alerter.run(interval=self.interval, stop=self._stop, on_alert=lambda a: _log.info("%s", a.line()))
        except Exception:  # the pages keep what was published; the server log says why it stopped
            _log.exception("alerts: the alerter of %s stopped", self.alerter.evaluator.root)
        finally:
            self.alerter.close()

    @property
    def ready(self) -> bool:
        """Whether the first pass over the root has ended."""
        return self._ready.is_set()

    def firing(self) -> dict[str, list[Alert]]:
        return self.alerter.evaluator.firing()

    def recent(self) -> list[Alert]:
        return self.alerter.evaluator.recent()

    def stop(self) -> None:
        """Ask the thread to stop after its current pass; ``close`` waits for it."""
        self._stop.set()

    def close(self, *, timeout: float = 5.0) -> None:
        """Stop the thread after its current pass, waiting at most ``timeout`` seconds: a first
        pass over a big root is not cut short, and a daemon thread ends with the process anyway."""
        self.stop()
        self._thread.join(timeout)


# -- what a page shows ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlertsNotice:
    """The runs page's alerts as plain lines: compared with the one drawn, it says whether to redraw."""

    ready: bool
    firing: tuple[str, ...]
    cleared: tuple[str, ...]


def alert_line(alert: Alert, *, with_run: bool = True) -> str:
    """One alert as a plain line: run, condition, since when (or when it cleared), what it says.
    Run names and messages come from files: cleaned of control characters, cut to a readable size."""
    when = f"{'since' if alert.state == 'firing' else 'cleared'} {alert.time:%Y-%m-%d %H:%M:%S} UTC"
    run = f"{alert.run} · " if with_run else ""
    return shorten_words(clean(f"{run}{alert.condition} {when}: {alert.message}"))


def firing_lines(firing: Mapping[str, Sequence[Alert]], *, limit: int = FIRING_SHOWN) -> tuple[str, ...]:
    """The firing alerts, newest first (then by run and condition), at most ``limit`` and a count
    of the rest."""
    alerts = sorted((a for run in firing.values() for a in run), key=lambda a: (a.run, a.condition))
    alerts.sort(key=lambda a: a.time, reverse=True)
    lines = tuple(alert_line(alert) for alert in alerts[:limit])
    return lines + ((f"… and {len(alerts) - limit} more",) if len(alerts) > limit else ())


def alerts_notice(
    firing: Mapping[str, Sequence[Alert]], recent: Sequence[Alert], *, ready: bool, cleared: int = CLEARED_SHOWN
) -> AlertsNotice:
    """What the runs page shows: the firing alerts, and the last ``cleared`` ones that cleared."""
    gone = [alert for alert in reversed(recent) if alert.state == "cleared"][:cleared]
    return AlertsNotice(ready, firing_lines(firing), tuple(alert_line(alert) for alert in gone))


def run_alert_lines(firing: Mapping[str, Sequence[Alert]], run: str) -> tuple[str, ...]:
    """The alerts firing for ``run``, in the order they started, without its name (its page says it)."""
    return tuple(alert_line(alert, with_run=False) for alert in firing.get(run, ()))


def notice_of(alerter: ServerAlerter | None) -> AlertsNotice | None:
    """What the runs page shows of ``alerter`` now (None: alerts are off)."""
    return None if alerter is None else alerts_notice(alerter.firing(), alerter.recent(), ready=alerter.ready)


def show_notice(notice: AlertsNotice | None) -> AlertsNotice | None:
    """The runs page's alerts: a warning listing the firing ones, the cleared ones behind an
    expander.  Returns ``notice``: the page keeps what it drew to compare the next one with."""
    if notice is None:
        return None
    if not notice.ready:
        st.caption("Alerts: reading the runs for the first time…")
    if notice.firing:
        lines = "  \n".join(md_text(line) for line in notice.firing)
        st.warning(f"**Firing alerts**  \n{lines}", icon=":material/notifications_active:")
    if notice.cleared:
        with st.expander(f"Recently cleared alerts ({len(notice.cleared)})", icon=":material/notifications_off:"):
            st.text("\n".join(notice.cleared))
    return notice


def run_alerts(alerter: ServerAlerter | None, run: str) -> tuple[str, ...]:
    """The alerts firing for ``run`` now (none when alerts are off), as ``run_alert_lines``."""
    return () if alerter is None else run_alert_lines(alerter.firing(), run)


def show_run_alerts(lines: Sequence[str]) -> None:
    """A run's firing alerts (``run_alerts``), one line each, in the run page's status rows."""
    if lines:
        st.warning("  \n".join(md_text(line) for line in lines), icon=":material/notifications_active:")
