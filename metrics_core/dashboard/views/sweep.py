"""A sweep as the runs table and the sweep page show it: which config keys were swept, each run's
value of a metric (its last, or its best), and which runs a range chosen on a swept key keeps.
Pure functions of the store's runs table (each row's flattened ``config`` and its ``metrics``, the
last, least and greatest value of every metric it logs: ``store.rows.MetricTails``), so a sweep of
a thousand runs costs O(runs × keys) and reads no run again.

Best is the least value for every metric but those whose name says higher is better
(``HIGHER_IS_BETTER``: accuracy, F1, AUC, BLEU, reward, throughput…); a page may choose either.

A swept key is an axis: numeric when every run's value reads as a number (logarithmic when they
are all positive and span a factor of ``LOG_SPAN`` or more, or ``RATE_LOG_SPAN`` for a key whose
name says rate, as learning rates do; whole numbers, a seed, on whole ticks), else categorical,
its values as tick labels at positions 0, 1, 2…  A range on an axis is in data units: the values
themselves on a numeric axis, positions on a categorical one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from metrics_core.dashboard.display_text import CELL_CHARS, shorten
from metrics_core.dashboard.views.config_tables import NOT_SET, swept_keys

HIGHER_IS_BETTER = re.compile(
    r"acc|accuracy|auc|f1|bleu|rouge|score|precision|recall|reward|mfu|tokens_per_s|throughput", re.IGNORECASE
)
FIRST_METRICS = ("train_loss", "val_loss")  # offered first: what a sweep is usually judged by
VALUES = ("last", "best")
LOG_SPAN = 10.0
RATE_LOG_SPAN = 2.0  # a rate (lr 0.02 and 0.1) is searched by factors, so drawn on a log axis sooner
RATE_NAME = re.compile(r"(?<![a-z])lr(?![a-z])|rate", re.IGNORECASE)  # lr, peak_lr, optim.lr, learning_rate…
MAX_AXES = 24  # swept keys charted: runs whose configs differ in 2,000 keys must not make 2,000 charts


def best_is_max(metric: str) -> bool:
    """Whether the best value of ``metric`` is its greatest (``HIGHER_IS_BETTER``), else its least."""
    return bool(HIGHER_IS_BETTER.search(metric))


def metric_value(tails: object, metric: str, *, value: str = "last", best_max: bool = False) -> float | None:
    """A run's ``value`` ("last" or "best") of ``metric`` from its row's ``metrics`` (``tails``), or
    None where the run logged no finite value of it (or its row has none: not read yet)."""
    tail = tails.get(metric) if isinstance(tails, Mapping) else None
    if tail is None:
        return None
    return tail[0] if value == "last" else tail[2] if best_max else tail[1]


def metric_keys(tails: Iterable[object]) -> list[str]:
    """Every metric any of the runs logged: ``FIRST_METRICS`` first, then the rest sorted."""
    keys: set[str] = set()
    for found in tails:
        if isinstance(found, Mapping):
            keys.update(found)
    return [key for key in FIRST_METRICS if key in keys] + sorted(keys - set(FIRST_METRICS))


# The runs table's own columns of these metrics' last values (``store.rows``): a metric picked
# is named as they are, and its last value is not shown twice.
SHOWN_LAST = {"train_loss": "train loss", "val_loss": "val loss"}


def with_metric_columns(
    table: pd.DataFrame, tails: Mapping[str, object], metric: str, *, best_max: bool
) -> pd.DataFrame:
    """The runs table with ``metric``'s last and best value per run (``tails``: run -> its row's
    ``metrics``), as numbers; columns named after the metric (as the table names a loss it
    already shows, whose last value it then keeps in its own column) and the rule."""
    runs = table["run"].tolist()  # a list: iterating a string column is slow
    name = SHOWN_LAST.get(metric) or shorten(metric, CELL_CHARS)
    columns = {}
    if name not in table.columns:
        last = [metric_value(tails.get(run), metric) for run in runs]
        columns[f"{name} last"] = pd.Series(last, index=table.index, dtype="float64")
    best = [metric_value(tails.get(run), metric, value="best", best_max=best_max) for run in runs]
    columns[f"{name} best ({'max' if best_max else 'min'})"] = pd.Series(best, index=table.index, dtype="float64")
    return table.assign(**columns)


@dataclass(frozen=True, slots=True)
class SweepAxis:
    """One swept key: each run's position on it (None: the run lacks a number there, numeric axes
    only), and for a categorical key its values in order, labelled at positions 0, 1, 2…"""

    key: str
    positions: tuple[float | None, ...]
    labels: tuple[str, ...] = ()  # categorical: the values at positions 0, 1, 2…; numeric: ()
    log: bool = False
    integer: bool = False  # numeric, every value a whole number (a seed, a layer count)

    @property
    def categorical(self) -> bool:
        return bool(self.labels)

    def data_range(self, xrange: Sequence[float]) -> tuple[float, float]:
        """The x-range a chart reports (log10 units on a logarithmic axis) in data units, ordered."""
        low, high = sorted(float(v) for v in xrange)
        return (10.0**low, 10.0**high) if self.log else (low, high)

    def within(self, low: float, high: float) -> list[bool]:
        """Per run, whether its position lies in [``low``, ``high``] (a run without one does not)."""
        return [position is not None and low <= position <= high for position in self.positions]


def _number(text: str | None) -> float | None:
    try:
        number = float(text) if text is not None else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None


def sweep_axis(key: str, values: Sequence[str | None]) -> SweepAxis:
    """``key``'s axis from each run's value of it (None: the run lacks it)."""
    numbers = [_number(value) for value in values]
    if all(number is not None for number in numbers):
        positive = min(numbers) > 0  # type: ignore[type-var]
        span = LOG_SPAN if RATE_NAME.search(key) is None else RATE_LOG_SPAN
        log = positive and max(numbers) / min(numbers) >= span  # type: ignore[type-var, operator]
        integer = not log and all(number.is_integer() for number in numbers)  # type: ignore[union-attr]
        return SweepAxis(key, tuple(numbers), log=log, integer=integer)
    texts = [NOT_SET if value is None else value for value in values]
    labels = sorted(set(texts), key=lambda text: (text == NOT_SET, _number(text) is None, _number(text) or 0, text))
    at = {label: float(index) for index, label in enumerate(labels)}
    return SweepAxis(key, tuple(at[text] for text in texts), labels=tuple(labels))


@dataclass(frozen=True, slots=True)
class Sweep:
    """Runs, their swept keys as axes, and each run's value of one metric (None: none logged)."""

    runs: tuple[str, ...]
    axes: tuple[SweepAxis, ...]
    values: tuple[float | None, ...]
    metric: str
    value: str  # "last" or "best"
    best_max: bool
    uncharted: int = 0  # swept keys beyond ``MAX_AXES``, not axes

    def chosen(self, ranges: Mapping[str, tuple[float, float]]) -> list[bool]:
        """Per run, whether it lies within every range (swept key -> data-unit range) chosen."""
        keep = [True] * len(self.runs)
        for axis in self.axes:
            if axis.key in ranges:
                keep = [a and b for a, b in zip(keep, axis.within(*ranges[axis.key]), strict=True)]
        return keep


