"""Groups of runs as one line each: the mean across a group's runs, with a band (``group_figure``).

How runs are put on one x (``align``): each run's points, smoothed first when asked (the same
debiased EMA as a single line, so the band shows the spread between seeds, not the noise of each),
averaged where a run logged one x twice (an integer epoch), are linearly interpolated onto a grid
common to the group: every x any run logged when they number at most ``GROUP_POINTS`` (so runs
logged at the same steps are averaged at exactly those steps), else ``GROUP_POINTS`` evenly spaced
x between the group's first and last.  A run counts only between its own first and last x: a run
that stopped early leaves the mean to the runs that went on, with no cliff where it stopped.
Missing values (a window with no number) are left out of a run's points before interpolation; a
run of more than ``RUN_POINTS`` points is first reduced to the means of consecutive points
(``run_points``: what a page keeps of each run per snapshot, so a refresh of a group whose runs
did not change costs the alignment only).

The band (``band_edges``) is the min–max of the runs at each x, or the mean ± one standard
deviation (the population's: the runs there are the whole group, and one run has a band of 0).
Pure functions: frames in, a ``Figure`` out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metrics_core.dashboard.display_text import plotly_text, shorten
from metrics_core.dashboard.figures.figure_dicts import Figure, figure_of
from metrics_core.dashboard.figures.layout import Axis, chart_height, chart_layout, compact, rgba, x_values
from metrics_core.dashboard.figures.metric_axes import axis_of, off_scale_markers, y_axes
from metrics_core.dashboard.figures.series_traces import LABEL_CHARS, MARKED_POINTS, ema_smooth
from metrics_core.dashboard.views.chart_specs import Series, column_numbers
from metrics_core.dashboard.views.compare import GroupSeries
from metrics_core.dashboard.views.groups import legend_name

GROUP_POINTS = 2000  # grid points per group
RUN_POINTS = 4000  # points kept of one run (``run_points``)
BANDS = {"minmax": "min–max", "std": "± 1 std"}
BAND_OPACITY = 0.18


@dataclass(frozen=True, slots=True)
class GroupStats:
    """A group on its grid: at each ``x`` the mean of the runs there, the band's edges, how many runs."""

    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    runs: np.ndarray


@dataclass(frozen=True, slots=True)
class RunCurve:
    """One run's points of a metric, ready to align (``run_points``), and how its axis reads."""

    x: np.ndarray
    y: np.ndarray
    axis: Axis
    markers: bool = False


def run_points(item: Series, x: str, smoothing: float, *, points: int = RUN_POINTS) -> RunCurve:
    """One run's finite points of ``item`` in x order (smoothed first when ``smoothing`` > 0 and the
    series is dense), the values of an x logged more than once averaged; beyond ``points`` points,
    the means of as many runs of consecutive points (x and value alike), so what a chart keeps of a
    run per snapshot is bounded however long the run."""
    frame = item.frame
    axis = axis_of(item.column, frame)
    if item.column not in frame.columns or not len(frame):
        return RunCurve(np.zeros(0), np.zeros(0), axis, item.markers)
    xs = np.asarray(x_values(frame, x, None), dtype=np.float64)
    ys = column_numbers(frame, item.column)
    if smoothing > 0 and not item.markers:
        ys = ema_smooth(ys, smoothing)
    keep = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[keep], ys[keep]
    if len(xs) > 1 and not (np.diff(xs) > 0).all():  # the usual case, a growing step, skips the sort
        xs, inverse = np.unique(xs, return_inverse=True)
        ys = np.bincount(inverse, weights=ys) / np.bincount(inverse)
    if len(xs) > points:
        bucket = np.arange(len(xs)) * points // len(xs)
        sizes = np.bincount(bucket)
        xs, ys = np.bincount(bucket, weights=xs) / sizes, np.bincount(bucket, weights=ys) / sizes
    return RunCurve(xs, ys, axis, item.markers)


def align(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], *, points: int = GROUP_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """The group's grid and a matrix of each run's values on it (runs × grid), NaN outside a run's
    own first and last x (see the module docstring)."""
    present = [(xs, ys) for xs, ys in curves if len(xs)]
    if not present:
        return np.zeros(0), np.zeros((len(curves), 0))
    union = np.unique(np.concatenate([xs for xs, _ in present]))
    grid = union if len(union) <= points else np.linspace(union[0], union[-1], points)
    matrix = np.full((len(curves), len(grid)), np.nan)
    for row, (xs, ys) in enumerate(curves):
        if len(xs):
            inside = (grid >= xs[0]) & (grid <= xs[-1])
            matrix[row, inside] = np.interp(grid[inside], xs, ys)
    return grid, matrix


