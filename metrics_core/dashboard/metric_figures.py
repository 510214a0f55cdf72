"""A metric's line chart (``metric_figure``): frames and sessions in, a ``Figure`` out.

* one trace per session in the session's colour (or one per series in a colour of its own, to
  compare runs), on ``figures.chart_layout``;
* superseded records (work a later session redid) are drawn dimmed, never hidden;
* smoothing is TensorBoard's debiased EMA (``ema_smooth``), with the raw line kept faint behind it;
* a missing value (a window with no successful update) breaks the line and gets a marker on the
  chart's floor: never interpolated over;
* every trace is downsampled by ``minmax_indices`` (spikes and the last point survive), within the
  chart's budget of points;
* every y axis is titled with its unit and formatted on purpose (``AXES``, by column): loss,
  fraction 0–1, count, tokens/s, learning rate in ``2.5e-4`` notation, so no ``250µ`` stands next
  to ``2k``;
* the default y-range is robust (``robust_range``): an initial loss of 10 does not flatten a
  curve that lives around 2; plotly's autoscale button (or a double-click) shows the full range,
  and a note on the chart says how many points are off-scale;
* a sparse series (validation every N steps, ``markers=True``) is drawn raw with markers, never
  smoothed like the dense series beside it;
* a chart of more than one line has a legend: a session-split chart lists its series once (not
  once per session) in a neutral colour, then each session in its colour; a smoothed chart has one
  entry for the faint raw lines behind the smoothed ones.  Entries that stand for lines drawn
  elsewhere are ``legend_entry`` traces: one null point, never drawn (plotly.js hides a trace with
  no points from the legend too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.dashboard.display_text import plotly_text, shorten
from metrics_core.dashboard.figures import (
    CHART_POINTS,
    MIN_TRACE_POINTS,
    SUPERSEDED_OPACITY,
    THEMES,
    TRACE_POINTS,
    X_MODES,
    Axis,
    Figure,
    Highlight,
    chart_height,
    chart_layout,
    compact,
    figure_of,
    session_colour,
    session_key,
    x_values,
)
from metrics_core.downsample import minmax_indices
from metrics_core.reader import Session

DASHES = ("solid", "dot", "dash", "dashdot")
RAW_OPACITY = 0.25
LABEL_CHARS = 40  # a legend entry (a run name on the compare chart)
KEY_COLOUR = "#808495"  # legend entries that stand for lines of every session: neutral, sessions have colours
RAW_NAME = "raw (unsmoothed)"
RIGHT_AXIS_PX = 65  # the right margin of a chart with a right axis
EVENT_COLUMNS = frozenset({"skipped_updates_in_window"})  # counts that are mostly 0: markers where they are not
HOVER_CHARS = 120  # a series name in the hover box: the full name, within reason
ROBUST_SKIP = 0.1  # the first 10% of a series (warm-up: the initial loss of 10) does not set the range
ROBUST_FENCE = 3.0  # interquartile ranges beyond the quartiles
ROBUST_MIN_POINTS = 20

AXES = {
    "train_loss": Axis("loss"),
    "val_loss": Axis("loss"),
    "clipped_fraction": Axis("fraction clipped (0–1)", ".1~f", ".3~f", fixed=(-0.02, 1.02)),
    "skipped_updates_in_window": Axis("skipped in window (count)", ",d", ",d", robust=False, count=True),
    "skipped_updates": Axis("skipped, cumulative (count)", "~s", ",d", robust=False, count=True),
    "grad_norm_avg": Axis("gradient norm (L2)"),
    "grad_norm_max": Axis("gradient norm (L2)"),
    "lr": Axis("learning rate", ".1~e", ".3~e"),
    "tokens_per_s": Axis("throughput (tokens/s)", "~s", ",.0f"),
}


@dataclass(frozen=True, slots=True)
class Series:
    """One quantity to draw: ``column`` of ``frame``, called ``label``.

    ``superseded`` marks rows a later session redid (drawn dimmed); ``None`` means none are.
    ``gap_markers`` marks rows where the value is missing (e.g. no successful update).
    ``colour`` set: one trace in that colour named ``label`` (comparing runs), instead of one
    trace per session in the session's colour.
    """

    frame: pd.DataFrame
    column: str
    label: str
    superseded: np.ndarray | None = None
    secondary_y: bool = False
    gap_markers: bool = False
    markers: bool = False
    colour: str | None = None


def ema_smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's debiased EMA: ``last = w·last + (1−w)·y`` from 0, shown as ``last / (1 − wⁿ)``.

    ``n`` counts finite points; non-finite points stay NaN and do not advance the average.
    Vectorised in blocks short enough that ``w⁻ᵏ`` stays finite (a Python loop per point is the
    cost this avoids on a long run).
    """
    y = np.asarray(values, dtype=np.float64)
    if weight <= 0:
        return y.copy()
    out = np.full_like(y, np.nan)
    finite = np.isfinite(y)
    v = y[finite]
    if not len(v):
        return out
    block = max(1, int(500 / -np.log(weight)))
    smoothed = np.empty_like(v)
    last = 0.0
    for start in range(0, len(v), block):
        chunk = v[start : start + block]
        powers = weight ** np.arange(1, len(chunk) + 1)
        # last_k = w^k·last + (1−w)·Σ_{j≤k} w^{k−j}·v_j, written with cumulative sums.
        acc = last * powers + (1 - weight) * powers / weight * np.cumsum(chunk * weight / powers)
        smoothed[start : start + len(chunk)] = acc
        last = acc[-1]
    out[finite] = smoothed / (1 - weight ** np.arange(1, len(v) + 1))
    return out


