"""A metric's line chart (``metric_figure``): frames and sessions in, a ``Figure`` out.

* one trace per session in the session's colour (or one per series in a colour of its own, to
  compare runs), on ``layout.chart_layout``; past ``SESSION_TRACES`` sessions (a run resumed
  thousands of times) one trace for them all in a neutral colour, broken where a session begins,
  so a chart costs its points, not its sessions;
* superseded records (work a later session redid) are drawn dimmed, never hidden;
* smoothing is TensorBoard's debiased EMA (``ema_smooth``), with the raw line kept faint behind it;
* a missing value (a window with no successful update) breaks the line and gets a marker on the
  chart's floor: never interpolated over; a value with a gap on both sides, which a line cannot
  show (a key logged every thousand records), gets a marker of its own;
* every trace is downsampled by ``minmax_indices`` (spikes and the last point survive), within the
  chart's budget of points;
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

from metrics_core.analysis.downsample import minmax_indices
from metrics_core.dashboard.display_text import plotly_text, shorten
from metrics_core.dashboard.figures.figure_dicts import Figure, figure_of
from metrics_core.dashboard.figures.layout import (
    CHART_POINTS,
    MIN_TRACE_POINTS,
    SESSION_TRACES,
    SUPERSEDED_OPACITY,
    TRACE_POINTS,
    Axis,
    Highlight,
    chart_height,
    chart_layout,
    compact,
    session_colour,
    session_key,
    x_values,
)
from metrics_core.dashboard.figures.metric_axes import axis_of, off_scale_markers, y_axes
from metrics_core.dashboard.views.chart_specs import Series
from metrics_core.read.run_reader import Session

DASHES = ("solid", "dot", "dash", "dashdot")
RAW_OPACITY = 0.25
LABEL_CHARS = 40  # a legend entry (a run name on the compare chart)
KEY_COLOUR = "#808495"  # legend entries that stand for lines of every session: neutral, sessions have colours
RAW_NAME = "raw (unsmoothed)"
EVENT_COLUMNS = frozenset({"skipped_updates_in_window"})  # counts that are mostly 0: markers where they are not
HOVER_CHARS = 120  # a series name in the hover box: the full name, within reason
MARKED_POINTS = 100  # a sparse line's points keep their markers while they stay apart on a desktop chart
LONE_SUFFIX = "(lone points)"  # the trace of a line's points that no segment joins


def ema_smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's debiased EMA: ``last = w·last + (1−w)·y`` from 0, shown as ``last / (1 − wⁿ)``.

    ``n`` counts finite points; non-finite points stay NaN and do not advance the average.
    Vectorised: a Python loop per point, or per block of points, is what a long run's first chart
    would wait for.
    """
    y = np.asarray(values, dtype=np.float64)
    if weight <= 0:
        return y.copy()
    out = np.full_like(y, np.nan)
    finite = np.isfinite(y)
    v = y[finite]
    if not len(v):
        return out
    # Blocks short enough that w⁻ᵏ stays finite, a row each: within a block,
    # last_k = wᵏ·last + (1−w)·Σ_{j≤k} wᵏ⁻ʲ·v_j, written with cumulative sums along the rows; only
    # the ``last`` carried from one block into the next is a loop, one step per block.
    block = min(len(v), max(1, int(500 / -np.log(weight))))
    rows = -(-len(v) // block)
    padded = np.zeros(rows * block)
    padded[: len(v)] = v
    powers = weight ** np.arange(1, block + 1)
    sums = (1 - weight) * powers / weight * np.cumsum(padded.reshape(rows, block) * weight / powers, axis=1)
    carried = np.empty(rows)
    last = 0.0
    for row in range(rows):
        carried[row] = last
        last = last * powers[-1] + sums[row, -1]
    smoothed = (carried[:, None] * powers + sums).reshape(-1)[: len(v)]
    # 1 − wⁿ is exactly 1 once wⁿ < 2⁻⁵⁴: only the first points are divided.
    head = min(len(v), int(np.ceil(-54 * np.log(2) / np.log(weight))) + 1)
    smoothed[:head] /= 1 - weight ** np.arange(1, head + 1)
    out[finite] = smoothed
    return out


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
) -> Figure:
    """A line chart of ``series`` split by session, with session boundaries marked.

    ``max_points`` is the chart's budget of drawn points, shared among its traces in proportion
    to their rows (at most ``TRACE_POINTS`` each), which bounds any chart's JSON however long the
    run.  ``x`` is a mode of ``X_MODES`` or a logged key (``views.x_keys``).  ``revision`` becomes
    ``layout.uirevision``: while it stays the same,
    a redraw with new data keeps the user's zoom and pan.
    """
    origin = pd.Timestamp(sessions[0].start_time) if sessions else None
    traces: list[dict[str, Any]] = []
    drawn_rows = sum(len(item.frame) for item in series if item.column in item.frame.columns)
    traces_per_row = 2 if smoothing > 0 else 1
    drawn: dict[bool, list[np.ndarray]] = {False: [], True: []}  # per axis, for the robust range
    spans: list[float] = []
    smoothed = smoothing > 0 and any(_smoothed(item) for item in series)
    legend = len({item.label for item in series}) > 1 or smoothed
    for number, item in enumerate(series):
        added = _add_series(
            traces,
            item,
            number,
            x=x,
            origin=origin,
            smoothing=smoothing,
            legend=legend,
            points_per_row=max_points / max(drawn_rows, 1) / traces_per_row,
            every_session=len(sessions) > SESSION_TRACES,
        )
        drawn[item.secondary_y] += added[0]
        spans += added[1]
    lines = any(map(len, drawn.values()))  # no entry that tells lines apart on a chart of nothing logged
    if smoothed and lines:
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


