"""The pages' charts drawn: a snapshot's chart specs (``views.chart_specs``) in, figures out.

``run_charts`` draws every chart of the run page in one pass over its specs (``metric_figure``,
``straggler_figure``), with the replay windows shaded in the sessions history mode
(``replay_highlights``); ``session_overlay`` and ``compare_chart`` are the sessions and compare
pages' charts (a compare chart of groups of runs: ``group_figures``).  Nothing here memoises
but a group's curve of each run, kept in its snapshot (``chart_memo`` keeps the rest, per snapshot),
and nothing here decides
which rows a chart draws (its spec does): this module only calls down, into the views and the
figure builders beside it.  How a line's points are picked is chosen here, where the charts' data is
read: ``run_charts`` and ``chart_builders`` take a ``downsample`` (``analysis.downsample``, min/max
unless told), as TensorBoard's data provider does, and the figure builders draw what it picks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np

from metrics_core.analysis.derived import REPLAY_FIELDS, replay_rows, replay_windows
from metrics_core.analysis.downsample import Downsampler, minmax_indices
from metrics_core.dashboard.figures.figure_dicts import Figure
from metrics_core.dashboard.figures.group_figures import RunCurve, group_figure, run_points
from metrics_core.dashboard.figures.layout import CHART_POINTS, Highlight, session_colour, x_values
from metrics_core.dashboard.figures.metric_figures import metric_figure
from metrics_core.dashboard.figures.rank_figures import straggler_figure
from metrics_core.dashboard.store.snapshot import EMPTY, RunView
from metrics_core.dashboard.views.chart_specs import (
    DEFAULT_CHARTS,
    LINE_FIELDS,
    Chart,
    ChartOptions,
    ChartSpec,
    chart_spec,
    chart_specs,
    spec_makers,
)
from metrics_core.dashboard.views.compare import compare_series, group_series, run_series

KEPT_SMOOTHINGS = 2


def replay_highlights(view: RunView, x: str) -> list[Highlight]:
    """Shaded x-ranges of each replay window (``supersession.redo_windows``): from where the
    session resumed to the furthest of the superseded tail and its redo, with the loss change."""
    if x not in ("step", "tokens_seen"):
        return []
    train = view.frame("train", LINE_FIELDS | REPLAY_FIELDS)
    windows = replay_windows(train, view.sessions, view.redone_by)
    if not windows:
        return []
    _, redo = replay_rows(train, view.sessions, view.redone_by)
    xs = np.asarray(x_values(train, x, None), dtype=np.float64)
    ends = np.full(len(view.sessions), -np.inf)
    for rows in (view.redone_by, redo):  # the furthest x of each window's two sides
        np.maximum.at(ends, rows[rows >= 0], xs[rows >= 0])
    result = []
    for window in windows:
        session = view.sessions[window.session]
        x0 = session.first_step if x == "step" else session.first_tokens_seen
        delta = "" if window.loss_delta is None else f" · Δloss {window.loss_delta:+.3g}"
        label = f"replay S{window.session}→S{window.session + 1}{delta}"
        result.append(Highlight(float(x0), float(ends[window.session]), label, session_colour(window.session)))
    return result


def run_charts(
    view: RunView,
    options: ChartOptions,
    *,
    max_points: int = CHART_POINTS,
    charts: Sequence[Chart] | None = None,
    downsample: Downsampler = minmax_indices,
) -> dict[str, Figure]:
    """Every chart of the run page (of ``charts``, default ``charts_of(view)``) as a figure, each
    with a budget of ``max_points`` drawn points, picked by ``downsample``: their specs made at once
    (``chart_specs.chart_specs``: the snapshot's rows read in one pass), then drawn."""
    highlights = replay_highlights(view, options.x) if options.history == "sessions" else []
    specs = chart_specs(view, options.history, only=options.only, charts=charts, x=options.x)
    return {
        key: spec_figure(view, key, spec, options, highlights, max_points, downsample) for key, spec in specs.items()
    }


def chart_builders(
    view: RunView,
    options: ChartOptions,
    *,
    max_points: int = CHART_POINTS,
    charts: Sequence[Chart] | None = None,
    downsample: Downsampler = minmax_indices,
) -> dict[str, Callable[[], Figure]]:
    """``run_charts``, each chart a call that draws it, in the page's order: a page can show the
    first chart of a big run while the others are drawn."""
    highlights = replay_highlights(view, options.x) if options.history == "sessions" else []
    makers = spec_makers(view, options.history, only=options.only, charts=charts, x=options.x)
    draw = partial(_drawn, view, options=options, highlights=highlights, max_points=max_points, downsample=downsample)
    return {key: partial(draw, key, make) for key, make in makers.items()}


def _drawn(
    view: RunView,
    key: str,
    make: Callable[[], ChartSpec],
    *,
    options: ChartOptions,
    highlights: Sequence[Highlight],
    max_points: int,
    downsample: Downsampler,
) -> Figure:
    return spec_figure(view, key, make(), options, highlights, max_points, downsample)


def spec_figure(
    view: RunView,
    key: str,
    spec: ChartSpec,
    options: ChartOptions,
    highlights: Sequence[Highlight],
    max_points: int,
    downsample: Downsampler = minmax_indices,
) -> Figure:
    """``spec`` drawn; ``layout.uirevision`` names what keeps the user's zoom (run, chart, axes, history)."""
    if spec.kind == "straggler":
        first = spec.series[0]
        return straggler_figure(
            first.frame,
            sessions=view.sessions,
            superseded=first.superseded,
            x=options.x,
            highlights=highlights,
            revision=f"{view.name}:{key}:{options.x}:{options.history}",
            max_points=max_points,
            theme=options.theme,
            downsample=downsample,
        )
    log_y = options.log_y and spec.loggable
    return metric_figure(
        spec.series,
        title=spec.title,
        sessions=view.sessions,
        x=options.x,
        smoothing=options.smoothing if spec.smoothed else 0.0,
        log_y=log_y,
        revision=f"{view.name}:{key}:{options.x}:{log_y}:{options.history}",
        highlights=highlights,
        max_points=max_points,
        theme=options.theme,
        downsample=downsample,
    )


def session_overlay(
    view: RunView, *, x: str, smoothing: float, theme: str = "light", chart: Chart = DEFAULT_CHARTS[0]
) -> Figure:
    """The sessions page's chart: every session's ``chart`` (the loss unless picked) on one axis,
    replay windows shaded."""
    spec = chart_spec(view, chart, "sessions", x=x)
    return metric_figure(
        spec.series,
        title=f"{spec.title} by session",
        sessions=view.sessions,
        x=x,
        smoothing=smoothing if spec.smoothed else 0.0,
        revision=f"{view.name}:sessions:{chart.key}:{x}",
        highlights=replay_highlights(view, x),
        theme=theme,
    )


def compare_chart(
    views: Mapping[str, RunView],
    metric: str,
    *,
    x: str,
    smoothing: float,
    log_y: bool,
    theme: str = "light",
    groups: Mapping[str, list[str]] | None = None,
    band: str = "minmax",
) -> Figure:
    """One metric of several runs (``compare_series``), each run a colour and named by its path in
    the chart's legend (every chart has its own: on a phone the charts are far apart).  With
    ``groups`` (group name -> its runs, ``views.groups.run_groups``), one line per group instead:
    the mean of its runs over a ``band`` (``group_figure``).  A metric none of the runs logged is an
    empty chart titled by its name."""
    revision = f"compare:{metric}:{x}:{log_y}:{','.join(views)}"
    if groups is not None:
        (event, label), grouped = group_series(views, metric, groups)
        curves = {run: _run_curve(views[run], run, event, metric, x, smoothing) for g in grouped for run in g.runs}
        revision = f"{revision}:{band}:{','.join(groups)}"
        return group_figure(grouped, curves, title=label, x=x, log_y=log_y, band=band, revision=revision, theme=theme)
    label, series = compare_series(views, metric, x=x)
    return metric_figure(
        series,
        title=label,
        sessions=[],
        x=x,
        smoothing=smoothing,
        log_y=log_y,
        revision=revision,
        theme=theme,
    )


def _run_curve(view: RunView, name: str, event: str, metric: str, x: str, smoothing: float) -> RunCurve:
    """``run_points`` of one run's ``metric``, kept with the snapshot: a run that did not change
    since the last refresh (a finished seed of a sweep) costs nothing to draw again in its group.
    The last ``KEPT_SMOOTHINGS`` smoothings are kept: a slider dragged across its range leaves no
    more than that per run."""
    kept = view.kept(("group_points", event, metric, x))
    with kept.lock:  # tabs drawing the same run wait for one computation, not one each
        curves: dict[float, RunCurve] = {} if kept.value is EMPTY else kept.value
        found = curves.pop(smoothing, None)
        if found is None:
            found = run_points(run_series(view, name, event, metric, x=x), x, smoothing)
        curves[smoothing] = found
        while len(curves) > KEPT_SMOOTHINGS:
            del curves[next(iter(curves))]
        kept.value = curves
        return found