def sweep_of(
    configs: Mapping[str, Mapping[str, str] | None],
    tails: Mapping[str, object],
    *,
    metric: str,
    value: str = "last",
    best_max: bool | None = None,
) -> Sweep:
    """The sweep of the runs of ``configs`` (run -> flattened config): every swept key an axis (keys
    all runs share are left out), each run's ``value`` of ``metric`` (``best_max`` None: the rule of
    ``best_is_max``), the first ``MAX_AXES`` swept keys only.  Runs without a config (not read yet,
    unreadable) are left out."""
    runs = tuple(run for run, config in configs.items() if isinstance(config, Mapping) and config)
    best_max = best_is_max(metric) if best_max is None else best_max
    swept = swept_keys(configs.values())
    axes = tuple(sweep_axis(key, [configs[run].get(key) for run in runs]) for key in swept[:MAX_AXES])
    values = tuple(metric_value(tails.get(run), metric, value=value, best_max=best_max) for run in runs)
    return Sweep(runs, axes, values, metric, value, best_max, uncharted=max(0, len(swept) - MAX_AXES))


def sweep_table(sweep: Sweep, configs: Mapping[str, Mapping[str, str] | None], chosen: Sequence[bool]) -> pd.DataFrame:
    """The chosen runs as the sweep page lists them, best first: the run, its swept keys (text,
    shortened) and its value of the metric."""
    rows = [
        {
            "run": run,
            **{
                shorten(axis.key, CELL_CHARS): shorten(configs[run].get(axis.key, NOT_SET), CELL_CHARS)
                for axis in sweep.axes
            },
            f"{shorten(sweep.metric, CELL_CHARS)} {sweep.value}": value,
        }
        for run, value, keep in zip(sweep.runs, sweep.values, chosen, strict=True)
        if keep
    ]
    table = pd.DataFrame(
        rows,
        columns=[
            "run",
            *(shorten(a.key, CELL_CHARS) for a in sweep.axes),
            f"{shorten(sweep.metric, CELL_CHARS)} {sweep.value}",
        ],
    )
    return table.sort_values(
        table.columns[-1], ascending=not sweep.best_max, na_position="last", kind="stable"
    ).reset_index(drop=True)