def axis_for(series: Sequence[Series], *, secondary: bool) -> Axis | None:
    """The axis of the first series drawn on that side: its column's ``AXES`` entry, else one
    titled by the column (a logged key), counting when the column holds integers."""
    for item in series:
        if item.secondary_y == secondary:
            return AXES.get(item.column) or _logged_axis(item)
    return None


def _logged_axis(item: Series) -> Axis:
    integers = item.column in item.frame.columns and item.frame[item.column].dtype.kind in "iu"
    return Axis(item.column, ",d", ",d", count=True) if integers else Axis(item.column)


def fitted_range(values: np.ndarray, axis: Axis, *, log: bool) -> dict[str, Any]:
    """Range settings for what a default autorange draws misleadingly: a count axis from 0 with
    whole ticks (plotly draws no data on −1…4, and a count of 0–2 with ticks at 0.5); a constant
    series on a small band around its value (plotly draws 3e-4 on −1…1, where it reads as 0)."""
    finite = values[np.isfinite(values)]
    if axis.count and not log:
        top = float(finite.max()) if finite.size else 0.0
        if top > 5:
            return {"rangemode": "tozero"}
        return {"rangemode": "tozero", "range": [0, max(top, 1.0) * 1.08], "tickmode": "linear", "dtick": 1, "tick0": 0}
    if not finite.size or finite.min() != finite.max():
        return {}
    value = float(finite[0])
    if log:
        return {"range": [np.log10(value) - 0.3, np.log10(value) + 0.3]} if value > 0 else {}
    pad = abs(value) * 0.5 or 1.0
    return {"range": [value - pad, value + pad]}


