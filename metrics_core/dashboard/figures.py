"""Pure figure builders: frames and sessions in, ``plotly.graph_objects.Figure`` out.

Nothing here reads files or knows Streamlit, so every rule of what a chart shows is tested
without a server:

* each session has its own colour, and each later session's start is a labelled vertical line
  ("S2 · resume @ 60");
* superseded records (work a later session redid) are drawn dimmed, never hidden;
* smoothing is TensorBoard's debiased EMA, with the raw line kept faint behind it;
* a missing value (a window with no successful update) breaks the line and gets a marker on the
  chart's floor: never interpolated over;
* every trace is downsampled by ``minmax_indices`` (spikes and the last point survive);
* titles, trace names and labels are untrusted (a run name, a directory name): plotly.js renders
  a subset of HTML in them, so each is passed through ``plotly_text`` (and shortened) here, at
  the sink, and callers hand over raw strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from metrics_core.dashboard.overview import plotly_text, shorten
from metrics_core.downsample import minmax_indices
from metrics_core.reader import Session

SESSION_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
X_MODES = {"step": "step", "tokens_seen": "tokens seen", "time": "wall time", "relative": "hours since start"}
DASHES = ("solid", "dot", "dash", "dashdot")
SUPERSEDED_OPACITY = 0.3
RAW_OPACITY = 0.25
CHART_POINTS = 8000  # drawn points per chart, shared by its traces
TRACE_POINTS = 4000
MIN_TRACE_POINTS = 200
LABEL_CHARS = 40  # a legend entry (a run name on the compare chart)


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


@dataclass(frozen=True, slots=True)
class Highlight:
    """A shaded x-range with a label (a replay window)."""

    x0: float
    x1: float
    label: str
    colour: str


def session_colour(index: int) -> str:
    return SESSION_COLOURS[index % len(SESSION_COLOURS)]


def ema_smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's debiased EMA: ``last = w·last + (1−w)·y`` from 0, shown as ``last / (1 − wⁿ)``.

    ``n`` counts finite points; non-finite points stay NaN and do not advance the average.
    Vectorised in blocks short enough that ``w⁻ᵏ`` stays finite (a Python loop costs ~0.5 s per
    million points; this is ~100× less).
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


def x_values(frame: pd.DataFrame, x: str, origin: pd.Timestamp | None) -> np.ndarray:
    """The x coordinate of each row for an x-axis mode (``X_MODES``).

    Wall time is milliseconds since the epoch on a date axis: 8 bytes a point in the figure's
    binary encoding, where ISO strings would cost ~30.
    """
    if x == "relative":
        start = origin if origin is not None else frame["time"].min()
        return ((frame["time"] - start).dt.total_seconds() / 3600.0).to_numpy()
    if x == "time":
        return frame["time"].astype("int64").to_numpy() / 1e6
    return frame[x].to_numpy()


def _session_x(session: Session, x: str, origin: pd.Timestamp | None) -> object:
    if x == "step":
        return session.first_step
    if x == "tokens_seen":
        return session.first_tokens_seen
    start = pd.Timestamp(session.start_time)
    if x == "time":
        return start.value / 1e6
    return (start - origin).total_seconds() / 3600.0 if origin is not None else 0.0


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
) -> go.Figure:
    """A line chart of ``series`` split by session, with session boundaries marked.

    ``max_points`` is the chart's budget of drawn points, shared among its traces in proportion
    to their rows (at most ``TRACE_POINTS`` each), which keeps any chart near 150 KB of JSON
    however long the run.  ``revision`` becomes ``layout.uirevision``: while it stays the same,
    a redraw with new data keeps the user's zoom and pan.
    """
    if x not in X_MODES:
        raise ValueError(f"x must be one of {sorted(X_MODES)}, got {x!r}")
    origin = pd.Timestamp(sessions[0].start_time) if sessions else None
    figure = go.Figure()
    drawn_rows = sum(len(item.frame) for item in series if item.column in item.frame.columns)
    traces_per_row = 2 if smoothing > 0 else 1
    for number, item in enumerate(series):
        _add_series(figure, item, number, x=x, origin=origin, smoothing=smoothing,
                    points_per_row=max_points / max(drawn_rows, 1) / traces_per_row)  # fmt: skip
    # Shapes and annotations as plain dicts in one layout update: plotly's add_vline/add_vrect
    # cost ~20 ms each in validation, which was half of a chart's build time on a long run.
    shapes, annotations = [], []
    for session in sessions[1:]:
        at, colour = _session_x(session, x, origin), session_colour(session.index)
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": at, "x1": at, "y0": 0, "y1": 1,
                       "line": {"color": colour, "width": 1.5, "dash": "dash"}})  # fmt: skip
        annotations.append({"x": at, "y": 1.0, "xref": "x", "yref": "paper", "yanchor": "bottom", "showarrow": False,
                            "text": f"S{session.index + 1} · resume @ {session.resume_step}",
                            "font": {"size": 10, "color": colour}})  # fmt: skip
    for highlight in highlights:
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": highlight.x0, "x1": highlight.x1,
                       "y0": 0, "y1": 1, "fillcolor": highlight.colour, "opacity": 0.15, "line": {"width": 0},
                       "layer": "below"})  # fmt: skip
        annotations.append({"x": highlight.x0, "y": 1.0, "xref": "x", "yref": "paper", "xanchor": "left",
                            "yanchor": "top", "showarrow": False, "text": plotly_text(shorten(highlight.label)),
                            "font": {"size": 10}})  # fmt: skip
    figure.update_layout(
        template="none",  # the default template adds ~10 KB of styling JSON to every update
        font={"family": "sans-serif", "size": 11, "color": "#31333f"},
        plot_bgcolor="white",
        title={"text": plotly_text(shorten(title)), "x": 0.01, "font": {"size": 14}},
        height=330,
        margin={"l": 50, "r": 20, "t": 50, "b": 30},
        uirevision=revision or title,
        hovermode="x unified",
        legend={"orientation": "h", "y": -0.12, "yanchor": "top", "font": {"size": 10}},
        xaxis={
            "title": {"text": X_MODES[x], "standoff": 2, "font": {"size": 11}},
            "type": "date" if x == "time" else "linear",
            "gridcolor": "#eee",
            "zeroline": False,
        },
        yaxis={"type": "log" if log_y else "linear", "gridcolor": "#eee", "zeroline": False},
        yaxis3={"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
        shapes=shapes,
        annotations=annotations,
    )
    if any(item.secondary_y for item in series):
        figure.update_layout(yaxis2={"overlaying": "y", "side": "right", "showgrid": False})
    return figure


def _compact(values: np.ndarray) -> np.ndarray:
    """float32 halves the figure's bytes; 7 significant digits are more than a chart can show."""
    if np.nanmax(np.abs(values), initial=0.0) < 3e38:
        return values.astype(np.float32)
    return values