def legend_entry(name: str, *, group: str, mode: str = "lines", **style: Any) -> dict[str, Any]:
    """A legend entry for lines drawn by other traces: one null point, so plotly.js keeps it in
    the legend (a trace of no points is hidden, from the legend too) and draws nothing for it."""
    return dict(x=[None], y=[None], name=name, legendgroup=group, mode=mode, showlegend=True, hoverinfo="skip", **style)


def _lone(values: np.ndarray) -> np.ndarray:
    """Per drawn point, whether it holds a value and neither point beside it does: a line drawn
    through gaps shows nothing there (a key logged every thousand records, among rows that lack it)."""
    finite = np.isfinite(values)
    beside = np.zeros(len(values), dtype=bool)
    beside[1:] |= finite[:-1]
    beside[:-1] |= finite[1:]
    return finite & ~beside


def _smoothed(item: Series) -> bool:
    """Whether smoothing applies to ``item``: sparse series and event counts are drawn raw."""
    return not item.markers and item.column not in EVENT_COLUMNS


def _add_series(
    traces: list[dict[str, Any]],
    item: Series,
    number: int,
    *,
    x: str,
    origin: pd.Timestamp | None,
    smoothing: float,
    points_per_row: float,
    legend: bool = True,
    every_session: bool = False,
) -> tuple[list[np.ndarray], list[float]]:
    """Append ``item``'s traces to ``traces``; return the y values drawn (for the axis range) and the x extent."""
    frame = item.frame
    if item.column not in frame.columns or frame.empty:
        return [], []
    xs = x_values(frame, x, origin)
    values = frame[item.column]
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "iuf":  # pd.to_numeric costs more than the rest
        ys = values.to_numpy(dtype=np.float64)
    else:
        ys = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
    steps = frame["step"].to_numpy() if x != "step" and "step" in frame.columns else None
    session_codes = frame["session_id"].cat.codes.to_numpy() if item.colour is None else np.zeros(len(frame), int)
    superseded = item.superseded if item.superseded is not None else np.zeros(len(frame), dtype=bool)
    dash = DASHES[number % len(DASHES)]
    label = plotly_text(shorten(item.label, LABEL_CHARS))
    full = plotly_text(shorten(item.label, HOVER_CHARS))
    axis = "y2" if item.secondary_y else "y"
    events = item.column in EVENT_COLUMNS
    if events:
        ys = np.where(ys > 0, ys, np.nan)
    smoothing = smoothing if _smoothed(item) else 0.0
    style = axis_of(item.column, frame)
    per_session = item.colour is None
    group = f"{number}:{label}"
    drawn: list[np.ndarray] = []
    finite_x = xs[np.isfinite(xs)] if xs.dtype.kind == "f" else xs
    extent = [float(np.min(finite_x)), float(np.max(finite_x))] if len(finite_x) else []
    if per_session and legend:  # one legend entry per series, in a neutral colour: sessions have theirs
        traces.append(
            legend_entry(
                label,
                group=group,
                mode="markers" if events or item.markers else "lines",
                yaxis=axis,
                line={"color": KEY_COLOUR, "dash": dash, "width": 2 if smoothing > 0 else 1.5},
                marker={"color": KEY_COLOUR, "size": 6},
            )
        )
    effective = ~superseded
    for code, in_session in _session_parts(session_codes, every_session):
        for dimmed in (False, True):
            rows = np.flatnonzero(in_session & (superseded if dimmed else effective))
            if not len(rows):
                continue
            suffix = "" if item.colour else f" · S{code + 1}" if code >= 0 else " · every session"
            name = label + suffix + (" (superseded)" if dimmed else "")
            where = full + suffix + (" (superseded)" if dimmed else "")
            colour = item.colour or (session_colour(int(code)) if code >= 0 else KEY_COLOUR)
            opacity = SUPERSEDED_OPACITY if dimmed else 1.0
            raw = ys[rows]
            smooth = ema_smooth(raw, smoothing) if smoothing > 0 else None
            budget = int(min(TRACE_POINTS, max(MIN_TRACE_POINTS, points_per_row * len(rows))))
            keep = minmax_indices(raw, budget)
            drawn.append(raw[keep])
            kept = rows[keep]  # the rows drawn: x and steps gathered for them only
            marked = item.markers and len(keep) <= MARKED_POINTS
            mode = "markers" if events else "lines+markers" if marked else "lines"
            at_step = "" if steps is None else " · step %{customdata:,}"
            hover = f"{where}: %{{y:{style.hoverformat}}}{at_step}<extra></extra>"
            traces.append(
                dict(
                    **_broken(
                        code, session_codes[kept], xs[kept], compact(raw[keep]), None if steps is None else steps[kept]
                    ),
                    name=name,
                    legendgroup=group,  # unique per series even when shortened labels collide
                    mode=mode,
                    yaxis=axis,
                    opacity=opacity * (RAW_OPACITY if smooth is not None else 1.0),
                    line={
                        "color": colour,
                        "dash": dash,
                        "width": 1.5,
                        "shape": "hv" if item.secondary_y and item.column == "skipped_updates" else "linear",
                    },
                    marker={"size": 7 if events else 4},
                    showlegend=not per_session and smooth is None,
                    connectgaps=False,
                    hovertemplate=hover,
                )
            )
            lone = _lone(raw[keep]) if mode == "lines" else None
            if lone is not None and lone.any():  # no line reaches them: a marker each, or nothing shows
                traces.append(
                    dict(
                        x=xs[kept[lone]],
                        y=compact(raw[keep][lone]),
                        name=f"{name} {LONE_SUFFIX}",
                        legendgroup=group,
                        mode="markers",
                        yaxis=axis,
                        opacity=opacity,
                        marker={"color": colour, "size": 6},
                        showlegend=False,
                        customdata=None if steps is None else steps[kept[lone]],
                        hovertemplate=hover,
                    )
                )
            if smooth is not None:
                keep = minmax_indices(smooth, budget)
                kept = rows[keep]
                traces.append(
                    dict(
                        **_broken(
                            code,
                            session_codes[kept],
                            xs[kept],
                            compact(smooth[keep]),
                            None if steps is None else steps[kept],
                        ),
                        name=f"{name} (smoothed)",
                        legendgroup=group,
                        mode="lines",
                        yaxis=axis,
                        opacity=opacity,
                        line={"color": colour, "dash": dash, "width": 2},
                        connectgaps=False,
                        showlegend=not per_session,
                        hovertemplate=f"{where} (smoothed): %{{y:{style.hoverformat}}}{at_step}<extra></extra>",
                    )
                )
            missing = rows[~np.isfinite(raw)]
            if len(missing) > budget:  # markers only point at gaps: an even sample keeps the JSON bounded
                missing = np.unique(missing[np.linspace(0, len(missing) - 1, budget).astype(np.int64)])
            if item.gap_markers and len(missing):
                first_gap = not any(trace.get("legendgroup") == "gaps" for trace in traces)
                traces.append(
                    dict(
                        x=xs[missing],
                        y=np.full(len(missing), 0.03),
                        yaxis="y3",
                        mode="markers",
                        name=f"no successful update{suffix}",
                        legendgroup="gaps",
                        showlegend=first_gap,
                        marker={
                            "symbol": "x-thin",
                            "size": 8,
                            "color": colour,
                            "line": {"width": 2, "color": colour},
                        },
                        hovertemplate=f"no successful update{suffix}<extra></extra>",
                    )
                )
    return drawn, extent


