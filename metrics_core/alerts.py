"""Alerts on a runs root: rules over what the read path knows, sent once to a webhook.

A run that goes NaN at night, hangs in a collective or dies on a node is otherwise found only by
someone who opens the page.  ``AlertEvaluator`` watches every run under one root and says when a
condition starts (``firing``) and when it stops (``cleared``); ``Delivery`` posts each alert to a
webhook; ``Alerter`` ties the two and is what ``python -m metrics_core alerts`` runs headless and
what a dashboard server runs once per root (never once per viewer).

Rules (``RunRules``, pure running state fed records in file order; ``AlertConfig`` holds every
knob, and its defaults need no configuration):

* ``nonfinite_loss`` — a ``train`` window's loss was NaN or infinite (``nonfinite_loss`` true, as
  ``TrainingWindow`` writes it).
* ``loss_spike`` — a window's loss more than ``spike_z`` standard deviations above the mean of the
  previous ``spike_windows`` finite losses (after ``spike_min_windows`` of them); the deviation is
  at least 1% of the mean, so a flat loss's rounding noise is no spike.
* Both are events, not states: each holds from the window it happened in until
  ``clear_after_windows`` windows with a finite loss and no spike follow, so a NaN that the loop
  recovered from before the next pass is still reported, and one every few windows is one alert.
* ``stalled`` / ``crashed`` / ``failed`` (``statuses``) — ``runs.run_status``, the rule the
  overview shows; ``interrupted`` (a preemption) only when listed.
* ``skipped_updates`` / ``clipped_fraction`` — the last window's skipped attempts over its
  attempts, or its clipped fraction, above a threshold; a session's first window is not judged
  (FP16 loss scaling skips steps while it calibrates).  Clipping is off by default: many recipes
  clip most updates early on, and an alert that fires on healthy runs is noise.
* ``threshold`` — any logged number crossing ``above`` / ``below`` (the last value logged).

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
* **Delivery** is at least once per firing alert, in order: a receiver that is down or answers
  5xx/408/429 is retried with exponential backoff (``Retry-After`` honoured) until it answers;
  a 4xx is final (the request will never be accepted) and reported.  Every request has a
  timeout.  Slack and Discord webhook URLs get the bodies those services accept; any other URL
  gets the generic JSON body (``webhook_body``).  Text from run files is escaped for the chat
  services that render markup, and Discord mentions are disabled.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import orjson

from metrics_core.digest import batches
from metrics_core.errors import AlertConfigError, MetricsError
from metrics_core.lines import LineFollower
from metrics_core.records import MAX_RECORD_BYTES
from metrics_core.runs import END_STATUSES, find_runs, run_status, write_failure
from metrics_core.sessions import SessionLog, number
from metrics_core.storage import LocalFile
from metrics_core.summary import FollowedLog
from metrics_core.text import clean, fit

ALERT_STATUSES = ("stalled", "crashed", "failed", "interrupted")
SETTLED = (*END_STATUSES, "crashed")  # statuses only a write can change: the run's file is let go
REDISCOVER_S = 60.0  # a new run is noticed within a minute: alerts wait at least that long for a stall
RECENT_ALERTS = 1000  # transitions kept for a page to show
MAX_QUEUE = 10_000  # undelivered alerts kept while a receiver is down; the oldest go first
ONCE_DELIVERY_S = 60.0  # how long ``alerts --once`` keeps retrying a receiver that is down
_log = logging.getLogger(__name__)


# -- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Threshold:
    """Alert when the last number logged as ``key`` (by ``event`` records, any event if None) is
    above ``above`` or below ``below``."""

    key: str
    event: str | None = None
    above: float | None = None
    below: float | None = None

    @property
    def name(self) -> str:
        where = f"{self.event}.{self.key}" if self.event else self.key
        bounds = [f"> {self.above:g}"] if self.above is not None else []
        bounds += [f"< {self.below:g}"] if self.below is not None else []
        return f"threshold {where} {' or '.join(bounds)}"


@dataclass(frozen=True, slots=True)
class AlertConfig:
    """Every rule's knob; the defaults are the rules with no configuration (module docstring)."""

    statuses: tuple[str, ...] = ("stalled", "crashed", "failed")
    nonfinite_loss: bool = True
    spike_z: float = 6.0  # 0: no spike rule
    spike_windows: int = 30
    spike_min_windows: int = 10
    clear_after_windows: int = 30
    skipped_fraction_above: float | None = 0.5
    clipped_fraction_above: float | None = None
    thresholds: tuple[Threshold, ...] = ()
    ignore_after_h: float = 24.0  # 0: alert on runs of any age
    notify_cleared: bool = False
    webhook: str | None = None