def _add_series(
    figure: go.Figure, item: Series, number: int, *, x: str, origin: pd.Timestamp | None, smoothing: float,
    points_per_row: float,
) -> None:  # fmt: skip
    frame = item.frame
    if item.column not in frame.columns or frame.empty:
        return
    xs = x_values(frame, x, origin)
    ys = pd.to_numeric(frame[item.column], errors="coerce").to_numpy(dtype=np.float64)
    session_codes = frame["session_id"].cat.codes.to_numpy() if item.colour is None else np.zeros(len(frame), int)
    superseded = item.superseded if item.superseded is not None else np.zeros(len(frame), dtype=bool)
    dash = DASHES[number % len(DASHES)]
    label = plotly_text(shorten(item.label, LABEL_CHARS))
    axis = "y2" if item.secondary_y else "y"
    for code in np.unique(session_codes):
        for dimmed in (False, True):
            rows = np.flatnonzero((session_codes == code) & (superseded == dimmed))
            if not len(rows):
                continue
            name = (label if item.colour else f"{label} · S{code + 1}") + (" (superseded)" if dimmed else "")
            colour = item.colour or session_colour(int(code))
            opacity = SUPERSEDED_OPACITY if dimmed else 1.0
            raw, smooth = ys[rows], ema_smooth(ys[rows], smoothing) if smoothing > 0 else None
            budget = int(min(TRACE_POINTS, max(MIN_TRACE_POINTS, points_per_row * len(rows))))
            keep = minmax_indices(raw, budget)
            mode = "lines+markers" if item.markers else "lines"
            figure.add_trace(
                go.Scatter(
                    x=xs[rows][keep],
                    y=_compact(raw[keep]),
                    name=name,
                    legendgroup=f"{number}:{name}",  # unique per series even when shortened labels collide
                    mode=mode,
                    yaxis=axis,
                    opacity=opacity * (RAW_OPACITY if smooth is not None else 1.0),
                    line={"color": colour, "dash": dash, "width": 1.5},
                    marker={"size": 4},
                    showlegend=smooth is None,
                    connectgaps=False,
                )
            )
            if smooth is not None:
                keep = minmax_indices(smooth, budget)
                figure.add_trace(
                    go.Scatter(
                        x=xs[rows][keep],
                        y=_compact(smooth[keep]),
                        name=f"{name} (smoothed)",
                        legendgroup=f"{number}:{name}",
                        mode="lines",
                        yaxis=axis,
                        opacity=opacity,
                        line={"color": colour, "dash": dash, "width": 2},
                        connectgaps=False,
                    )
                )
            missing = rows[~np.isfinite(raw)]
            if len(missing) > budget:  # markers only point at gaps: an even sample keeps the JSON bounded
                missing = np.unique(missing[np.linspace(0, len(missing) - 1, budget).astype(np.int64)])
            if item.gap_markers and len(missing):
                figure.add_trace(
                    go.Scatter(
                        x=xs[missing],
                        y=np.full(len(missing), 0.03),
                        yaxis="y3",
                        mode="markers",
                        name=f"no successful update · S{code + 1}",
                        legendgroup="gaps",
                        marker={
                            "symbol": "x-thin",
                            "size": 8,
                            "color": colour,
                            "line": {"width": 2, "color": colour},
                        },
                        hovertemplate="no successful update<extra></extra>",
                    )
                )
