"""The compare page's series: one metric of several runs, each run a colour, from the effective
history of each (a view of snapshots, as ``chart_specs`` is of one)."""

from __future__ import annotations

from collections.abc import Mapping

from metrics_core.dashboard.store.snapshot import RunView
from metrics_core.dashboard.views.chart_specs import WRITER_FIELDS, Series, logged_keys, with_derived

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


def compare_series(views: Mapping[str, RunView], metric: str) -> tuple[str, list[Series]]:
    """One metric of several runs (effective histories), as its label and a series per run, each run
    a colour and named by its path.  A metric none of the runs logged is labelled by its name."""
    event, label = compare_metrics(views).get(metric, ("train", metric))
    series = []
    for number, (name, view) in enumerate(views.items()):
        frame = with_derived(view.effective(event, WRITER_FIELDS | {metric}), metric)
        # Validation is sparse (every N steps): drawn raw with markers, as on the run page, not smoothed.
        series.append(
            Series(frame, metric, name, markers=event == "validation", colour=RUN_COLOURS[number % len(RUN_COLOURS)])
        )
    return label, series
