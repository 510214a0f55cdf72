"""A metric's line chart (``metric_figure``): frames and sessions in, a ``Figure`` out; each
series' traces are ``series_traces``' (its steps: smooth, pick points, name, mark gaps, hover).

* one trace per session in the session's colour (or one per series in a colour of its own, to
  compare runs), on ``layout.chart_layout``; past ``SESSION_TRACES`` sessions (a run resumed
  thousands of times) one trace for them all in a neutral colour, broken where a session begins,
  so a chart costs its points, not its sessions;
* superseded records (work a later session redid) are drawn dimmed, never hidden;
* smoothing is TensorBoard's debiased EMA (``ema_smooth``), with the raw line kept faint behind it;
* a missing value (a window with no successful update) breaks the line and gets a marker on the
  chart's floor: never interpolated over; a value with a gap on both sides, which a line cannot
  show (a key logged every thousand records), gets a marker of its own;
* every trace is downsampled by the caller's ``Downsampler`` (``minmax_indices`` unless another is
  passed: spikes and the last point survive), within the chart's budget of points;
* its y axes (titles, formats, count axes, the robust default range and the off-scale markers
  beside it) follow ``metric_axes``, the one place for those rules;
* a sparse series (validation every N steps, ``markers=True``) is drawn raw with markers, never
  smoothed like the dense series beside it; the markers go once a trace holds more than
  ``MARKED_POINTS`` (they would run into a thick line, and each is an element the browser redraws
  on every live update), as plotly.js itself drops them from a dense trace by default;
* a chart of more than one line has a legend: a session-split chart lists its series once (not
  once per session) in a neutral colour, then each session in its colour; a smoothed chart has one
  entry for the faint raw lines behind the smoothed ones.  Entries that stand for lines drawn
  elsewhere are ``legend_entry`` traces: one null point, never drawn (plotly.js hides a trace with
  no points from the legend too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.analysis.downsample import Downsampler, minmax_indices
from metrics_core.dashboard.figures.figure_dicts import Figure, figure_of
from metrics_core.dashboard.figures.layout import (
    CHART_POINTS,
    MARGIN_RIGHT,
    SESSION_TRACES,
    Axis,
    Highlight,
    chart_height,
    chart_layout,
    session_key,
)
from metrics_core.dashboard.figures.metric_axes import RIGHT_AXIS_PX, axis_of, off_scale_markers, y_axes
from metrics_core.dashboard.figures.series_traces import KEY_COLOUR, RAW_OPACITY, add_series, legend_entry, smoothed
from metrics_core.dashboard.views.chart_specs import Series
from metrics_core.read.run_reader import Session

RAW_NAME = "raw (unsmoothed)"


def axis_for(series: Sequence[Series], *, secondary: bool) -> Axis | None:
    """The axis of the first series drawn on that side (``metric_axes.axis_of``), or None."""
    for item in series:
        if item.secondary_y == secondary:
            return axis_of(item.column, item.frame)
    return None


def metric_figure(
    series: Sequence[Series],
    *,
    title: str,
    sessions: Sequence[Session],
    x: str = "step",
    smoothing: float = 0.0,
    log_y: bool = False,
    max_points: int = CHART_POINTS,
    revision: str = "",
    highlights: Sequence[Highlight] = (),
    theme: str = "light",
    downsample: Downsampler = minmax_indices,
) -> Figure:
    """A line chart of ``series`` split by session, with session boundaries marked.

    ``max_points`` is the chart's budget of drawn points, shared among its traces in proportion
    to their rows (at most ``TRACE_POINTS`` each), which bounds any chart's JSON however long the
    run.  ``x`` is a mode of ``X_MODES`` or a logged key (``views.x_keys``).  ``revision`` becomes
    ``layout.uirevision``: while it stays the same,
    a redraw with new data keeps the user's zoom and pan.  ``downsample`` picks each trace's points
    within its budget (``analysis.downsample``): the caller that reads the data chooses how.
    """
    origin = pd.Timestamp(sessions[0].start_time) if sessions else None
    traces: list[dict[str, Any]] = []
    drawn_rows = sum(len(item.frame) for item in series if item.column in item.frame.columns)
    traces_per_row = 2 if smoothing > 0 else 1
    drawn: dict[bool, list[np.ndarray]] = {False: [], True: []}  # per axis, for the robust range
    spans: list[float] = []
    any_smoothed = smoothing > 0 and any(smoothed(item) for item in series)
    legend = len({item.label for item in series}) > 1 or any_smoothed
    for number, item in enumerate(series):
        added = add_series(
            traces,
            item,
            number,
            x=x,
            origin=origin,
            smoothing=smoothing,
            legend=legend,
            points_per_row=max_points / max(drawn_rows, 1) / traces_per_row,
            every_session=len(sessions) > SESSION_TRACES,
            downsample=downsample,
        )
        drawn[item.secondary_y] += added[0]
        spans += added[1]
    lines = any(map(len, drawn.values()))  # no entry that tells lines apart on a chart of nothing logged
    if any_smoothed and lines:
        traces.append(
            legend_entry(RAW_NAME, group="raw", line={"color": KEY_COLOUR, "width": 1.5}, opacity=RAW_OPACITY)
        )
    if 1 < len(sessions) <= SESSION_TRACES and any(item.colour is None for item in series) and lines:
        traces += session_legend(sessions)
    if not any(trace.get("yaxis") in (None, "y") for trace in traces):  # plotly draws no axis without a trace
        traces.append({"x": [], "y": [], "showlegend": False, "hoverinfo": "skip"})
    layout = chart_layout(
        traces,
        title=title,
        sessions=sessions,
        x=x,
        origin=origin,
        log_y=log_y,
        revision=revision,
        highlights=highlights,
        theme=theme,
        spans=spans,
        margin_right=RIGHT_AXIS_PX if any(item.secondary_y for item in series) else MARGIN_RIGHT,
    )
    sides = {secondary: axis_for(series, secondary=secondary) for secondary in (False, True)}
    robust = y_axes(layout, sides, drawn, log_y=log_y, theme=theme)
    layout["height"] = chart_height(traces, layout["margin"]["r"])  # a right axis narrows the legend
    if robust is not None:
        traces += off_scale_markers(traces, robust, log=log_y, theme=theme)
    return figure_of(traces, layout)


def session_legend(sessions: Sequence[Session]) -> list[dict[str, Any]]:
    """A legend entry per session in its colour ("S2 · resume @ 60"): every chart whose lines are
    split by session says which is which, on every page and at phone width."""
    return [
        legend_entry(f"{label} · {what}", group="sessions", line={"color": colour, "width": 3})
        for label, colour, what in session_key(sessions)
    ]