def robust_range(columns: Sequence[np.ndarray], *, log: bool = False) -> tuple[tuple[float, float], int] | None:
    """A default y-range outliers cannot squash, and how many points lie outside it.

    From each array (one series, in x order) the first ``ROBUST_SKIP`` is left out (warm-up: an
    initial loss of 10 above a curve living at 2), then the rest within 3 interquartile ranges of its
    quartiles (a noisy curve keeps all its points, rare spikes fall outside), padded by 10%, widened
    to keep every series' latest value in view ("the latest datum should always be included").
    None when the full range is not more than 1.5× that (nothing to hide) or there are too few points.
    With ``log`` the range is in log10 units, as plotly wants it.
    """
    later, every, latest = [], [], []
    for values in columns:
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values) & (values > 0)] if log else values[np.isfinite(values)]
        if log:
            values = np.log10(values)
        if not len(values):
            continue
        every.append(values)
        later.append(values[int(len(values) * ROBUST_SKIP) :])
        latest.append(values[-1])
    if not every or sum(map(len, every)) < ROBUST_MIN_POINTS:
        return None
    body = np.concatenate(later)
    q1, q3 = np.quantile(body, (0.25, 0.75))
    fence = ROBUST_FENCE * (q3 - q1)  # Tukey's fences, wide: noise stays in, a 1% spike stays out
    low, high = max(float(body.min()), q1 - fence), min(float(body.max()), q3 + fence)
    low, high = min(low, *latest), max(high, *latest)
    pad = (high - low) * 0.1 or abs(high) * 0.1 or 1.0
    low, high = low - pad, high + pad
    full = np.concatenate(every)
    full_low, full_high = float(full.min()), float(full.max())
    if full_high - full_low <= 1.5 * (high - low):
        return None
    if not log and full_low >= 0:
        low = max(low, 0.0)  # a non-negative quantity's axis does not dip below zero
    outside = int(np.count_nonzero((full < low) | (full > high)))
    return (float(low), float(high)), outside


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
    run.  ``revision`` becomes ``layout.uirevision``: while it stays the same,
    a redraw with new data keeps the user's zoom and pan.
    """
    if x not in X_MODES:
        raise ValueError(f"x must be one of {sorted(X_MODES)}, got {x!r}")
    origin = pd.Timestamp(sessions[0].start_time) if sessions else None
    traces: list[dict[str, Any]] = []
    drawn_rows = sum(len(item.frame) for item in series if item.column in item.frame.columns)
    traces_per_row = 2 if smoothing > 0 else 1
    drawn: dict[bool, list[np.ndarray]] = {False: [], True: []}  # per axis, for the robust range
    spans: list[float] = []
    smoothed = smoothing > 0 and any(_smoothed(item) for item in series)
    legend = len({item.label for item in series}) > 1 or smoothed
    for number, item in enumerate(series):
        added = _add_series(traces, item, number, x=x, origin=origin, smoothing=smoothing, legend=legend,
                            points_per_row=max_points / max(drawn_rows, 1) / traces_per_row)  # fmt: skip
        drawn[item.secondary_y] += added[0]
        spans += added[1]
    lines = any(map(len, drawn.values()))  # no entry that tells lines apart on a chart of nothing logged
    if smoothed and lines:
        traces.append(legend_entry(RAW_NAME, group="raw", line={"color": KEY_COLOUR, "width": 1.5},
                                   opacity=RAW_OPACITY))  # fmt: skip
    if len(sessions) > 1 and any(item.colour is None for item in series) and lines:
        traces += session_legend(sessions)
    if not any(trace.get("yaxis") in (None, "y") for trace in traces):  # plotly draws no axis without a trace
        traces.append({"x": [], "y": [], "showlegend": False, "hoverinfo": "skip"})
    layout = chart_layout(traces, title=title, sessions=sessions, x=x, origin=origin, log_y=log_y, revision=revision,
                     highlights=highlights, theme=theme, spans=spans)  # fmt: skip
    robust = _y_axes(layout, series, drawn, log_y=log_y, theme=theme)
    layout["height"] = chart_height(traces, layout["margin"]["r"])  # a right axis narrows the legend
    if robust is not None:
        traces += _off_scale_markers(traces, robust, log=log_y, theme=theme)
    return figure_of(traces, layout)


def session_legend(sessions: Sequence[Session]) -> list[dict[str, Any]]:
    """A legend entry per session in its colour ("S2 · resume @ 60"): every chart whose lines are
    split by session says which is which, on every page and at phone width."""
    return [legend_entry(f"{label} · {what}", group="sessions", line={"color": colour, "width": 3})
            for label, colour, what in session_key(sessions)]  # fmt: skip


def legend_entry(name: str, *, group: str, mode: str = "lines", **style: Any) -> dict[str, Any]:
    """A legend entry for lines drawn by other traces: one null point, so plotly.js keeps it in
    the legend (a trace of no points is hidden, from the legend too) and draws nothing for it."""
    return dict(x=[None], y=[None], name=name, legendgroup=group, mode=mode, showlegend=True, hoverinfo="skip",
                **style)  # fmt: skip


def _smoothed(item: Series) -> bool:
    """Whether smoothing applies to ``item``: sparse series and event counts are drawn raw."""
    return not item.markers and item.column not in EVENT_COLUMNS


OFF_SCALE = "off-scale"  # the ``meta`` of the markers of points outside the default y-range
MAX_OFF_SCALE_MARKERS = 200


def _off_scale_markers(
    traces: Sequence[dict[str, Any]], y_range: tuple[float, float], *, log: bool, theme: str
) -> list[dict[str, Any]]:
    """Each raw point of the left axis outside ``y_range`` as a marker on the chart's edge (a
    triangle pointing where it lies, its value in the hover): the start of training that the
    default range leaves out stays in the chart itself.  An even sample of at most
    ``MAX_OFF_SCALE_MARKERS`` per edge."""
    low, high = y_range
    xs, ys = [], []
    for trace in traces:
        if trace.get("yaxis", "y") != "y" or str(trace.get("name", "")).endswith("(smoothed)") or trace.get("meta"):
            continue
        if trace.get("hoverinfo") == "skip":  # a legend entry or an axis holder: no data
            continue
        if trace.get("x") is None or not len(trace["x"]) or trace.get("mode") == "markers":
            continue
        xs.append(np.asarray(trace["x"]))
        ys.append(np.asarray(trace["y"], dtype=np.float64))
    if not xs:
        return []
    x, y = np.concatenate(xs), np.concatenate(ys)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.log10(y) if log else y
    markers = []
    for outside, edge, symbol in ((scaled > high, 1.0, "triangle-up"), (scaled < low, 0.0, "triangle-down")):
        rows = np.flatnonzero(outside & np.isfinite(scaled))
        if not len(rows):
            continue
        if len(rows) > MAX_OFF_SCALE_MARKERS:
            rows = rows[np.linspace(0, len(rows) - 1, MAX_OFF_SCALE_MARKERS).astype(np.int64)]
        # On the hidden 0–1 axis (``y3``), not at the edge's value: a new range moves no marker,
        # so a live update still only extends the chart.
        markers.append(dict(
            x=x[rows], y=np.full(len(rows), edge), customdata=y[rows], mode="markers",
            name=OFF_SCALE, meta=OFF_SCALE, showlegend=False, cliponaxis=False, yaxis="y3",
            marker={"symbol": symbol, "size": 7, "color": THEMES[theme]["muted"]},
            hovertemplate="off-scale: %{customdata:.4~g}<extra></extra>",
        ))  # fmt: skip
    return markers


def _y_axes(
    layout: dict[str, Any], series: Sequence[Series], drawn: dict[bool, list[np.ndarray]], *, log_y: bool, theme: str
) -> tuple[float, float] | None:
    """Titles, formats and default ranges of the primary (left) and secondary (right) y axes;
    the left axis' range when ``robust_range`` chose it (points may lie outside it)."""
    palette = THEMES[theme]
    off_scale = 0
    logged = False
    chosen = None
    for secondary in (False, True):
        axis = axis_for(series, secondary=secondary)
        if axis is None:
            continue
        log = log_y and not secondary
        settings = {"title": {"text": plotly_text(axis.title), "standoff": 4, "font": {"size": 11}},
                    "tickformat": axis.tickformat, "hoverformat": axis.hoverformat,
                    "exponentformat": "e", "separatethousands": True}  # fmt: skip
        values = np.concatenate(drawn[secondary]).astype(np.float64) if drawn[secondary] else np.zeros(0)
        logged |= bool(np.isfinite(values).any())
        if axis.fixed is not None and not log:
            settings["range"] = list(axis.fixed)
        elif axis.robust and (robust := robust_range(drawn[secondary], log=log)) is not None:
            settings["range"], outside = list(robust[0]), robust[1]
            off_scale += outside
            chosen = chosen if secondary else robust[0]
        else:
            settings.update(fitted_range(values, axis, log=log))
        if secondary:
            # tickmode "auto": plotly.js syncs an overlaying axis' ticks to the left grid by
            # default, which labels a count axis 3.54896, 15.6607, …
            settings = {"overlaying": "y", "side": "right", "showgrid": False, "zeroline": False,
                        "rangemode": "tozero", "tickmode": "auto", **settings}  # fmt: skip
            layout["margin"] = {**layout["margin"], "r": RIGHT_AXIS_PX}  # room for the right axis' ticks and title
        name = "yaxis2" if secondary else "yaxis"
        layout[name] = {**layout.get(name, {}), **settings}
    if not logged:  # no axis of made-up numbers around nothing
        layout["yaxis"] = {**layout["yaxis"], "showticklabels": False}
        layout.setdefault("annotations", []).append({
            "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper", "showarrow": False,
            "text": "none logged", "font": {"size": 13, "color": palette["muted"]},
        })  # fmt: skip
    if off_scale:
        layout.setdefault("annotations", []).append({
            "x": 1, "y": 0, "xref": "paper", "yref": "paper", "xanchor": "right", "yanchor": "bottom",
            "showarrow": False, "opacity": 0.9, "bgcolor": palette["plot"],
            "text": f"{off_scale:,} point{'s' if off_scale > 1 else ''} off-scale (▲ ▼ at the edge) · "
                    "autoscale ⤢ shows all",
            "font": {"size": 9, "color": palette["muted"]},
        })  # fmt: skip
    return chosen