def band_edges(grid: np.ndarray, matrix: np.ndarray, band: str) -> GroupStats:
    """The mean of ``matrix``'s runs at each grid x and the band's edges (``BANDS``); x where no
    run reaches are left out."""
    runs = np.isfinite(matrix).sum(axis=0)
    reached = runs > 0
    values = matrix[:, reached]
    if not values.size:
        empty = np.zeros(0)
        return GroupStats(empty, empty, empty, empty, runs[reached])
    mean = np.nanmean(values, axis=0)
    if band == "std":
        spread = np.nanstd(values, axis=0)
        low, high = mean - spread, mean + spread
    else:
        low, high = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
    return GroupStats(grid[reached], mean, low, high, runs[reached])


def group_figure(
    groups: Sequence[GroupSeries],
    curves: Mapping[str, RunCurve],
    *,
    title: str,
    x: str = "step",
    log_y: bool = False,
    band: str = "minmax",
    revision: str = "",
    theme: str = "light",
) -> Figure:
    """One line per group, the mean of its runs' ``curves`` (by run name, ``run_points``) over a
    band (``band_edges``), each group a colour, named in the legend with its run count
    ("peak_lr=0.0003 (4 runs)"); the hover gives the band's edges and the runs at that x.  One
    legend entry per group, however many runs."""
    traces: list[dict[str, Any]] = []
    drawn: list[np.ndarray] = []
    spans: list[float] = []
    axis = next((curve.axis for curve in curves.values()), Axis(title))
    for number, group in enumerate(groups):
        members = [curves[run] for run in group.runs]
        grid, matrix = align([(curve.x, curve.y) for curve in members])
        stats = band_edges(grid, matrix, band)
        if not len(stats.x):
            continue
        sparse = any(curve.markers for curve in members) and len(stats.x) <= MARKED_POINTS
        traces += _group_traces(group, number, stats, band, axis=axis, sparse=sparse)
        drawn += [stats.mean, stats.low, stats.high]
        spans += [float(stats.x[0]), float(stats.x[-1])]
    if not traces:  # plotly draws no axis without a trace
        traces.append({"x": [], "y": [], "showlegend": False, "hoverinfo": "skip"})
    layout = chart_layout(
        traces,
        title=f"{title} · mean, band {BANDS[band]}",
        sessions=[],
        x=x,
        origin=None,
        log_y=log_y,
        revision=revision,
        highlights=(),
        theme=theme,
        spans=spans,
    )
    robust = y_axes(layout, {False: axis, True: None}, {False: drawn, True: []}, log_y=log_y, theme=theme)
    layout["height"] = chart_height(traces, layout["margin"]["r"])
    if robust is not None:
        traces += off_scale_markers(traces, robust, log=log_y, theme=theme)
    return figure_of(traces, layout)


def _group_traces(
    group: GroupSeries, number: int, stats: GroupStats, band: str, *, axis: Axis, sparse: bool
) -> list[dict[str, Any]]:
    """The band's lower edge, its upper edge filled down to it, and the mean line on top."""
    name = plotly_text(legend_name(shorten(group.label, LABEL_CHARS), len(group.runs)))  # the count never cut off
    key = f"group:{number}"  # legend groups apart even when shortened names collide
    edge = {"color": group.colour, "width": 0}
    fmt = axis.hoverformat
    common = {"legendgroup": key, "showlegend": False, "hoverinfo": "skip", "connectgaps": False, "mode": "lines"}
    return [
        dict(x=stats.x, y=compact(stats.low), name=f"{name} low", line=edge, **common),
        dict(
            x=stats.x,
            y=compact(stats.high),
            name=f"{name} high",
            line=edge,
            fill="tonexty",
            fillcolor=rgba(group.colour, BAND_OPACITY),
            **common,
        ),
        dict(
            x=stats.x,
            y=compact(stats.mean),
            name=name,
            legendgroup=key,
            mode="lines+markers" if sparse else "lines",
            line={"color": group.colour, "width": 2},
            marker={"size": 5},
            showlegend=True,
            connectgaps=False,
            customdata=np.column_stack([stats.low, stats.high, stats.runs]),
            hovertemplate=f"{name}: %{{y:{fmt}}} ({BANDS[band]} %{{customdata[0]:{fmt}}} … "
            f"%{{customdata[1]:{fmt}}}, %{{customdata[2]}} runs)<extra></extra>",
        ),
    ]
