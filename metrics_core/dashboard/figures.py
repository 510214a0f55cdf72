"""Pure figure builders: frames and sessions in, a plotly figure (``Figure``, plotly's own JSON
structure) out.

Nothing here reads files or knows Streamlit, so every rule of what a chart shows is tested
without a server:

* each session has its own colour, and each later session's start is a labelled vertical line
  ("S2 · resume @ 60");
* superseded records (work a later session redid) are drawn dimmed, never hidden;
* smoothing is TensorBoard's debiased EMA, with the raw line kept faint behind it;
* a missing value (a window with no successful update) breaks the line and gets a marker on the
  chart's floor: never interpolated over;
* every trace is downsampled by ``minmax_indices`` (spikes and the last point survive);
* every axis is titled with its unit and formatted on purpose (``AXES``, by column): loss,
  fraction 0–1, count, tokens/s, learning rate in ``2.5e-4`` notation, steps and tokens in SI
  (``2k``, ``22M``), so no ``250µ`` stands next to ``2k``;
* the default y-range is robust (``robust_range``): an initial loss of 10 does not flatten a
  curve that lives around 2; plotly's autoscale button (or a double-click) shows the full range,
  and a note on the chart says how many points are off-scale;
* a sparse series (validation every N steps, ``markers=True``) is drawn raw with markers, never
  smoothed like the dense series beside it;
* resume labels never overlap: each is placed, in one of two rows, only where it fits at the
  narrowest plot width we support (``MIN_PLOT_PX``), full ("S3 · resume @ 120") or short
  ("S3"), else left to the hover of a marker on the boundary line;
* legends are compact: a session-split chart lists its series once (not once per session); the
  page shows one session key (``session_key``) for all its charts;
* ``theme`` ("light"/"dark") colours the figure like the Streamlit theme around it;
* titles, trace names and labels are untrusted (a run name, a directory name): plotly.js renders
  a subset of HTML in them, so each is passed through ``plotly_text`` (and shortened) here, at
  the sink, and callers hand over raw strings.

Figures are plain trace and layout dicts (``figure_of``), never plotly objects: plotly's
per-property validation cost ~90 ms per chart (six charts: half a second of server CPU per live
update of even a 100-record run), and even unvalidated, a ``go.Figure`` deep-copies every trace
and the layout and ``to_plotly_json`` copies them again (~3 ms per chart: two thirds of a live
append's work on a 1k-record run).  ``tests/test_figures.py`` validates the same dicts with
plotly and compares the JSON (``figure_json``), so a typo still fails there.  The dashboard
imports no plotly at all; plotly.js draws the JSON.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pandas as pd

from metrics_core.dashboard.display_text import plotly_text, shorten
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
HOVER_CHARS = 120  # a series name in the hover box: the full name, within reason
MIN_PLOT_PX = 300  # the narrowest plot area resume labels must fit (a phone, 390 px wide)
LABEL_FONT = 10
LABEL_CHAR_PX = 6.2  # an upper bound of a 10 px sans-serif glyph's advance
LABEL_ROWS = 2
LABEL_ROW_PX = 16  # a 10 px label's box is ~14 px tall
ROBUST_SKIP = 0.1  # the first 10% of a series (warm-up: the initial loss of 10) does not set the range
ROBUST_FENCE = 3.0  # interquartile ranges beyond the quartiles
ROBUST_MIN_POINTS = 20
# What plotly's ``template="none"`` validates to (a test compares): every figure carries it, so
# plotly.js applies no default template (~10 KB of styling JSON per update).
NO_TEMPLATE = {"data": {"scatter": [{"type": "scatter"}]}}


@dataclass(frozen=True, slots=True)
class Axis:
    """How a quantity's axis reads: its title with the unit, and d3 formats for ticks and hover.

    ``fixed`` pins the range (a fraction is 0–1); ``robust`` lets ``robust_range`` choose the
    default range (counts that only grow need none).
    """

    title: str
    tickformat: str = ".3~g"
    hoverformat: str = ".4~g"
    fixed: tuple[float, float] | None = None
    robust: bool = True


AXES = {
    "train_loss": Axis("loss"),
    "val_loss": Axis("loss"),
    "clipped_fraction": Axis("fraction clipped (0–1)", ".1~f", ".3~f", fixed=(-0.02, 1.02)),
    "skipped_updates_in_window": Axis("skipped in window (count)", ",~g", ",d", robust=False),
    "skipped_updates": Axis("skipped, cumulative (count)", "~s", ",d", robust=False),
    "grad_norm_avg": Axis("gradient norm (L2)"),
    "grad_norm_max": Axis("gradient norm (L2)"),
    "lr": Axis("learning rate", ".1~e", ".3~e"),
    "tokens_per_s": Axis("throughput (tokens/s)", "~s", ",.0f"),
}
X_AXES = {
    "step": Axis("step", "~s", ","),
    "tokens_seen": Axis("tokens seen", "~s", ","),
    "time": Axis("wall time (UTC)", "", ""),
    "relative": Axis("hours since start (h)", ".3~f", ".3~f"),
}
# Streamlit's own palettes (its default light and dark themes), so a chart sits in the page.
THEMES = {
    "light": {"font": "#31333f", "paper": "#ffffff", "plot": "#ffffff", "grid": "#e6e9ef", "muted": "#808495"},
    "dark": {"font": "#fafafa", "paper": "#0e1117", "plot": "#0e1117", "grid": "#31333f", "muted": "#a3a8b8"},
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


def axis_for(series: Sequence[Series], *, secondary: bool) -> Axis | None:
    """The axis of the first series drawn on that side: its column's ``AXES`` entry, or its label."""
    for item in series:
        if item.secondary_y == secondary:
            return AXES.get(item.column, Axis(item.label))
    return None


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