def _add_series(
    traces: list[dict[str, Any]], item: Series, number: int, *, x: str, origin: pd.Timestamp | None, smoothing: float,
    points_per_row: float, legend: bool = True,
) -> tuple[list[np.ndarray], list[float]]:  # fmt: skip
    """Append ``item``'s traces to ``traces``; return the y values drawn (for the axis range) and the x extent."""
    frame = item.frame
    if item.column not in frame.columns or frame.empty:
        return [], []
    xs = x_values(frame, x, origin)
    ys = pd.to_numeric(frame[item.column], errors="coerce").to_numpy(dtype=np.float64)
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
    style = AXES.get(item.column) or _logged_axis(item)
    per_session = item.colour is None
    group = f"{number}:{label}"
    drawn: list[np.ndarray] = []
    finite_x = xs[np.isfinite(xs)] if xs.dtype.kind == "f" else xs
    extent = [float(np.min(finite_x)), float(np.max(finite_x))] if len(finite_x) else []
    if per_session and legend:  # one legend entry per series, in a neutral colour: sessions have theirs
        traces.append(legend_entry(
            label, group=group, mode="markers" if events or item.markers else "lines", yaxis=axis,
            line={"color": KEY_COLOUR, "dash": dash, "width": 2 if smoothing > 0 else 1.5},
            marker={"color": KEY_COLOUR, "size": 6},
        ))  # fmt: skip
    for code in np.unique(session_codes):
        for dimmed in (False, True):
            rows = np.flatnonzero((session_codes == code) & (superseded == dimmed))
            if not len(rows):
                continue
            suffix = "" if item.colour else f" · S{code + 1}"
            name = label + suffix + (" (superseded)" if dimmed else "")
            where = full + suffix + (" (superseded)" if dimmed else "")
            colour = item.colour or session_colour(int(code))
            opacity = SUPERSEDED_OPACITY if dimmed else 1.0
            raw, smooth = ys[rows], ema_smooth(ys[rows], smoothing) if smoothing > 0 else None
            budget = int(min(TRACE_POINTS, max(MIN_TRACE_POINTS, points_per_row * len(rows))))
            keep = minmax_indices(raw, budget)
            drawn.append(raw[keep])
            mode = "markers" if events else "lines+markers" if item.markers else "lines"
            at_step = "" if steps is None else " · step %{customdata:,}"
            hover = f"{where}: %{{y:{style.hoverformat}}}{at_step}<extra></extra>"
            traces.append(
                dict(
                    x=xs[rows][keep],
                    y=compact(raw[keep]),
                    name=name,
                    legendgroup=group,  # unique per series even when shortened labels collide
                    mode=mode,
                    yaxis=axis,
                    opacity=opacity * (RAW_OPACITY if smooth is not None else 1.0),
                    line={"color": colour, "dash": dash, "width": 1.5, "shape": "hv" if item.secondary_y
                          and item.column == "skipped_updates" else "linear"},
                    marker={"size": 7 if events else 4},
                    showlegend=not per_session and smooth is None,
                    connectgaps=False,
                    customdata=None if steps is None else steps[rows][keep],
                    hovertemplate=hover,
                )
            )  # fmt: skip
            if smooth is not None:
                keep = minmax_indices(smooth, budget)
                traces.append(
                    dict(
                        x=xs[rows][keep],
                        y=compact(smooth[keep]),
                        name=f"{name} (smoothed)",
                        legendgroup=group,
                        mode="lines",
                        yaxis=axis,
                        opacity=opacity,
                        line={"color": colour, "dash": dash, "width": 2},
                        connectgaps=False,
                        showlegend=not per_session,
                        customdata=None if steps is None else steps[rows][keep],
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
                        name=f"no successful update · S{code + 1}",
                        legendgroup="gaps",
                        showlegend=first_gap,
                        marker={
                            "symbol": "x-thin",
                            "size": 8,
                            "color": colour,
                            "line": {"width": 2, "color": colour},
                        },
                        hovertemplate=f"no successful update · S{code + 1}<extra></extra>",
                    )
                )
    return drawn, extent
