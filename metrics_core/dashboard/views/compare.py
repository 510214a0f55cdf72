"""The compare page's series: one metric of several runs, each run a colour, from the effective
history of each (a view of snapshots, as ``chart_specs`` is of one); or of groups of runs
(``views.groups``), each group a colour, its runs' series together (``group_series``).  The x
axis may be a logged key that grows (``views.x_keys``): ``compare_x_keys`` says which."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from metrics_core.dashboard.store.snapshot import RunView
from metrics_core.dashboard.views.chart_specs import LINE_FIELDS, Series, logged_keys, with_derived
from metrics_core.dashboard.views.memo import view_x_keys
from metrics_core.dashboard.views.x_keys import X_MODES, fill_x

RUN_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")

# The mission's metrics on the compare page: metric -> (event, label); ``compare_metrics`` adds
# every key the compared runs logged.
COMPARE_METRICS = {
    "train_loss": ("train", "train loss"),
    "val_loss": ("validation", "validation loss"),
    "grad_norm_avg": ("train", "grad norm avg"),
    "clipped_fraction": ("train", "clipped fraction"),
    "skipped_updates": ("train", "skipped updates (cumulative)"),
    "lr": ("train", "learning rate"),
    "tokens_per_s": ("train", "tokens/s"),
}


def compare_metrics(views: Mapping[str, RunView]) -> dict[str, tuple[str, str]]:
    """What the compare page can chart for ``views``: the mission's metrics, then every key any of
    the runs logged (``logged_keys``), sorted, each named by itself."""
    logged: dict[str, str] = {}
    for view in views.values():
        for column, events in logged_keys(view).items():
            logged.setdefault(column, events[0])
    return COMPARE_METRICS | {column: (logged[column], column) for column in sorted(logged)}


def compare_x_keys(views: Mapping[str, RunView]) -> list[str]:
    """The logged keys the compare page offers as x: each grows within the sessions of every run
    that logs it numerically (``view_x_keys``), and is not refused by one that logs it otherwise."""
    growing: set[str] = set()
    refused: set[str] = set()
    for view in views.values():
        keys = set(view_x_keys(view))
        growing |= keys
        refused |= {key for key, events in logged_keys(view).items() if "train" in events} - keys
    return sorted(growing - refused)


def compare_series(views: Mapping[str, RunView], metric: str, *, x: str = "step") -> tuple[str, list[Series]]:
    """One metric of several runs (effective histories), as its label and a series per run, each run
    a colour and named by its path (``run_series``).  A metric none of the runs logged is labelled
    by its name."""
    event, label = compare_metrics(views).get(metric, ("train", metric))
    return label, [
        run_series(view, name, event, metric, x=x, colour=RUN_COLOURS[number % len(RUN_COLOURS)])
        for number, (name, view) in enumerate(views.items())
    ]


def run_series(view: RunView, name: str, event: str, metric: str, *, x: str, colour: str | None = None) -> Series:
    """``metric`` of ``event``'s records of one run (its effective history), named ``name``; the
    frame holds ``x`` when it is a logged key (``fill_x``).  Validation is sparse (every N steps):
    drawn raw with markers, as on the run page, not smoothed."""
    frame = with_derived(view.effective(event, LINE_FIELDS | {metric} | ({x} - X_MODES.keys())), metric)
    if x not in X_MODES:
        frame = fill_x(frame, x, view.effective("train", ("step", x)))
    return Series(frame, metric, name, markers=event == "validation", colour=colour)


@dataclass(frozen=True, slots=True)
class GroupSeries:
    """One group of runs on a compare chart: its name, its runs (names), its colour."""

    label: str
    runs: tuple[str, ...]
    colour: str


def group_series(
    views: Mapping[str, RunView], metric: str, groups: Mapping[str, list[str]]
) -> tuple[tuple[str, str], list[GroupSeries]]:
    """The event and label of ``metric`` and a ``GroupSeries`` per group of ``groups`` (group name
    -> run names, ``groups.run_groups``; runs not in ``views`` left out), each group a colour in
    ``groups``' order.  No run's rows are read here: a chart asks ``run_series`` per run, and may
    keep what it drew of it per snapshot."""
    event_label = compare_metrics(views).get(metric, ("train", metric))
    return event_label, [
        GroupSeries(name, tuple(run for run in runs if run in views), RUN_COLOURS[number % len(RUN_COLOURS)])
        for number, (name, runs) in enumerate(groups.items())
    ]