class Props:
    """A read-only view of a plotly property dict, read as plotly's objects read: ``trace.name`` is
    ``trace["name"]`` and None when unset; nested dicts and lists of dicts are views too."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _view(self._values.get(name))

    def __getitem__(self, name: str) -> Any:
        return _view(self._values.get(name))


def _view(value: Any) -> Any:
    if isinstance(value, dict):
        return Props(value)
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [Props(item) for item in value]
    return value


class Figure(dict):
    """A figure as plotly's JSON structure: ``{"data": [trace dicts], "layout": {...}}``, per-point
    properties as numpy arrays.  Never changed once built: figures are memoised per snapshot and
    shared by every tab.  ``figure.data[0].name`` and ``figure.layout.yaxis.range`` read it as
    plotly's objects do (``Props``); ``st.plotly_chart`` takes it as the dict it is."""

    @property
    def data(self) -> list[Props]:
        return [Props(trace) for trace in self["data"]]

    @property
    def layout(self) -> Props:
        return Props(self["layout"])


def figure_of(traces: Sequence[dict[str, Any]], layout: dict[str, Any]) -> Figure:
    """``traces`` and ``layout`` (plotly's own property names) as a figure, unvalidated and uncopied
    (see the module docstring); properties set to None are left out, as plotly leaves them out."""
    data = [{"type": "scatter", **{name: value for name, value in trace.items() if value is not None}}
            for trace in traces]  # fmt: skip
    return Figure(data=data, layout=layout)


# numpy dtypes plotly.js reads from base64 ("typed arrays"), by the names plotly.py gives them.
TYPED_ARRAYS = {"int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4", "uint32": "u4",
                "float32": "f4", "float64": "f8"}  # fmt: skip
_UNPACKED_KEYS = ("range",)  # plotly.py leaves these lists as lists


def typed_array(values: np.ndarray) -> Any:
    """``values`` as plotly.py sends an array: base64 of its bytes in the narrowest integer type
    (plotly.js has no 64-bit integers), 8 or 4 bytes a float; else a plain list."""
    if values.size and values.dtype.kind in "iu" and values.dtype.itemsize == 8:
        low, high = int(values.min()), int(values.max())
        for kind in ("int8", "int16", "int32") if values.dtype.kind == "i" else ("uint8", "uint16", "uint32"):
            info = np.iinfo(kind)
            if info.min <= low and high <= info.max:
                values = values.astype(kind)
                break
    short = TYPED_ARRAYS.get(str(values.dtype))
    if not values.size or short is None:
        return values.tolist()
    packed = {"dtype": short, "bdata": base64.b64encode(np.ascontiguousarray(values)).decode("ascii")}
    if values.ndim > 1:
        packed["shape"] = str(values.shape)[1:-1]
    return packed


def _packed(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: item if key in _UNPACKED_KEYS else _packed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_packed(item) for item in value]
    if isinstance(value, np.ndarray):
        return typed_array(value)
    return value