def _session_parts(codes: np.ndarray, every_session: bool) -> list[tuple[int, np.ndarray]]:
    """``(session code, its rows as a mask)`` per session a series' rows hold; with
    ``every_session`` (the run has more than ``SESSION_TRACES``), one part of every row, code -1:
    a trace per session would cost a pass over the rows, and plotly.js a trace, per session."""
    if every_session:
        return [(-1, np.ones(len(codes), dtype=bool))]
    return [(int(code), codes == code) for code in np.unique(codes)]


def _broken(code: int, sessions: np.ndarray, x: np.ndarray, y: np.ndarray, steps: np.ndarray | None) -> dict[str, Any]:
    """A trace's ``x``, ``y`` and ``customdata`` (the steps); in the trace of every session
    (``code`` -1), a missing point where a session begins, so that no line joins two sessions."""
    if code >= 0 or len(sessions) < 2:
        return {"x": x, "y": y, "customdata": steps}
    starts = np.flatnonzero(sessions[1:] != sessions[:-1]) + 1
    x = np.insert(x.astype(np.float64), starts, np.nan)
    y = np.insert(y, starts, np.nan)
    return {
        "x": x,
        "y": y,
        "customdata": None if steps is None else np.insert(steps.astype(np.float64), starts, np.nan),
    }