_TOML_TYPES: dict[str, tuple[type, ...]] = {
    "statuses": (list,), "nonfinite_loss": (bool,), "spike_z": (int, float), "spike_windows": (int,),
    "spike_min_windows": (int,), "clear_after_windows": (int,), "skipped_fraction_above": (int, float),
    "clipped_fraction_above": (int, float), "threshold": (list,), "ignore_after_h": (int, float),
    "notify_cleared": (bool,), "webhook": (str,),
}  # fmt: skip
_THRESHOLD_TYPES: dict[str, tuple[type, ...]] = {"key": (str,), "event": (str,), "above": (int, float),
                                                 "below": (int, float)}  # fmt: skip


def load_config(path: str | Path) -> AlertConfig:
    """An ``AlertConfig`` from a TOML file (README, "Alerts"); AlertConfigError names the file,
    the key and what was expected.  The parser is ``tomllib`` (Python 3.11+); on 3.10, ``tomli``
    if installed (the ``app`` extra installs it), else a one-line refusal: the defaults need no file."""
    path = Path(path)
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise AlertConfigError(f"{path}: reading a TOML config needs Python 3.11+ or `pip install tomli`") from None
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AlertConfigError(f"{path}: cannot read the alerts config ({exc.strerror or exc})") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AlertConfigError(f"{path}: not valid TOML ({exc})") from exc
    _check_types(path, table, _TOML_TYPES, "")
    values: dict[str, Any] = {key: value for key, value in table.items() if key != "threshold"}
    if "statuses" in values:
        statuses = values["statuses"]
        unknown = [status for status in statuses if status not in ALERT_STATUSES]
        if unknown:
            raise AlertConfigError(f"{path}: statuses: {unknown[0]!r} is not one of {', '.join(ALERT_STATUSES)}")
        values["statuses"] = tuple(statuses)
    thresholds = []
    for number_, item in enumerate(table.get("threshold", []), start=1):
        where = f"threshold #{number_}: "
        if not isinstance(item, dict):
            raise AlertConfigError(f"{path}: {where}expected a [[threshold]] table")
        _check_types(path, item, _THRESHOLD_TYPES, where)
        if "key" not in item or ("above" not in item and "below" not in item):
            raise AlertConfigError(f"{path}: {where}needs a key and an above or a below")
        thresholds.append(Threshold(**{k: float(v) if k in ("above", "below") else v for k, v in item.items()}))
    values["thresholds"] = tuple(thresholds)
    config = AlertConfig(**values)
    _check_values(path, config)
    return config


def _check_types(path: Path, table: Mapping[str, Any], types: Mapping[str, tuple[type, ...]], where: str) -> None:
    for key, value in table.items():
        expected = types.get(key)
        if expected is None:
            raise AlertConfigError(f"{path}: {where}unknown key {key!r} (known: {', '.join(types)})")
        if not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
            names = " or ".join(kind.__name__ for kind in expected)
            raise AlertConfigError(f"{path}: {where}{key} is {value!r}: expected {names}")


def _check_values(path: Path, config: AlertConfig) -> None:
    numbers = {"spike_z": config.spike_z, "ignore_after_h": config.ignore_after_h,
               "skipped_fraction_above": config.skipped_fraction_above,
               "clipped_fraction_above": config.clipped_fraction_above}  # fmt: skip
    for key, value in numbers.items():
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise AlertConfigError(f"{path}: {key} is {value!r}: expected a finite number >= 0")
    if not 2 <= config.spike_min_windows <= config.spike_windows:
        raise AlertConfigError(f"{path}: expected 2 <= spike_min_windows <= spike_windows, got "
                               f"{config.spike_min_windows} and {config.spike_windows}")  # fmt: skip
    if config.clear_after_windows < 1:
        raise AlertConfigError(f"{path}: clear_after_windows is {config.clear_after_windows}: expected 1 or more")
    if config.webhook is not None:
        try:
            webhook_kind(config.webhook)
        except AlertConfigError as exc:
            raise AlertConfigError(f"{path}: {exc}") from None


