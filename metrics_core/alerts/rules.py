"""Alert rules: when a condition holds for a run, from its records and status; and their
configuration (``AlertConfig``, read from TOML by ``load_config``).  No file, clock or network
here: ``evaluator.AlertEvaluator`` feeds the rules and says when a condition starts and stops holding.

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
  runs page shows; ``interrupted`` (a preemption) only when listed.
* ``skipped_updates`` / ``clipped_fraction`` — the last window's skipped attempts over its
  attempts, or its clipped fraction, above a threshold; a session's first window is not judged
  (FP16 loss scaling skips steps while it calibrates).  Clipping is off by default: many recipes
  clip most updates early on, and an alert that fires on healthy runs is noise.
* ``threshold`` — any logged number crossing ``above`` / ``below`` (the last value logged).

Each kind that reads train records is declared in ``TRAIN_KINDS`` (``TrainKind``): the fields it
reads (``RunRules.fields`` reads those alone) and what it needs of a long past (``lookback``), so a
feed that skips train records (the dashboard's, ``needed_rows``) skips only what every kind
declared it never needs; a kind that declares nothing is fed every record.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrics_core.alerts.webhooks import webhook_kind
from metrics_core.errors import AlertConfigError
from metrics_core.read.session_model import number
from metrics_core.text import duration

ALERT_STATUSES = ("stalled", "crashed", "failed", "interrupted")


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


@dataclass(frozen=True, slots=True)
class TrainKind:
    """A rule kind that reads ``train`` records: its condition's name, the fields it reads, and what
    it needs of the train records before the last ``RunRules.memory`` finite-loss windows.

    ``lookback``: "windows" — none of them: it looks back ``windows(config)`` finite-loss windows
    at most (``RunRules.memory`` is the longest); "last" — the last record that set its value (a
    finite number), with the record before it, whose session says whether that one was judged
    (``judged``: a session's first window sets nothing); "all" — every record, what a kind that
    declares no lookback gets."""

    name: str
    fields: tuple[str, ...]
    lookback: str = "all"
    windows: Callable[[AlertConfig], int] | None = None
    judged: bool = False


TRAIN_KINDS = (
    TrainKind(
        "nonfinite_loss",
        ("nonfinite_loss", "nonfinite_keys", "train_loss"),
        "windows",
        lambda config: config.clear_after_windows,
    ),
    TrainKind(
        "loss_spike", ("train_loss",), "windows", lambda config: config.spike_windows + config.clear_after_windows
    ),
    TrainKind("skipped_updates", ("attempted_updates", "skipped_updates_in_window"), "last", judged=True),
    TrainKind("clipped_fraction", ("clipped_fraction",), "last", judged=True),
)
# What ``RunRules.add`` reads of a record besides thresholds' keys, per event (``RunRules.fields``).
_READ = {
    "train": tuple(dict.fromkeys(("step", "session_id", *(f for kind in TRAIN_KINDS for f in kind.fields)))),
    "session_end": ("error",),
}


_TOML_TYPES: dict[str, tuple[type, ...]] = {
    "statuses": (list,),
    "nonfinite_loss": (bool,),
    "spike_z": (int, float),
    "spike_windows": (int,),
    "spike_min_windows": (int,),
    "clear_after_windows": (int,),
    "skipped_fraction_above": (int, float),
    "clipped_fraction_above": (int, float),
    "threshold": (list,),
    "ignore_after_h": (int, float),
    "notify_cleared": (bool,),
    "webhook": (str,),
}
_THRESHOLD_TYPES: dict[str, tuple[type, ...]] = {
    "key": (str,),
    "event": (str,),
    "above": (int, float),
    "below": (int, float),
}


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
    numbers = {
        "spike_z": config.spike_z,
        "ignore_after_h": config.ignore_after_h,
        "skipped_fraction_above": config.skipped_fraction_above,
        "clipped_fraction_above": config.clipped_fraction_above,
    }
    for key, value in numbers.items():
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise AlertConfigError(f"{path}: {key} is {value!r}: expected a finite number >= 0")
    if not 2 <= config.spike_min_windows <= config.spike_windows:
        raise AlertConfigError(
            f"{path}: expected 2 <= spike_min_windows <= spike_windows, got "
            f"{config.spike_min_windows} and {config.spike_windows}"
        )
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
    same (``tests/unit/test_alerts.py`` checks it against a from-scratch oracle).
    """

    def __init__(self, config: AlertConfig) -> None:
        self.config = config
        # Made by the first finite loss: a server follows every run of its root, and most it never
        # feeds (settled, past the horizon), so an unfed window must cost nothing.
        self._losses: _Window | None = None
        self._nonfinite: int | None = None  # step of the last window whose loss was not finite
        self._spike: Condition | None = None
        self._finite = 0  # windows with a finite loss since the last non-finite one
        self._quiet = 0  # windows with a finite loss and no spike since the last spike
        self._last: dict[str, tuple[float, int]] = {}  # a fraction or threshold name -> (last value, step)
        self._end_error: str | None = None
        self._session: str | None = None  # of the last train window

    def fields(self, event: str) -> tuple[str, ...]:
        """The fields of ``event`` records that ``add`` reads (none: it needs no record of that
        event): a feed from a reader's columns builds records of these alone."""
        keys = [*_READ.get(event, ()), *(t.key for t in self.config.thresholds if t.event in (None, event))]
        return tuple(dict.fromkeys(["event", "step", *keys])) if keys else ()

    @property
    def memory(self) -> int:
        """Finite-loss train windows that decide what the rules say, now and after any later record:
        the longest lookback of a "windows" kind (``TRAIN_KINDS``).  Of the train records before
        the last ``memory`` of them, the rules need what each kind's ``lookback`` says (a
        threshold: the last record setting it); fed those, in file order, then the last ``memory``
        windows, the rules say what all of them would have said (``needed_rows`` feeds a long past
        so)."""
        return max(kind.windows(self.config) for kind in TRAIN_KINDS if kind.windows is not None)

    @property
    def across_events(self) -> bool:
        """Whether records of different events must come in file order (a threshold on any event:
        its last value is the last logged), not only each event's in its own order."""
        return any(threshold.event is None for threshold in self.config.thresholds)

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
            fractions = (
                ("clipped_fraction", number(record.get("clipped_fraction"))),
                ("skipped_updates", _skipped_fraction(record)),
            )
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
        window = self._losses = self._losses or _Window(self.config.spike_windows)
        if self.config.spike_z and len(window.values) >= self.config.spike_min_windows:
            z, mean = window.z(loss)
            if z > self.config.spike_z:
                self._spike = Condition(
                    "loss_spike",
                    f"train loss {loss:.4g} at step {step} is {z:.1f} standard "
                    f"deviations above the mean {mean:.4g} of the last "
                    f"{len(window.values)} windows",
                    step,
                )
                self._quiet = -1
        self._quiet += 1
        window.add(loss)

    def conditions(self, status: str, *, age_s: float | None = None, failure: str | None = None) -> list[Condition]:
        """What holds now, given the run's ``status`` (``runs.run_status``), the age of its last
        record and, for a failed run, the failed write (``runs.write_failure``) if that is why."""
        config, found = self.config, []
        hold = config.clear_after_windows
        if config.nonfinite_loss and self._nonfinite is not None and self._finite < hold:
            found.append(
                Condition(
                    "nonfinite_loss", f"train loss was NaN or infinite at step {self._nonfinite}", self._nonfinite
                )
            )
        if self._spike is not None and self._quiet < hold:
            found.append(self._spike)
        for key, above in (
            ("skipped_updates", config.skipped_fraction_above),
            ("clipped_fraction", config.clipped_fraction_above),
        ):
            last = self._last.get(key)
            if above is not None and last is not None and last[0] > above:
                what = "attempts skipped" if key == "skipped_updates" else "updates clipped"
                found.append(
                    Condition(
                        key, f"{last[0]:.0%} of the window's {what} at step {last[1]} (threshold {above:.0%})", last[1]
                    )
                )
        for threshold in config.thresholds:
            last = self._last.get(threshold.name)
            if last is not None and (
                (threshold.above is not None and last[0] > threshold.above)
                or (threshold.below is not None and last[0] < threshold.below)
            ):
                found.append(Condition(threshold.name, f"{threshold.key} is {last[0]:.6g} at step {last[1]}", last[1]))
        if status in config.statuses:
            found.append(Condition(status, self._status_message(status, age_s, failure)))
        return found

    def _status_message(self, status: str, age_s: float | None, failure: str | None) -> str:
        age = "" if age_s is None else f"; last record {duration(age_s)} ago"
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