def _plain(value: Any) -> Any:
    """What orjson cannot write itself: numpy object arrays, pandas timestamps."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    raise TypeError(f"not JSON: {type(value).__name__}")


def json_text(value: Any, *, sort_keys: bool = False) -> str:
    """``value`` as JSON (NaN and infinities as null, as plotly.py writes them); numpy arrays as lists."""
    option = orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_SORT_KEYS if sort_keys else 0)
    return orjson.dumps(value, option=option, default=_plain).decode()


def figure_json(figure: dict[str, Any]) -> str:
    """``figure`` as the JSON plotly.py would send for it: numeric arrays packed (``typed_array``)."""
    return json_text(_packed(figure))


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
    to their rows (at most ``TRACE_POINTS`` each), which keeps any chart near 150 KB of JSON
    however long the run.  ``revision`` becomes ``layout.uirevision``: while it stays the same,
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
    legend = len({item.label for item in series}) > 1
    for number, item in enumerate(series):
        added = _add_series(traces, item, number, x=x, origin=origin, smoothing=smoothing, legend=legend,
                            points_per_row=max_points / max(drawn_rows, 1) / traces_per_row)  # fmt: skip
        drawn[item.secondary_y] += added[0]
        spans += added[1]
    if not any(trace.get("yaxis") in (None, "y") for trace in traces):  # plotly draws no axis without a trace
        traces.append({"x": [], "y": [], "showlegend": False, "hoverinfo": "skip"})
    layout = _layout(traces, title=title, sessions=sessions, x=x, origin=origin, log_y=log_y, revision=revision,
                     highlights=highlights, theme=theme, spans=spans)  # fmt: skip
    _y_axes(layout, series, drawn, log_y=log_y, theme=theme)
    return figure_of(traces, layout)


def _y_axes(
    layout: dict[str, Any], series: Sequence[Series], drawn: dict[bool, list[np.ndarray]], *, log_y: bool, theme: str
) -> None:
    """Titles, formats and default ranges of the primary (left) and secondary (right) y axes."""
    palette = THEMES[theme]
    off_scale = 0
    for secondary in (False, True):
        axis = axis_for(series, secondary=secondary)
        if axis is None:
            continue
        log = log_y and not secondary
        settings = {"title": {"text": plotly_text(axis.title), "standoff": 4, "font": {"size": 11}},
                    "tickformat": axis.tickformat, "hoverformat": axis.hoverformat,
                    "exponentformat": "e", "separatethousands": True}  # fmt: skip
        if axis.fixed is not None and not log:
            settings["range"] = list(axis.fixed)
        elif axis.robust and (robust := robust_range(drawn[secondary], log=log)) is not None:
            settings["range"], outside = list(robust[0]), robust[1]
            off_scale += outside
        if secondary:
            # tickmode "auto": plotly.js syncs an overlaying axis' ticks to the left grid by
            # default, which labels a count axis 3.54896, 15.6607, …
            settings.update(overlaying="y", side="right", showgrid=False, zeroline=False, rangemode="tozero",
                            tickmode="auto")  # fmt: skip
            layout["margin"] = {**layout["margin"], "r": 65}  # room for the right axis' ticks and title
        name = "yaxis2" if secondary else "yaxis"
        layout[name] = {**layout.get(name, {}), **settings}
    if off_scale:
        layout.setdefault("annotations", []).append({
            "x": 1, "y": 0, "xref": "paper", "yref": "paper", "xanchor": "right", "yanchor": "bottom",
            "showarrow": False, "opacity": 0.9, "bgcolor": palette["plot"],
            "text": f"{off_scale:,} point{'s' if off_scale > 1 else ''} off-scale · autoscale ⤢ shows all",
            "font": {"size": 9, "color": palette["muted"]},
        })  # fmt: skip


def resume_labels(positions: Sequence[tuple[float, str, str]], *, span: float) -> list[tuple[str, int] | None]:
    """Where each session boundary's label goes so that no two overlap at ``MIN_PLOT_PX`` or wider.

    ``positions`` are (x, full label, short label) in x order; ``span`` the x-axis range they sit in.
    Each label is tried full then short, in row 0 then row 1; one that fits nowhere is None (its
    boundary keeps a hover marker).  A wider plot (or a zoom) only moves labels apart, so a layout
    that fits at the narrowest width fits at every width.
    """
    scale = MIN_PLOT_PX / span if span > 0 else 0.0
    rows: list[list[tuple[float, float]]] = [[] for _ in range(LABEL_ROWS)]
    placed: list[tuple[str, int] | None] = []
    for at, full, short in positions:
        choice = None
        for text in (full, short):
            half = (len(text) * LABEL_CHAR_PX + 6) / 2
            left, right = at * scale - half, at * scale + half
            for row, taken in enumerate(rows):
                if all(right <= other_left or left >= other_right for other_left, other_right in taken):
                    taken.append((left, right))
                    choice = (text, row)
                    break
            if choice:
                break
        placed.append(choice)
    return placed


def _layout(
    traces: list[dict[str, Any]], *, title: str, sessions: Sequence[Session], x: str, origin: pd.Timestamp | None,
    log_y: bool, revision: str, highlights: Sequence[Highlight], theme: str = "light", spans: Sequence[float] = (),
) -> dict[str, Any]:  # fmt: skip
    """The layout every chart shares: session boundary lines, shaded highlights, axes, legend;
    appends the session-start markers' trace to ``traces``."""
    palette = THEMES[theme]
    shapes, annotations = [], []
    boundaries = [(_session_x(session, x, origin), session) for session in sessions[1:]]
    edges = [float(at) for at, _ in boundaries] + [float(value) for value in spans]
    span = max(edges) - min(edges) if edges else 0.0
    labels = resume_labels([(float(at), f"S{s.index + 1} · resume @ {s.resume_step}", f"S{s.index + 1}")
                            for at, s in boundaries], span=span)  # fmt: skip
    for (at, session), label in zip(boundaries, labels, strict=True):
        colour = session_colour(session.index)
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": at, "x1": at, "y0": 0, "y1": 1,
                       "line": {"color": colour, "width": 1.5, "dash": "dash"}})  # fmt: skip
        if label is not None:
            annotations.append({"x": at, "y": 1.0, "xref": "x", "yref": "paper", "yanchor": "bottom",
                                "yshift": label[1] * LABEL_ROW_PX, "showarrow": False, "text": label[0],
                                "hovertext": f"S{session.index + 1} · resume @ {session.resume_step}",
                                "font": {"size": LABEL_FONT, "color": colour}})  # fmt: skip
    if boundaries:  # every boundary's full label in the hover of a marker at its top, placed or not
        traces.append(dict(
            x=[at for at, _ in boundaries], y=[1.0] * len(boundaries), yaxis="y3", mode="markers",
            name="session starts", showlegend=False, cliponaxis=False,
            marker={"symbol": "triangle-down", "size": 7, "color": [session_colour(s.index) for _, s in boundaries]},
            hovertext=[f"S{s.index + 1} · resume @ {s.resume_step}" for _, s in boundaries],
            hovertemplate="%{hovertext}<extra></extra>",
        ))  # fmt: skip
    for highlight in highlights:
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": highlight.x0, "x1": highlight.x1,
                       "y0": 0, "y1": 1, "fillcolor": highlight.colour, "opacity": 0.15, "line": {"width": 0},
                       "layer": "below"})  # fmt: skip
        annotations.append({"x": highlight.x0, "y": 1.0, "xref": "x", "yref": "paper", "xanchor": "left",
                            "yanchor": "top", "showarrow": False, "text": plotly_text(shorten(highlight.label)),
                            "font": {"size": 10}})  # fmt: skip
    x_axis = X_AXES[x]
    layout = dict(
        template=NO_TEMPLATE,  # the default template adds ~10 KB of styling JSON to every update
        font={"family": "sans-serif", "size": 11, "color": palette["font"]},
        paper_bgcolor=palette["paper"],
        plot_bgcolor=palette["plot"],
        title={"text": plotly_text(shorten(title)), "x": 0.01, "font": {"size": 14}},
        height=330,
        margin={"l": 60, "r": 20, "t": 50 + LABEL_ROW_PX, "b": 30},
        uirevision=revision or title,
        hovermode="x unified",
        hoverlabel={"namelength": -1},
        legend={"orientation": "h", "y": -0.14, "yanchor": "top", "font": {"size": 10}},
        xaxis={
            "title": {"text": x_axis.title, "standoff": 2, "font": {"size": 11}},
            "type": "date" if x == "time" else "linear",
            "tickformat": x_axis.tickformat,
            "hoverformat": x_axis.hoverformat,
            "gridcolor": palette["grid"],
            "zeroline": False,
        },
        yaxis={"type": "log" if log_y else "linear", "gridcolor": palette["grid"], "zeroline": False},
        yaxis3={"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
    )
    if shapes:  # plotly leaves out empty lists
        layout["shapes"] = shapes
    if annotations:
        layout["annotations"] = annotations
    return layout


def session_key(sessions: Sequence[Session]) -> list[tuple[str, str, str]]:
    """One line per session for the page's single session key: (``"S2"``, colour, what it did)."""
    key = []
    for session in sessions:
        what = "start" if session.index == 0 else f"resume @ {session.resume_step}"
        key.append((f"S{session.index + 1}", session_colour(session.index), what))
    return key


def _compact(values: np.ndarray) -> np.ndarray:
    """float32 halves the figure's bytes; 7 significant digits are more than a chart can show."""
    if np.nanmax(np.abs(values), initial=0.0) < 3e38:
        return values.astype(np.float32)
    return values


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
    events = item.column == "skipped_updates_in_window"  # a count that is mostly 0: marks where it is not
    if events:
        ys = np.where(ys > 0, ys, np.nan)
    smoothing = 0.0 if item.markers or events else smoothing  # sparse series are drawn raw
    style = AXES.get(item.column, Axis(item.label))
    per_session = item.colour is None
    group = f"{number}:{label}"
    drawn: list[np.ndarray] = []
    finite_x = xs[np.isfinite(xs)] if xs.dtype.kind == "f" else xs
    extent = [float(np.min(finite_x)), float(np.max(finite_x))] if len(finite_x) else []
    if per_session and legend:  # one legend entry per series, in a neutral colour: sessions are the page's key
        traces.append(dict(
            x=[], y=[], name=label, legendgroup=group, mode="markers" if events or item.markers else "lines",
            line={"color": "#808495", "dash": dash, "width": 1.5}, marker={"color": "#808495", "size": 6},
            yaxis=axis, hoverinfo="skip",
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
                    y=_compact(raw[keep]),
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
                        y=_compact(smooth[keep]),
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


# -- data-parallel ranks -----------------------------------------------------------------------

STRAGGLER_TITLE = "Rank step time (fastest to slowest rank)"
BAND_OPACITY = 0.25


def is_distributed(frame: pd.DataFrame) -> bool:
    """Whether any record of ``frame`` comes from a data-parallel job of more than one rank."""
    if "world_size" not in frame.columns:
        return False
    return bool((pd.to_numeric(frame["world_size"], errors="coerce") > 1).any())


def _numbers(frame: pd.DataFrame, column: str) -> np.ndarray:
    if column not in frame.columns:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def rank_time_ratio(frame: pd.DataFrame) -> np.ndarray:
    """Per window, the slowest rank's time per step over the fastest's (NaN where either is missing)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = _numbers(frame, "rank_step_time_max_s") / _numbers(frame, "rank_step_time_min_s")
    return np.where(np.isfinite(ratio), ratio, np.nan)


def out_of_lockstep(frame: pd.DataFrame) -> np.ndarray:
    """Per window, whether its ranks disagreed on the step counts (``ranks_in_lockstep`` is false);
    a missing or non-boolean value is not a disagreement."""
    if "ranks_in_lockstep" not in frame.columns:
        return np.zeros(len(frame), dtype=bool)
    return np.fromiter((value is False or value is np.False_ for value in frame["ranks_in_lockstep"].astype(object)),
                       dtype=bool, count=len(frame))  # fmt: skip


def _rgba(colour: str, alpha: float) -> str:
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


def straggler_figure(
    frame: pd.DataFrame,
    *,
    sessions: Sequence[Session],
    superseded: np.ndarray | None = None,
    x: str = "step",
    revision: str = "",
    highlights: Sequence[Highlight] = (),
    max_points: int = CHART_POINTS,
    theme: str = "light",
) -> Figure:
    """Per-rank time per step of a data-parallel run, from its ``train`` records.

    Per session (and dimmed where superseded): a band from the fastest rank's time per step to
    the slowest's, whose hover names the slowest rank ("slowest: rank 3") and the max/min ratio;
    the ratio itself on the right axis; and a red mark on the chart's floor at every window whose
    ranks were not in lockstep.  The band's two edges are downsampled together (each edge's
    min/max buckets are kept for both), so a spike of either edge survives.
    """
    if x not in X_MODES:
        raise ValueError(f"x must be one of {sorted(X_MODES)}, got {x!r}")
    origin = pd.Timestamp(sessions[0].start_time) if sessions else None
    traces: list[dict[str, Any]] = []
    if len(frame):
        _add_band(traces, frame, superseded, x=x, origin=origin, points_per_row=max_points / len(frame) / 3)
    xs = x_values(frame, x, origin) if len(frame) else np.array([])
    spans = [float(np.nanmin(xs)), float(np.nanmax(xs))] if len(xs) else []
    layout = _layout(traces, title=STRAGGLER_TITLE, sessions=sessions, x=x, origin=origin, log_y=False,
                     revision=revision, highlights=highlights, theme=theme, spans=spans)  # fmt: skip
    layout["margin"] = {"l": 60, "r": 55, "t": 50 + LABEL_ROW_PX, "b": 30}  # room for the ratio axis and its title
    layout["yaxis"] = {**layout["yaxis"], "title": {"text": "time per step (s)", "standoff": 2, "font": {"size": 11}},
                       "rangemode": "tozero", "tickformat": ".3~g", "hoverformat": ".4~g"}  # fmt: skip
    layout["yaxis2"] = {"overlaying": "y", "side": "right", "showgrid": False, "rangemode": "tozero",
                        "tickmode": "auto",
                        "title": {"text": "slowest / fastest", "standoff": 2, "font": {"size": 11}}}  # fmt: skip
    return figure_of(traces, layout)


def _add_band(
    traces: list[dict[str, Any]], frame: pd.DataFrame, superseded: np.ndarray | None, *, x: str,
    origin: pd.Timestamp | None, points_per_row: float,
) -> None:  # fmt: skip
    xs = x_values(frame, x, origin)
    low, high = _numbers(frame, "rank_step_time_min_s"), _numbers(frame, "rank_step_time_max_s")
    ratio, slowest = rank_time_ratio(frame), _numbers(frame, "slowest_rank")
    rank_text = np.array([f"{int(r)}" if np.isfinite(r) else "?" for r in slowest], dtype=object)
    codes = frame["session_id"].cat.codes.to_numpy()
    dimmed_rows = superseded if superseded is not None else np.zeros(len(frame), dtype=bool)
    for code in np.unique(codes):
        for dimmed in (False, True):
            rows = np.flatnonzero((codes == code) & (dimmed_rows == dimmed))
            if not len(rows):
                continue
            budget = int(min(TRACE_POINTS, max(MIN_TRACE_POINTS, points_per_row * len(rows))))
            keep = rows[np.union1d(minmax_indices(low[rows], budget), minmax_indices(high[rows], budget))]
            colour, opacity = session_colour(int(code)), SUPERSEDED_OPACITY if dimmed else 1.0
            suffix = f" · S{code + 1}" + (" (superseded)" if dimmed else "")
            group = f"band{suffix}"
            traces.append(dict(
                x=xs[keep], y=_compact(low[keep]), name=f"fastest rank{suffix}", legendgroup=group,
                showlegend=False, mode="lines", opacity=opacity, line={"color": colour, "width": 1},
                connectgaps=False, hovertemplate="fastest rank: %{y:.3g} s<extra></extra>",
            ))  # fmt: skip
            traces.append(dict(
                x=xs[keep], y=_compact(high[keep]), name=f"rank step time, fastest–slowest{suffix}",
                legendgroup=group, mode="lines", opacity=opacity, fill="tonexty",
                fillcolor=_rgba(colour, BAND_OPACITY), line={"color": colour, "width": 1.5}, connectgaps=False,
                customdata=np.column_stack([rank_text[keep], ratio[keep]]),
                hovertemplate="slowest: rank %{customdata[0]} · %{y:.3g} s (%{customdata[1]:.2f}×)<extra></extra>",
            ))  # fmt: skip
            traces.append(dict(
                x=xs[keep], y=_compact(ratio[keep]), name=f"slowest / fastest{suffix}", yaxis="y2",
                mode="lines", opacity=opacity, line={"color": colour, "width": 1, "dash": "dot"}, connectgaps=False,
                hovertemplate="slowest / fastest: %{y:.2f}×<extra></extra>",
            ))  # fmt: skip
    apart = np.flatnonzero(out_of_lockstep(frame))
    if len(apart) > TRACE_POINTS:  # marks only point at windows: an even sample keeps the JSON bounded
        apart = np.unique(apart[np.linspace(0, len(apart) - 1, TRACE_POINTS).astype(np.int64)])
    if len(apart):
        traces.append(dict(
            x=xs[apart], y=np.full(len(apart), 0.03), yaxis="y3", mode="markers", name="ranks out of lockstep",
            marker={"symbol": "x-thin", "size": 9, "color": "#d62728", "line": {"width": 2, "color": "#d62728"}},
            customdata=frame["step"].to_numpy()[apart],
            hovertemplate="ranks out of lockstep (step %{customdata})<extra></extra>",
        ))  # fmt: skip