# -- rules -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Condition:
    """A rule that holds for a run now: its name (the dedup key), a sentence, the step it is about."""

    name: str
    message: str
    step: int | None = None


class _Window:
    """The last ``size`` finite losses with their running sum and sum of squares: a z-score per
    window in O(1).  The sums are recomputed from the values once per ``size`` additions, so
    rounding cannot drift over a run of millions of windows."""

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self.total = self.squares = 0.0
        self._added = 0

    def z(self, value: float) -> tuple[float, float]:
        """``value``'s deviation above the mean in standard deviations (the deviation is at least
        1% of the mean's size), and the mean."""
        count = len(self.values)
        mean = self.total / count
        spread = max(math.sqrt(max(self.squares / count - mean * mean, 0.0)), 0.01 * abs(mean), 1e-12)
        return (value - mean) / spread, mean

    def add(self, value: float) -> None:
        if len(self.values) == self.values.maxlen:
            old = self.values[0]
            self.total -= old
            self.squares -= old * old
        self.values.append(value)
        self.total += value
        self.squares += value * value
        self._added += 1
        if self._added % self.values.maxlen == 0:
            self.total = math.fsum(self.values)
            self.squares = math.fsum(v * v for v in self.values)


class RunRules:
    """The rules of one run as running state: ``add`` records in file order, ask ``conditions``.

    Pure: no file, no clock.  Fed all of a run's records at once or in any split, it answers the
    same (``tests/test_alerts.py`` checks it against a from-scratch oracle).
    """

    def __init__(self, config: AlertConfig) -> None:
        self.config = config
        self._losses = _Window(config.spike_windows)
        self._nonfinite: int | None = None  # step of the last window whose loss was not finite
        self._spike: Condition | None = None
        self._finite = 0  # windows with a finite loss since the last non-finite one
        self._quiet = 0  # windows with a finite loss and no spike since the last spike
        self._last: dict[str, tuple[float, int]] = {}  # a fraction or threshold name -> (last value, step)
        self._end_error: str | None = None
        self._session: str | None = None  # of the last train window

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        for record in records:
            event = record["event"]
            if event == "train":
                self._add_train(record)
            elif event == "session_end":
                error = record.get("error")
                self._end_error = error if isinstance(error, str) else None
            for threshold in self.config.thresholds:
                if threshold.event in (None, event) and threshold.key in record:
                    value = number(record[threshold.key])
                    if value is not None and math.isfinite(value):
                        self._last[threshold.name] = (value, record["step"])

    def _add_train(self, record: Mapping[str, Any]) -> None:
        step, session = record["step"], record["session_id"]
        # A session's first window is not judged: FP16 loss scaling skips steps while it calibrates.
        if session == self._session:
            fractions = (("clipped_fraction", number(record.get("clipped_fraction"))),
                         ("skipped_updates", _skipped_fraction(record)))  # fmt: skip
            for key, value in fractions:
                if value is not None and math.isfinite(value):
                    self._last[key] = (value, step)
        self._session = session
        if record.get("nonfinite_loss") is True or _names_loss(record.get("nonfinite_keys")):
            self._nonfinite, self._finite = step, 0
            return
        loss = number(record.get("train_loss"))
        if loss is None or not math.isfinite(loss):
            return  # a window without tokens has no loss: it neither clears nor spikes
        self._finite += 1
        window = self._losses
        if self.config.spike_z and len(window.values) >= self.config.spike_min_windows:
            z, mean = window.z(loss)
            if z > self.config.spike_z:
                self._spike = Condition("loss_spike", f"train loss {loss:.4g} at step {step} is {z:.1f} standard "
                                        f"deviations above the mean {mean:.4g} of the last "
                                        f"{len(window.values)} windows", step)  # fmt: skip
                self._quiet = -1
        self._quiet += 1
        window.add(loss)

    def conditions(self, status: str, *, age_s: float | None = None, failure: str | None = None) -> list[Condition]:
        """What holds now, given the run's ``status`` (``runs.run_status``), the age of its last
        record and, for a failed run, the failed write (``runs.write_failure``) if that is why."""
        config, found = self.config, []
        hold = config.clear_after_windows
        if config.nonfinite_loss and self._nonfinite is not None and self._finite < hold:
            found.append(Condition("nonfinite_loss", f"train loss was NaN or infinite at step {self._nonfinite}",
                                   self._nonfinite))  # fmt: skip
        if self._spike is not None and self._quiet < hold:
            found.append(self._spike)
        for key, above in (("skipped_updates", config.skipped_fraction_above),
                           ("clipped_fraction", config.clipped_fraction_above)):  # fmt: skip
            last = self._last.get(key)
            if above is not None and last is not None and last[0] > above:
                what = "attempts skipped" if key == "skipped_updates" else "updates clipped"
                found.append(Condition(key, f"{last[0]:.0%} of the window's {what} at step {last[1]} "
                                       f"(threshold {above:.0%})", last[1]))  # fmt: skip
        for threshold in config.thresholds:
            last = self._last.get(threshold.name)
            if last is not None and ((threshold.above is not None and last[0] > threshold.above)
                                     or (threshold.below is not None and last[0] < threshold.below)):  # fmt: skip
                found.append(Condition(threshold.name, f"{threshold.key} is {last[0]:.6g} at step {last[1]}", last[1]))
        if status in config.statuses:
            found.append(Condition(status, self._status_message(status, age_s, failure)))
        return found

    def _status_message(self, status: str, age_s: float | None, failure: str | None) -> str:
        age = "" if age_s is None else f"; last record {_duration(age_s)} ago"
        if status == "stalled":
            return f"no new record while its writer still holds the file (hung job or collective){age}"
        if status == "crashed":
            return f"its writer is gone without a session_end (killed, out of memory, node lost){age}"
        if status == "failed":
            reason = failure or self._end_error
            return f"the session ended failed: {reason}" if reason else "the session ended failed"
        return f"the session was {status}{age}"