# -- the sweep page's inputs, ranges and URL -----------------------------------------------------------


def sweep_inputs(table: pd.DataFrame, runs: Sequence[str]) -> tuple[dict[str, object], dict[str, object]]:
    """Each run's config and metrics from the store's runs table: of ``runs`` (those the table has),
    or of every run when ``runs`` is empty; None where a row has none (not read yet).  Comparable
    from one refresh to the next: equal exactly when the sweep drawn from them would be."""
    rows = table.drop_duplicates("run").set_index("run")
    names = [name for name in runs if name in rows.index] if runs else rows.index.tolist()
    configs = rows["config"].reindex(names).tolist()
    tails = rows["metrics"].reindex(names).tolist()
    as_dict = lambda value: value if isinstance(value, Mapping) else None  # noqa: E731  (NaN: no row value)
    return {n: as_dict(c) for n, c in zip(names, configs, strict=True)}, {
        n: as_dict(t) for n, t in zip(names, tails, strict=True)
    }


def chosen_ranges(
    sweep: Sweep,
    zooms: Mapping[str, Sequence[float] | None],
    asked: Mapping[str, tuple[float, float]],
    chart_key: Callable[[SweepAxis], str],
) -> dict[str, tuple[float, float]]:
    """The data-unit range chosen on each swept key: the x-range its chart was zoomed to in this
    session (``zooms``, by ``chart_key``; None: zoomed back out, no range), else the URL's
    (``asked``)."""
    ranges = {}
    for axis in sweep.axes:
        key = chart_key(axis)
        if key in zooms:
            if zooms[key] is not None:
                ranges[axis.key] = axis.data_range(zooms[key])
        elif axis.key in asked:
            ranges[axis.key] = asked[axis.key]
    return ranges


def sweep_query(runs: Sequence[str], sweep: Sweep, ranges: Mapping[str, tuple[float, float]]) -> dict[str, list[str]]:
    """The sweep page's URL parameters for what it shows (``runs``: those asked for, none for all)."""
    query = {"run": list(runs)} if runs else {}
    return query | {
        "metric": [sweep.metric],
        "value": [sweep.value],
        "best": ["max" if sweep.best_max else "min"],
        "range": [range_text(key, bounds) for key, bounds in ranges.items()],
    }


def parse_range(text: str) -> tuple[str, tuple[float, float]] | None:
    """``key:low:high`` (a ``range=`` of the sweep page's URL; the key may hold colons) as the key and
    its data-unit range, or None when it does not read so."""
    key, _, bounds = text.rpartition(":")
    key, _, low = key.rpartition(":")
    numbers = (_number(low), _number(bounds))
    if not key or None in numbers:
        return None
    return key, tuple(sorted(numbers))  # type: ignore[return-value]


def range_text(key: str, bounds: tuple[float, float]) -> str:
    """``parse_range``'s inverse, exact (``repr`` of each bound)."""
    return f"{key}:{bounds[0]!r}:{bounds[1]!r}"
