"""One series of a metric's chart as plotly traces, in steps that each do one thing and are tested alone.

``add_series`` turns a ``Series`` into its traces, one session part at a time (``series_parts``):

1. **values** (``series_values``): the column as floats; an event count only where it happened;
2. **smooth** (``ema_smooth``): TensorBoard's debiased EMA; sparse series and event counts stay raw;
3. **pick points** (``pick_points``): which points of a trace are drawn, within its share of the
   chart's budget (``trace_budget``), by the ``Downsampler`` the chart's caller passes in
   (``analysis.downsample.minmax_indices`` unless another is asked for): nothing here knows how
   the points were chosen;
4. **name** (``part_look``): a trace's legend name, hover name, colour and opacity, per session
   and superseded part;
5. **mark gaps** (``missing_rows``, ``gap_trace``): a missing value gets a marker on the chart's
   floor, and a value with a gap on both sides a marker of its own (``lone``);
6. **hover** (``hover``): the hover box's template, the step beside the value when x is not the step.

``metric_figures.metric_figure`` assembles the chart around them (legend, axes, layout).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.analysis.downsample import Downsampler, minmax_indices
from metrics_core.dashboard.display_text import plotly_text, shorten
from metrics_core.dashboard.figures.layout import (
    MIN_TRACE_POINTS,
    SUPERSEDED_OPACITY,
    TRACE_POINTS,
    compact,
    session_colour,
    x_values,
)
from metrics_core.dashboard.figures.metric_axes import axis_of
from metrics_core.dashboard.views.chart_specs import Series

DASHES = ("solid", "dot", "dash", "dashdot")
RAW_OPACITY = 0.25
LABEL_CHARS = 40  # a legend entry (a run name on the compare chart)
KEY_COLOUR = "#808495"  # legend entries that stand for lines of every session: neutral, sessions have colours
EVENT_COLUMNS = frozenset({"skipped_updates_in_window"})  # counts that are mostly 0: markers where they are not
HOVER_CHARS = 120  # a series name in the hover box: the full name, within reason
MARKED_POINTS = 100  # a sparse line's points keep their markers while they stay apart on a desktop chart
LONE_SUFFIX = "(lone points)"  # the trace of a line's points that no segment joins


@dataclass(frozen=True, slots=True)
class SeriesData:
    """What every trace of one series shares, computed once per series (``series_data``)."""

    item: Series
    xs: np.ndarray
    ys: np.ndarray  # ``series_values``
    steps: np.ndarray | None  # for the hover box, when x is not the step
    session_codes: np.ndarray  # per row; all 0 for a series in a colour of its own
    superseded: np.ndarray
    label: str  # the legend's name, shortened and made plain text
    full: str  # the hover box's name
    group: str  # the legend group: unique per series even when shortened labels collide
    dash: str
    axis: str
    events: bool
    smoothing: float  # 0 where smoothing does not apply (``smoothed``)
    hoverformat: str


@dataclass(frozen=True, slots=True)
class Look:
    """How one part of a series (a session's rows, superseded or not) is named and coloured."""

    name: str
    where: str  # the name in the hover box
    suffix: str  # the session's part of the name
    colour: str
    opacity: float


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


def legend_entry(name: str, *, group: str, mode: str = "lines", **style: Any) -> dict[str, Any]:
    """A legend entry for lines drawn by other traces: one null point, so plotly.js keeps it in
    the legend (a trace of no points is hidden, from the legend too) and draws nothing for it."""
    return dict(x=[None], y=[None], name=name, legendgroup=group, mode=mode, showlegend=True, hoverinfo="skip", **style)


def smoothed(item: Series) -> bool:
    """Whether smoothing applies to ``item``: sparse series and event counts are drawn raw."""
    return not item.markers and item.column not in EVENT_COLUMNS


def series_values(values: pd.Series, *, events: bool) -> np.ndarray:
    """A column as floats (NaN where missing or not a number); an event count is NaN where it is 0,
    so that only the windows where the event happened get a marker."""
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "iuf":  # pd.to_numeric costs more than the rest
        ys = values.to_numpy(dtype=np.float64)
    else:
        ys = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
    return np.where(ys > 0, ys, np.nan) if events else ys


def series_data(
    item: Series, number: int, *, x: str, origin: pd.Timestamp | None, smoothing: float
) -> SeriesData | None:
    """What ``item``'s traces share, or None when it has nothing to draw.  ``number`` picks its dash."""
    frame = item.frame
    if item.column not in frame.columns or frame.empty:
        return None
    xs = x_values(frame, x, origin)
    events = item.column in EVENT_COLUMNS
    label = plotly_text(shorten(item.label, LABEL_CHARS))
    return SeriesData(
        item=item,
        xs=xs,
        ys=series_values(frame[item.column], events=events),
        steps=frame["step"].to_numpy() if x != "step" and "step" in frame.columns else None,
        session_codes=frame["session_id"].cat.codes.to_numpy() if item.colour is None else np.zeros(len(frame), int),
        superseded=item.superseded if item.superseded is not None else np.zeros(len(frame), dtype=bool),
        label=label,
        full=plotly_text(shorten(item.label, HOVER_CHARS)),
        group=f"{number}:{label}",
        dash=DASHES[number % len(DASHES)],
        axis="y2" if item.secondary_y else "y",
        events=events,
        smoothing=smoothing if smoothed(item) else 0.0,
        hoverformat=axis_of(item.column, frame).hoverformat,
    )


def series_parts(data: SeriesData, every_session: bool) -> Iterator[tuple[int, bool, np.ndarray]]:
    """``(session code, dimmed, rows)`` per part of a series that holds rows: each session's
    effective rows, then its superseded ones (``session_parts``)."""
    effective = ~data.superseded
    for code, in_session in session_parts(data.session_codes, every_session):
        for dimmed in (False, True):
            rows = np.flatnonzero(in_session & (data.superseded if dimmed else effective))
            if len(rows):
                yield code, dimmed, rows


def session_parts(codes: np.ndarray, every_session: bool) -> list[tuple[int, np.ndarray]]:
    """``(session code, its rows as a mask)`` per session a series' rows hold; with
    ``every_session`` (the run has more than ``SESSION_TRACES``), one part of every row, code -1:
    a trace per session would cost a pass over the rows, and plotly.js a trace, per session."""
    if every_session:
        return [(-1, np.ones(len(codes), dtype=bool))]
    return [(int(code), codes == code) for code in np.unique(codes)]


def trace_budget(points_per_row: float, rows: int) -> int:
    """A trace's share of the chart's points: its rows' share, within ``MIN_TRACE_POINTS``..``TRACE_POINTS``."""
    return int(min(TRACE_POINTS, max(MIN_TRACE_POINTS, points_per_row * rows)))


def pick_points(values: np.ndarray, budget: int, downsample: Downsampler) -> np.ndarray:
    """Sorted indices of ``values`` to draw, about ``budget`` at most, chosen by ``downsample``."""
    return downsample(values, budget)


def part_look(data: SeriesData, code: int, dimmed: bool) -> Look:
    """A part's names (" · S2" per session, " · every session" for the one trace of them all,
    nothing for a series in a colour of its own; " (superseded)" when dimmed) and colour."""
    item = data.item
    suffix = "" if item.colour else f" · S{code + 1}" if code >= 0 else " · every session"
    tail = suffix + (" (superseded)" if dimmed else "")
    return Look(
        name=data.label + tail,
        where=data.full + tail,
        suffix=suffix,
        colour=item.colour or (session_colour(int(code)) if code >= 0 else KEY_COLOUR),
        opacity=SUPERSEDED_OPACITY if dimmed else 1.0,
    )


def hover(where: str, hoverformat: str, *, at_step: bool) -> str:
    """The hover box: the trace's name and value, and the step when x is something else."""
    step = " · step %{customdata:,}" if at_step else ""
    return f"{where}: %{{y:{hoverformat}}}{step}<extra></extra>"


def lone(values: np.ndarray) -> np.ndarray:
    """Per drawn point, whether it holds a value and neither point beside it does: a line drawn
    through gaps shows nothing there (a key logged every thousand records, among rows that lack it)."""
    finite = np.isfinite(values)
    beside = np.zeros(len(values), dtype=bool)
    beside[1:] |= finite[:-1]
    beside[:-1] |= finite[1:]
    return finite & ~beside


def missing_rows(rows: np.ndarray, values: np.ndarray, budget: int) -> np.ndarray:
    """Which of ``rows`` (holding ``values``) miss their value, an even sample of ``budget`` at
    most: markers only point at gaps, and the JSON stays bounded."""
    missing = rows[~np.isfinite(values)]
    if len(missing) > budget:
        missing = np.unique(missing[np.linspace(0, len(missing) - 1, budget).astype(np.int64)])
    return missing


def gap_trace(xs: np.ndarray, look: Look, *, first: bool) -> dict[str, Any]:
    """Markers on the chart's floor at ``xs``, where a value is missing; the ``first`` of the chart
    has the legend entry."""
    what = f"no successful update{look.suffix}"
    return dict(
        x=xs,
        y=np.full(len(xs), 0.03),
        yaxis="y3",
        mode="markers",
        name=what,
        legendgroup="gaps",
        showlegend=first,
        marker={"symbol": "x-thin", "size": 8, "color": look.colour, "line": {"width": 2, "color": look.colour}},
        hovertemplate=f"{what}<extra></extra>",
    )


def add_series(
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
    downsample: Downsampler = minmax_indices,
) -> tuple[list[np.ndarray], list[float]]:
    """Append ``item``'s traces to ``traces``; return the y values drawn (for the axis range) and the x extent."""
    data = series_data(item, number, x=x, origin=origin, smoothing=smoothing)
    if data is None:
        return [], []
    finite_x = data.xs[np.isfinite(data.xs)] if data.xs.dtype.kind == "f" else data.xs
    extent = [float(np.min(finite_x)), float(np.max(finite_x))] if len(finite_x) else []
    if item.colour is None and legend:  # one legend entry per series, in a neutral colour: sessions have theirs
        traces.append(
            legend_entry(
                data.label,
                group=data.group,
                mode="markers" if data.events or item.markers else "lines",
                yaxis=data.axis,
                line={"color": KEY_COLOUR, "dash": data.dash, "width": 2 if data.smoothing > 0 else 1.5},
                marker={"color": KEY_COLOUR, "size": 6},
            )
        )
    drawn = [
        _add_part(traces, data, code, dimmed, rows, trace_budget(points_per_row, len(rows)), downsample)
        for code, dimmed, rows in series_parts(data, every_session)
    ]
    return drawn, extent


def _add_part(
    traces: list[dict[str, Any]],
    data: SeriesData,
    code: int,
    dimmed: bool,
    rows: np.ndarray,
    budget: int,
    downsample: Downsampler,
) -> np.ndarray:
    """Append one part's traces (its line, lone points, smoothed line, gaps); return the values drawn."""
    item = data.item
    look = part_look(data, code, dimmed)
    raw = data.ys[rows]
    smooth = ema_smooth(raw, data.smoothing) if data.smoothing > 0 else None
    keep = pick_points(raw, budget, downsample)
    mode = "markers" if data.events else "lines+markers" if item.markers and len(keep) <= MARKED_POINTS else "lines"
    hovertemplate = hover(look.where, data.hoverformat, at_step=data.steps is not None)
    traces.append(
        dict(
            **_points(data, code, rows[keep], raw[keep]),
            name=look.name,
            legendgroup=data.group,
            mode=mode,
            yaxis=data.axis,
            opacity=look.opacity * (RAW_OPACITY if smooth is not None else 1.0),
            line={
                "color": look.colour,
                "dash": data.dash,
                "width": 1.5,
                "shape": "hv" if item.secondary_y and item.column == "skipped_updates" else "linear",
            },
            marker={"size": 7 if data.events else 4},
            showlegend=item.colour is not None and smooth is None,
            connectgaps=False,
            hovertemplate=hovertemplate,
        )
    )
    alone = lone(raw[keep]) if mode == "lines" else None
    if alone is not None and alone.any():  # no line reaches them: a marker each, or nothing shows
        kept = rows[keep][alone]
        traces.append(
            dict(
                x=data.xs[kept],
                y=compact(raw[keep][alone]),
                name=f"{look.name} {LONE_SUFFIX}",
                legendgroup=data.group,
                mode="markers",
                yaxis=data.axis,
                opacity=look.opacity,
                marker={"color": look.colour, "size": 6},
                showlegend=False,
                customdata=None if data.steps is None else data.steps[kept],
                hovertemplate=hovertemplate,
            )
        )
    if smooth is not None:
        picked = pick_points(smooth, budget, downsample)
        traces.append(
            dict(
                **_points(data, code, rows[picked], smooth[picked]),
                name=f"{look.name} (smoothed)",
                legendgroup=data.group,
                mode="lines",
                yaxis=data.axis,
                opacity=look.opacity,
                line={"color": look.colour, "dash": data.dash, "width": 2},
                connectgaps=False,
                showlegend=item.colour is not None,
                hovertemplate=hover(f"{look.where} (smoothed)", data.hoverformat, at_step=data.steps is not None),
            )
        )
    if item.gap_markers:
        missing = missing_rows(rows, raw, budget)
        if len(missing):
            first = not any(trace.get("legendgroup") == "gaps" for trace in traces)
            traces.append(gap_trace(data.xs[missing], look, first=first))
    return raw[keep]


def _points(data: SeriesData, code: int, kept: np.ndarray, values: np.ndarray) -> dict[str, Any]:
    """A trace's ``x``, ``y`` and ``customdata`` (the steps) at rows ``kept``; in the trace of every
    session (``code`` -1), a missing point where a session begins, so that no line joins two sessions."""
    sessions, x, y = data.session_codes[kept], data.xs[kept], compact(values)
    steps = None if data.steps is None else data.steps[kept]
    if code >= 0 or len(sessions) < 2:
        return {"x": x, "y": y, "customdata": steps}
    starts = np.flatnonzero(sessions[1:] != sessions[:-1]) + 1
    return {
        "x": np.insert(x.astype(np.float64), starts, np.nan),
        "y": np.insert(y, starts, np.nan),
        "customdata": None if steps is None else np.insert(steps.astype(np.float64), starts, np.nan),
    }
