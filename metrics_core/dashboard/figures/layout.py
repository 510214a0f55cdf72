"""What every chart of the dashboard shares: its layout, colours, axes and resume labels.

A figure is plotly's JSON structure in plain dicts (``figure_dicts``).

What every chart shares (``chart_layout``):

* each session has its own colour, and each later session's start is a labelled vertical line
  ("S2 · resume @ 60"); resume labels never overlap: each is placed, in one of two rows, only
  where it fits at the narrowest plot width we support (``MIN_PLOT_PX``), full or short ("S3"),
  else left to the hover of a marker on the boundary line (``resume_labels``);
* x axes are titled with their unit and formatted on purpose (``X_AXES``); wall time is a date
  axis of milliseconds since the epoch;
* ``theme`` ("light"/"dark") colours the figure like the Streamlit theme around it (``THEMES``);
* the page shows one session key (``session_key``) for all its charts;
* titles, trace names and labels are untrusted (a run name, a directory name): plotly.js renders
  a subset of HTML in them, so each is passed through ``plotly_text`` (and shortened) at the sink,
  and callers hand over raw strings.

What is drawn on that layout lives beside this module: ``metric_figures`` (a metric's lines, on
the y axes ``metric_axes`` sets), ``rank_figures`` (a data-parallel run's ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.dashboard.display_text import plotly_text, shorten
from metrics_core.read.run_reader import Session

SESSION_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
SUPERSEDED_OPACITY = 0.3
CHART_POINTS = 8000  # drawn points per chart, shared by its traces
TRACE_POINTS = 4000
# Past this many sessions (a run resumed thousands of times) a chart draws them as one: a trace for
# every session, the session starts as markers without their dashed lines and labels; a trace, a
# line and a label per session would cost the chart, and plotly.js, per session.
SESSION_TRACES = 64
MIN_TRACE_POINTS = 200
MIN_PLOT_PX = 300  # the narrowest plot area resume labels must fit (a phone, 390 px wide)
LABEL_FONT = 10
LABEL_CHAR_PX = 6.2  # an upper bound of a 10 px sans-serif glyph's advance
LABEL_ROWS = 2
LABEL_ROW_PX = 16  # a 10 px label's box is ~14 px tall
CHART_HEIGHT = 330  # px, with one row of legend
PHONE_CHART_PX = 358  # a chart on a 390 px phone: the page less its padding
MARGIN_LEFT, MARGIN_RIGHT = 60, 20  # px: the y axis' ticks and title; the right edge (a right axis adds its own)
LEGEND_ROW_PX = 19  # a row of 10 px legend entries
LEGEND_SYMBOL_PX = 40  # an entry's line symbol, its gap to the text and to the next entry
LEGEND_CHAR_PX = 5.5  # a 10 px legend glyph's mean advance in Chromium's sans-serif (DejaVu), rounded up
# What plotly's ``template="none"`` validates to (a test compares): every figure carries it, so
# plotly.js applies no default template, whose styling JSON would ride with every update.
NO_TEMPLATE = {"data": {"scatter": [{"type": "scatter"}]}}


@dataclass(frozen=True, slots=True)
class Axis:
    """How a quantity's axis reads: its title with the unit, and d3 formats for ticks and hover.

    ``fixed`` pins the range (a fraction is 0–1); ``robust`` lets ``robust_range`` choose the
    default range (counts that only grow need none); ``count`` starts the axis at 0 with integer
    ticks (no "0.5 skipped updates").
    """

    title: str
    tickformat: str = ".3~g"
    hoverformat: str = ".4~g"
    fixed: tuple[float, float] | None = None
    robust: bool = True
    count: bool = False


X_AXES = {
    "step": Axis("step", "~s", ","),
    "tokens_seen": Axis("tokens seen", "~s", ","),
    # One line of tick labels, as every other x axis has: plotly's default date ticks take two
    # ("21:40" over "Dec 7, 2026"), which pushed the axis title into the legend below it.
    "time": Axis("wall time (UTC)", "%b %-d %H:%M", "%Y-%m-%d %H:%M:%S"),
    "relative": Axis("hours since start (h)", ".3~f", ".3~f"),
}
# Streamlit's own palettes (its default light and dark themes), so a chart sits in the page.
THEMES = {
    "light": {"font": "#31333f", "paper": "#ffffff", "plot": "#ffffff", "grid": "#e6e9ef", "muted": "#808495"},
    "dark": {"font": "#fafafa", "paper": "#0e1117", "plot": "#0e1117", "grid": "#31333f", "muted": "#a3a8b8"},
}


@dataclass(frozen=True, slots=True)
class Highlight:
    """A shaded x-range with a label (a replay window)."""

    x0: float
    x1: float
    label: str
    colour: str


def rgba(colour: str, alpha: float) -> str:
    """``colour`` (``#rrggbb``) at opacity ``alpha``: a band's fill under its line."""
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


def session_colour(index: int) -> str:
    return SESSION_COLOURS[index % len(SESSION_COLOURS)]


def x_values(frame: pd.DataFrame, x: str, origin: pd.Timestamp | None) -> np.ndarray:
    """The x coordinate of each row for an x-axis mode (``X_MODES``) or a logged key (NaN where a
    row does not hold it: plotly.js leaves such a point out).

    Wall time is milliseconds since the epoch on a date axis: 8 bytes a point in the figure's
    binary encoding, a fraction of an ISO string's.
    """
    if x == "relative":
        start = origin if origin is not None else frame["time"].min()
        return ((frame["time"] - start).dt.total_seconds() / 3600.0).to_numpy()
    if x == "time":
        return frame["time"].astype("int64").to_numpy() / 1e6
    if x in ("step", "tokens_seen"):
        return frame[x].to_numpy()
    if x not in frame.columns:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[x], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def x_axis(x: str) -> Axis:
    """How the x axis of mode or key ``x`` reads: its ``X_AXES`` entry, else titled by the key."""
    return X_AXES.get(x) or Axis(x, "~s", ",.4~g")


def session_x(session: Session, x: str, origin: pd.Timestamp | None) -> object:
    """Where ``session`` starts on the x axis of ``x``; None on a logged key's axis, where a
    session's start is not recorded (its lines still start where its records do)."""
    if x == "step":
        return session.first_step
    if x == "tokens_seen":
        return session.first_tokens_seen
    if x != "time" and x != "relative":
        return None
    start = pd.Timestamp(session.start_time)
    if x == "time":
        return start.value / 1e6
    return (start - origin).total_seconds() / 3600.0 if origin is not None else 0.0


def resume_labels(
    positions: Sequence[tuple[float, str, str]], *, span: float, plot_px: int = MIN_PLOT_PX
) -> list[tuple[str, int] | None]:
    """Where each session boundary's label goes so that no two overlap at ``plot_px`` or wider
    (``MIN_PLOT_PX``; less where a right axis takes its own margin).

    ``positions`` are (x, full label, short label) in x order; ``span`` the x-axis range they sit in.
    Each label is tried full then short, in row 0 then row 1; one that fits nowhere is None (its
    boundary keeps a hover marker).  A wider plot (or a zoom) only moves labels apart, so a layout
    that fits at the narrowest width fits at every width.
    """
    scale = plot_px / span if span > 0 else 0.0
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


def chart_layout(
    traces: list[dict[str, Any]],
    *,
    title: str,
    sessions: Sequence[Session],
    x: str,
    origin: pd.Timestamp | None,
    log_y: bool,
    revision: str,
    highlights: Sequence[Highlight],
    theme: str = "light",
    spans: Sequence[float] = (),
    margin_right: int = MARGIN_RIGHT,
) -> dict[str, Any]:
    """The layout every chart shares: session boundary lines, shaded highlights, axes, legend;
    appends the session-start markers' trace to ``traces``.  ``margin_right``: wider for a right
    axis, which narrows the plot the resume labels must fit."""
    palette = THEMES[theme]
    shapes, annotations = [], []
    boundaries = [(at, session) for session in sessions[1:] if (at := session_x(session, x, origin)) is not None]
    lined = boundaries if len(sessions) <= SESSION_TRACES else []
    edges = [float(at) for at, _ in boundaries] + [float(value) for value in spans]
    span = max(edges) - min(edges) if edges else 0.0
    labels = resume_labels(
        [(float(at), f"{s.name} · resume @ {s.resume_step}", s.name) for at, s in lined],
        span=span,
        plot_px=MIN_PLOT_PX - (margin_right - MARGIN_RIGHT),
    )
    for (at, session), label in zip(lined, labels, strict=True):
        colour = session_colour(session.index)
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": at,
                "x1": at,
                "y0": 0,
                "y1": 1,
                "line": {"color": colour, "width": 1.5, "dash": "dash"},
            }
        )
        if label is not None:
            annotations.append(
                {
                    "x": at,
                    "y": 1.0,
                    "xref": "x",
                    "yref": "paper",
                    "yanchor": "bottom",
                    "yshift": label[1] * LABEL_ROW_PX,
                    "showarrow": False,
                    "text": label[0],
                    "hovertext": f"{session.name} · resume @ {session.resume_step}",
                    "font": {"size": LABEL_FONT, "color": colour},
                }
            )
    if boundaries:  # every boundary's full label in the hover of a marker at its top, placed or not
        traces.append(
            dict(
                x=[at for at, _ in boundaries],
                y=[1.0] * len(boundaries),
                yaxis="y3",
                mode="markers",
                name="session starts",
                showlegend=False,
                cliponaxis=False,
                marker={
                    "symbol": "triangle-down",
                    "size": 7,
                    "color": [session_colour(s.index) for _, s in boundaries],
                },
                hovertext=[f"{s.name} · resume @ {s.resume_step}" for _, s in boundaries],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    for number, highlight in enumerate(highlights):
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": highlight.x0,
                "x1": highlight.x1,
                "y0": 0,
                "y1": 1,
                "fillcolor": highlight.colour,
                "opacity": 0.15,
                "line": {"width": 0},
                "layer": "below",
            }
        )
        annotations.append(
            {
                "x": highlight.x0,
                "y": 1.0,
                "xref": "x",
                "yref": "paper",
                "xanchor": "left",
                "yanchor": "top",
                "showarrow": False,
                "text": plotly_text(shorten(highlight.label)),
                "font": {"size": 10},
                # Every other label a row lower: on a narrow chart two replays' labels would overlap.
                "yshift": -LABEL_ROW_PX * (number % 2),
            }
        )
    axis = x_axis(x)
    layout = dict(
        template=NO_TEMPLATE,  # no default template: its styling JSON would ride with every update
        font={"family": "sans-serif", "size": 11, "color": palette["font"]},
        paper_bgcolor=palette["paper"],
        plot_bgcolor=palette["plot"],
        title={"text": plotly_text(shorten(title)), "x": 0.01, "font": {"size": 14}},
        height=chart_height(traces, MARGIN_RIGHT),
        margin={"l": MARGIN_LEFT, "r": margin_right, "t": 50 + LABEL_ROW_PX, "b": 30},
        uirevision=revision or title,
        hovermode="x unified",
        hoverlabel={"namelength": -1},
        # "normal" order: entries flow in rows; plotly's "grouped" order gives each legend group
        # (the sessions) rows of its own, a column of entries on a phone.
        legend={"orientation": "h", "y": -0.14, "yanchor": "top", "font": {"size": 10}, "traceorder": "normal"},
        xaxis={
            "title": {"text": plotly_text(shorten(axis.title)), "standoff": 2, "font": {"size": 11}},
            "type": "date" if x == "time" else "linear",
            "tickformat": axis.tickformat,
            "hoverformat": axis.hoverformat,
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


def chart_height(traces: Sequence[dict[str, Any]], margin_right: int) -> int:
    """The chart's height: ``CHART_HEIGHT`` and a row more for each row its legend wraps to on a
    phone (its narrowest), so the plot keeps its height under a long legend."""
    width = PHONE_CHART_PX - MARGIN_LEFT - margin_right
    return CHART_HEIGHT + LEGEND_ROW_PX * max(legend_rows(traces, width=width) - 1, 0)


def legend_rows(traces: Sequence[dict[str, Any]], *, width: float) -> int:
    """Rows of the legend of ``traces`` on a plot ``width`` px wide.

    plotly.js lays a horizontal legend out in one row when it fits, else in columns as wide as
    its widest entry; an entry is its symbol and its text.  No legend (one entry or none): 0 rows."""
    names = [str(trace["name"]) for trace in traces if trace.get("showlegend", True) and trace.get("name")]
    if len(names) < 2:
        return 0
    widths = [LEGEND_SYMBOL_PX + len(name) * LEGEND_CHAR_PX for name in names]
    if sum(widths) <= width:
        return 1
    columns = max(1, int(width // max(widths)))
    return -(-len(names) // columns)


def session_key(sessions: Sequence[Session]) -> list[tuple[str, str, str]]:
    """One line per session for the page's single session key: (``"S2"``, colour, what it did)."""
    key = []
    for session in sessions:
        what = "start" if session.index == 0 else f"resume @ {session.resume_step}"
        key.append((session.name, session_colour(session.index), what))
    return key


def compact(values: np.ndarray) -> np.ndarray:
    """float32 halves the figure's bytes; 7 significant digits are more than a chart can show."""
    if np.nanmax(np.abs(values), initial=0.0) < 3e38:
        return values.astype(np.float32)
    return values