def _skipped_fraction(record: Mapping[str, Any]) -> float | None:
    attempted, skipped = number(record.get("attempted_updates")), number(record.get("skipped_updates_in_window"))
    return skipped / attempted if attempted and skipped is not None else None


def _names_loss(keys: Any) -> bool:
    """Whether a ``nonfinite_keys`` list (``logging_bridge``) names the train loss."""
    return isinstance(keys, str) and not {"loss", "train_loss"}.isdisjoint(keys.split(","))


def _duration(seconds: float) -> str:
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.0f} s"


# -- one run, followed -------------------------------------------------------------------------


class RunFeed(FollowedLog):
    """One run's file followed for the rules: the read layers up to ``SessionLog`` (what
    ``run_status`` reads) and a ``RunRules``, nothing per record (unlike ``digest.RunDigest``,
    which keeps each record's step for replay accounting the rules do not need)."""

    def __init__(self, path: Path, config: AlertConfig, *, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self.path = path
        self.file = LocalFile(path)
        self._follower = LineFollower(self.file, max_record_bytes=max_record_bytes)
        self.config = config
        self.log = SessionLog()
        self.rules = RunRules(config)

    def refresh(self) -> tuple[int, int]:
        """Read what was appended since the last call: (bytes read, records)."""
        start, records = self._follower.offset, 0
        for batch in batches(self._follower):
            if batch.reset is not None:  # rewritten or replaced: everything is read again
                start, records = 0, 0
                self.log, self.rules = SessionLog(), RunRules(self.config)
            self.log.add(batch.records)
            self.rules.add(batch.records)
            records += len(batch.records)
        return self._follower.offset - start, records

    @property
    def read_identity(self) -> tuple[int, ...] | None:
        return self._follower.read_identity

    def close(self) -> None:
        self._follower.close()


# -- the evaluator of a root ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Alert:
    """A condition of a run that started (``firing``) or stopped (``cleared``) holding."""

    run: str
    condition: str
    state: str  # "firing" | "cleared"
    message: str
    time: datetime
    step: int | None = None

    def line(self) -> str:
        """One plain terminal line; run-file text cleaned."""
        return clean(f"{self.time:%Y-%m-%d %H:%M:%S}Z  {self.state:<7}  {self.run}  {self.condition}: {self.message}")


@dataclass(slots=True)
class _Run:
    path: Path  # its metrics file
    feed: RunFeed | None = None  # None: not read yet, or settled and let go (``stamp`` says as of when)
    stamp: tuple[int, ...] | None = None
    active: dict[str, Alert] = field(default_factory=dict)


class AlertEvaluator:
    """Every run under ``root``, evaluated incrementally; see the module docstring.  Thread-safe:
    a server's pages may read ``firing``/``recent`` while its alert thread evaluates, and are not
    held up by a pass (a first pass over a big root takes as long as reading it): each run's
    alerts are published as its evaluation ends."""

    def __init__(self, root: str | Path, config: AlertConfig | None = None, *, rediscover_s: float = REDISCOVER_S,
                 clock: Callable[[], float] = time.monotonic,
                 firing: Mapping[str, Iterable[str]] | None = None) -> None:  # fmt: skip
        """``rediscover_s``: how often the root is walked for runs that appeared or went (the walk,
        a ``scandir`` per directory, is most of an idle pass over a big root).  ``firing``: per
        run, the conditions an earlier process already alerted on (``alerts --state``): they
        count as firing, and alert again only after they have cleared."""
        self.root = Path(root)
        self.config = config or AlertConfig()
        self.rediscover_s = rediscover_s
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
                    found = self._conditions(run, now)
                except Exception:  # one unreadable run must not stop the alerts of the others
                    _log.warning("alerts: run %r could not be read", name, exc_info=True)
                    self.stats["errors"] += 1
                    if run.feed is not None:
                        run.feed.close()
                    run.feed = run.stamp = None
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
        infos = find_runs(self.root)
        self._found_at = self._clock()
        self.stats["walks"] += 1
        names = {info.name: info for info in infos}
        alerts = []
        for name in [name for name in self._runs if name not in names]:
            run = self._runs.pop(name)
            if run.feed is not None:
                run.feed.close()
            alerts += self._publish(name, None, [Alert(name, key, "cleared", "the run is gone", now)
                                                 for key in run.active])  # fmt: skip
        for name, info in names.items():
            if name not in self._runs:
                run = self._runs[name] = _Run(info.metrics_path)
                for key in self._earlier.pop(name, ()):
                    run.active[key] = Alert(name, key, "firing", "alerted on by an earlier alerter", now)
                if run.active:
                    with self._lock:
                        self._firing[name] = tuple(run.active.values())
        return alerts

    def _conditions(self, run: _Run, now: datetime) -> tuple[list[Condition], float | None] | None:
        """What holds for the run now and the age of its last record; None when it is settled
        and its file unchanged or gone for now (its active conditions stand).  Cost: one
        ``stat`` when nothing was appended; else the appended bytes."""
        if run.feed is None:
            if run.stamp is not None:
                stat = LocalFile(run.path).stat()
                if stat is None or stat.identity == run.stamp:
                    return None
            run.feed, run.stamp = RunFeed(run.path, self.config), None
            self.stats["runs_read"] += 1
        feed = run.feed
        read, records = feed.refresh()
        self.stats["bytes_read"] += read
        self.stats["records"] += records
        status = run_status(feed, now=now)
        last = feed.last_record_time
        age = None if last is None else (now - last).total_seconds()
        failure = write_failure(feed) if status == "failed" else None
        found = feed.rules.conditions(status, age_s=age, failure=None if failure is None else failure.error)
        if status in SETTLED:
            run.stamp, run.feed = feed.read_identity, None
            feed.close()
        return found, age

    def _transitions(self, name: str, run: _Run, found: list[Condition], age: float | None,
                     now: datetime) -> list[Alert]:  # fmt: skip
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
        """The alerts firing now, per run (for the overview and a run's page)."""
        with self._lock:
            return {name: list(alerts) for name, alerts in self._firing.items()}

    def recent(self) -> list[Alert]:
        """The last ``RECENT_ALERTS`` firing and cleared alerts, oldest first."""
        with self._lock:
            return list(self._recent)

    def close(self) -> None:
        with self._pass:
            for run in self._runs.values():
                if run.feed is not None:
                    run.feed.close()
                run.feed = None


# -- webhook delivery ----------------------------------------------------------------------------

_DISCORD_HOSTS = ("discord.com", "discordapp.com", "ptb.discord.com", "canary.discord.com")
_DISCORD_MARKUP = str.maketrans({char: "\\" + char for char in "\\*_~`|>#[]()<"})
_SLACK_MARKUP = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def webhook_kind(url: str) -> str:
    """``slack``, ``discord`` or ``json``: the body a webhook URL gets, chosen by its host.
    AlertConfigError for a URL that is not http(s)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AlertConfigError(f"webhook {_redacted(url)!r}: expected an http:// or https:// URL")
    host = parts.hostname.lower()
    if host == "hooks.slack.com":
        return "slack"
    if host in _DISCORD_HOSTS and parts.path.startswith("/api/webhooks/"):
        return "discord"
    return "json"


def _redacted(url: str) -> str:
    """A webhook URL without its path or user info: the path of a Slack or Discord URL is its secret."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ":?"
    return f"{parts.scheme}://{parts.hostname or ''}{port}/…" if parts.scheme else "(not a URL)"


def _utf8(text: str) -> str:
    """``text`` encodable as UTF-8: a directory name the OS gave with undecodable bytes holds lone
    surrogates, which JSON cannot carry; they become their ``\\udcxx`` spelling."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def webhook_body(url: str, alert: Alert, *, root: str) -> bytes:
    """The POST body for ``alert``: ``{"text"}`` for Slack, ``{"content", "allowed_mentions"}``
    for Discord, else the generic JSON object (docs/FORMAT.md, "Alert webhooks")."""
    kind = webhook_kind(url)
    if kind == "json":
        return orjson.dumps({
            "source": "metrics_core", "state": alert.state, "run": _utf8(alert.run), "root": _utf8(root),
            "condition": _utf8(alert.condition), "message": _utf8(alert.message), "step": alert.step,
            "time": alert.time.isoformat().replace("+00:00", "Z"),
        })  # fmt: skip
    verb = "" if alert.state == "firing" else "cleared: "
    text = clean(_utf8(f"{verb}run {alert.run}: {alert.condition}: {alert.message} (runs root {root})"))
    if kind == "slack":
        return orjson.dumps({"text": fit(text, 3000).translate(_SLACK_MARKUP)})
    return orjson.dumps({"content": fit(text, 1000).translate(_DISCORD_MARKUP), "allowed_mentions": {"parse": []}})


class Delivery:
    """A FIFO of alerts for one webhook, each posted until the receiver takes it; see the module
    docstring.  ``pump`` never sleeps: it sends what is due and says when to call it again."""

    def __init__(
        self, url: str, *, root: str, timeout_s: float = 10.0, backoff_s: float = 1.0, max_backoff_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic, report: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        webhook_kind(url)
        self.url, self.root = url, root
        self.timeout_s, self.backoff_s, self.max_backoff_s = timeout_s, backoff_s, max_backoff_s
        self.clock = clock
        self.report = report or _log.warning
        self._queue: deque[Alert] = deque()
        self._due = float("-inf")
        self._wait = backoff_s
        self.stats = {"sent": 0, "failed_attempts": 0, "rejected": 0, "dropped": 0}

    def put(self, alert: Alert) -> None:
        if len(self._queue) >= MAX_QUEUE:
            dropped = self._queue.popleft()
            self.stats["dropped"] += 1
            self.report(f"alerts: {MAX_QUEUE:,} alerts undelivered; dropped the oldest, for {dropped.run!r}")
        self._queue.append(alert)

    @property
    def pending(self) -> int:
        return len(self._queue)

    def queued(self) -> list[Alert]:
        """The alerts not delivered yet, oldest first."""
        return list(self._queue)

    def pump(self) -> float | None:
        """Post the due alerts in order; return the seconds until the next attempt is due, or
        None when nothing is left to send."""
        while self._queue and self.clock() >= self._due:
            alert = self._queue[0]
            failure, retry_after = self._post(alert)
            if failure is None:
                self._queue.popleft()
                self.stats["sent"] += 1
                self._wait = self.backoff_s
            elif retry_after is None:  # refused for good: retrying would be refused again
                self._queue.popleft()
                self.stats["rejected"] += 1
                self.report(f"alerts: {_redacted(self.url)} refused the alert for {alert.run!r}, dropped: {failure}")
            else:
                self.stats["failed_attempts"] += 1
                wait = max(self._wait, retry_after)
                self._due = self.clock() + wait
                self._wait = min(self._wait * 2, self.max_backoff_s)
                self.report(f"alerts: {_redacted(self.url)} unreachable ({failure}); {self.pending} alert(s) "
                            f"queued, next try in {_duration(wait)}")  # fmt: skip
        return None if not self._queue else max(self._due - self.clock(), 0.0)

    def _post(self, alert: Alert) -> tuple[str | None, float | None]:
        """(None, None) when delivered; else why, and 0 or the receiver's Retry-After when a retry
        may succeed, None when it cannot."""
        # Imported here: http.client and its email parsers would add to every ``tail`` and ``summary``.
        import http.client
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            self.url, data=webhook_body(self.url, alert, root=self.root), method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "metrics-core-alerts"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read(1 << 16)  # the status is the answer; a body that never ends must not hold us
            return None, None
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code}"
            if exc.code >= 500 or exc.code in (408, 429):
                return reason, _retry_after(exc.headers.get("Retry-After"))
            return reason, None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, timeout, DNS, a bad reply
            return clean(str(getattr(exc, "reason", exc)))[:200] or type(exc).__name__, 0.0


def _retry_after(value: str | None) -> float:
    """A Retry-After header in seconds (its date form is not honoured: 0)."""
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return min(seconds, 3600.0) if math.isfinite(seconds) and seconds > 0 else 0.0


# -- the alerter: evaluation and delivery, headless or in a server --------------------------------


class Alerter:
    """An ``AlertEvaluator`` and, with a webhook, its ``Delivery``: ``tick`` is one pass and the
    due deliveries, ``run`` repeats it until ``stop`` is set.  A dashboard server runs one per
    root in a thread and shows ``evaluator.firing()`` and ``evaluator.recent()``."""

    def __init__(self, root: str | Path, config: AlertConfig | None = None, *, webhook: str | None = None,
                 report: Callable[[str], None] | None = None,
                 firing: Mapping[str, Iterable[str]] | None = None) -> None:  # fmt: skip
        self.config = config or AlertConfig()
        self.evaluator = AlertEvaluator(root, self.config, firing=firing)
        url = webhook or self.config.webhook
        self.delivery = None if url is None else Delivery(url, root=str(root), report=report)

    def tick(self, *, now: datetime | None = None) -> list[Alert]:
        """One pass; firing alerts (and cleared ones with ``notify_cleared``) are queued and the
        due ones posted.  Returns the pass's alerts."""
        alerts = self.evaluator.evaluate(now=now or datetime.now(timezone.utc))
        if self.delivery is not None:
            for alert in alerts:
                if alert.state == "firing" or self.config.notify_cleared:
                    self.delivery.put(alert)
            self.delivery.pump()
        return alerts

    def run(self, *, interval: float, stop: threading.Event, on_alert: Callable[[Alert], None]) -> None:
        """``tick`` every ``interval`` seconds until ``stop`` is set, retrying deliveries between."""
        while not stop.is_set():
            deadline = time.monotonic() + interval
            for alert in self.tick():
                on_alert(alert)
            while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                due = self.delivery.pump() if self.delivery is not None else None
                stop.wait(left if due is None else min(left, max(due, 0.05)))

    def drain(self, *, within: float) -> bool:
        """Retry the queued deliveries for up to ``within`` seconds; True when none is left."""
        deadline = time.monotonic() + within
        while self.delivery is not None and (due := self.delivery.pump()) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, max(due, 0.05)))
        return True

    def close(self) -> None:
        self.evaluator.close()


# -- the command -----------------------------------------------------------------------------------


def add_command(commands: argparse._SubParsersAction) -> None:
    """``alerts ROOT --webhook URL [--config FILE] [--interval S] [--once]`` on ``cli``'s parser."""
    command = commands.add_parser("alerts", help="watch a runs root and post alerts to a webhook (NaN loss, "
                                  "loss spike, stalled, crashed, failed, thresholds)")  # fmt: skip
    command.add_argument("root", help="the runs root: every directory under it holding a metrics.jsonl")
    command.add_argument("--webhook", help="URL to POST alerts to (Slack and Discord URLs get their bodies); "
                         "else the config's webhook; without either, alerts are only printed")  # fmt: skip
    command.add_argument("--config", help="a TOML file of rules (README, 'Alerts')")
    command.add_argument("--interval", type=float, default=10.0, help="seconds between passes (default 10)")
    once = f"one pass, then deliver (retrying for up to {ONCE_DELIVERY_S:.0f} s) and exit"
    command.add_argument("--once", action="store_true", help=once)
    state = (
        "a JSON file of what was alerted on, read at start and kept up to date: with --once from cron, a "
        "condition is posted once, not once per call"
    )
    command.add_argument("--state", help=state)


def load_state(path: Path) -> dict[str, list[str]]:
    """The conditions alerted on per run, as ``save_state`` left them ({} when there is no file)."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        raise AlertConfigError(f"{path}: cannot read the alerts state ({exc})") from exc
    firing = data.get("firing") if isinstance(data, dict) else None
    if not (isinstance(firing, dict) and all(isinstance(v, list) and all(isinstance(c, str) for c in v)
                                             for v in firing.values())):  # fmt: skip
        raise AlertConfigError(f'{path}: not an alerts state file (expected {{"firing": {{run: [condition, ...]}}}})')
    return firing


def save_state(path: Path, alerter: Alerter) -> None:
    """What is firing and was delivered (an undelivered alert is posted again by the next call),
    written whole or not at all (a temporary file renamed over the old one)."""
    undelivered = {(a.run, a.condition) for a in alerter.delivery.queued()} if alerter.delivery else set()
    firing = {_utf8(name): [a.condition for a in alerts if (name, a.condition) not in undelivered]
              for name, alerts in alerter.evaluator.firing().items()}  # fmt: skip
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(orjson.dumps({"firing": firing}))
    os.replace(temporary, path)


def command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run ``alerts``: 0 when done (or Ctrl-C), 1 when ``--once`` could not deliver everything,
    2 for a bad root, config or webhook."""

    def report(message: str) -> None:
        err.write(clean(message) + "\n")
        err.flush()

    def show(alert: Alert) -> None:
        out.write(alert.line() + "\n")
        out.flush()

    try:
        if not (math.isfinite(args.interval) and args.interval > 0):
            raise AlertConfigError(f"--interval {args.interval!r}: expected a positive number of seconds")
        config = load_config(args.config) if args.config else AlertConfig()
        state = Path(args.state) if args.state else None
        firing = load_state(state) if state is not None else None
        alerter = Alerter(args.root, config, webhook=args.webhook, report=report, firing=firing)
        find_runs(args.root)  # a root that is not there is an error now, not at the first pass

        def save() -> None:
            if state is not None:
                save_state(state, alerter)

        try:
            if args.once:
                for alert in alerter.tick():
                    show(alert)
                delivered = alerter.drain(within=ONCE_DELIVERY_S)
                save()
                if delivered:
                    return 0
                report(f"alerts: {alerter.delivery.pending} alert(s) not delivered")
                return 1
            alerter.run(interval=args.interval, stop=threading.Event(), on_alert=lambda alert: (show(alert), save()))
        finally:
            alerter.close()
    except MetricsError as exc:
        report(f"error: {exc}")
        return 2
    except (KeyboardInterrupt, BrokenPipeError):  # Ctrl-C; or `| head` went away
        return 0
    return 0
