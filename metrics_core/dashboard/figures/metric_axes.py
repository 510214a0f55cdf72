"""How a metric chart's y axes read and where they start: the axis rules of ``metric_figures``.

A metric's lines (``metric_figures``) say what is drawn; this module says how the axes around them
read, so a rule about axes is written once whatever draws on them:

* every y axis is titled with its unit and formatted on purpose (``AXES``, by column; a logged key
  by its name, counting when it holds integers: ``axis_of``): loss, fraction 0–1, count,
  tokens/s, learning rate in ``2.5e-4`` notation, so no ``250µ`` stands next to ``2k``;
* a count axis starts at 0 with whole ticks, and a constant series sits on a small band around its
  value (``fitted_range``), where plotly's autorange would mislead;
* the default y-range is the whole curve, the start of training included, less its isolated spikes
  (``robust_range``): a loss falling 200× is drawn whole, one bad batch's loss of 40 does not
  flatten a curve that lives around 2; plotly's autoscale button (or a double-click) shows the full
  range, a note on the chart says how many points are off-scale, and each such point is a marker on
  the chart's edge (``off_scale_markers``), so a spike stays in the chart itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.dashboard.display_text import plotly_text
from metrics_core.dashboard.figures.layout import THEMES, Axis

RIGHT_AXIS_PX = 65  # the right margin of a chart with a right axis
SPIKE_NEIGHBOURS = 5  # the points on each side a spike is judged against
SPIKE_FENCE = 8.0  # a spike stands this many times the series' noise beyond both sides (Gaussian noise: ~5σ)
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


def axis_of(column: str, frame: pd.DataFrame) -> Axis:
    """How ``column`` of ``frame`` reads: its ``AXES`` entry, else one titled by the column (a
    logged key), counting when the column holds integers."""
    axis = AXES.get(column)
    if axis is not None:
        return axis
    integers = column in frame.columns and frame[column].dtype.kind in "iu"
    return Axis(column, ",d", ",d", count=True) if integers else Axis(column)


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


def isolated_spikes(values: np.ndarray) -> np.ndarray:
    """Which points of one series (in x order) are isolated spikes: beyond both the median of the
    ``SPIKE_NEIGHBOURS`` points before and of those after by more than ``SPIKE_FENCE`` times the
    series' noise (the median distance of a point from its neighbours' middle).

    A point on the curve's own trend lies between its neighbours, however fast the curve falls, and
    the first and last points have neighbours on one side only: neither is ever a spike.  A
    plateau longer than half a neighbourhood is part of the story, not a spike.
    """
    spikes = np.zeros(len(values), dtype=bool)
    if len(values) < 2 * SPIKE_NEIGHBOURS + 1:
        return spikes
    series = pd.Series(values)
    before = series.rolling(SPIKE_NEIGHBOURS).median().shift(1).to_numpy()
    after = series[::-1].rolling(SPIKE_NEIGHBOURS).median().shift(1).to_numpy()[::-1]
    both = np.isfinite(before) & np.isfinite(after)
    residual = np.abs(values - (before + after) / 2)[both]
    noise = max(float(np.median(residual)), 1e-9 * float(np.max(np.abs(values))))
    fence = SPIKE_FENCE * noise
    with np.errstate(invalid="ignore"):
        spikes[both] = (values[both] > np.fmax(before, after)[both] + fence) | (
            values[both] < np.fmin(before, after)[both] - fence
        )
    return spikes


def robust_range(columns: Sequence[np.ndarray], *, log: bool = False) -> tuple[tuple[float, float], int] | None:
    """A default y-range that isolated spikes cannot squash, and how many points lie outside it.

    The range holds every point of every array (one series, in x order) but its isolated spikes
    (``isolated_spikes``): the whole curve, its start of training included, as TensorBoard draws
    it, with a 1000× throughput spike or a single bad batch's loss left out.  Padded by 5%.  None
    when the full range is not more than 1.5× that (nothing worth hiding) or there are too few
    points.  With ``log`` the range is in log10 units, as plotly wants it.
    """
    kept, every = [], []
    for values in columns:
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values) & (values > 0)] if log else values[np.isfinite(values)]
        if log:
            values = np.log10(values)
        if not len(values):
            continue
        every.append(values)
        kept.append(values[~isolated_spikes(values)])
    if not every or sum(map(len, every)) < ROBUST_MIN_POINTS:
        return None
    body = np.concatenate(kept)
    low, high = float(body.min()), float(body.max())
    pad = (high - low) * 0.05 or abs(high) * 0.1 or 1.0
    low, high = low - pad, high + pad
    full = np.concatenate(every)
    full_low, full_high = float(full.min()), float(full.max())
    if full_high - full_low <= 1.5 * (high - low):
        return None
    if not log and full_low >= 0:
        low = max(low, 0.0)  # a non-negative quantity's axis does not dip below zero
    outside = int(np.count_nonzero((full < low) | (full > high)))
    return (float(low), float(high)), outside


OFF_SCALE = "off-scale"  # the ``meta`` of the markers of points outside the default y-range
MAX_OFF_SCALE_MARKERS = 200


def off_scale_markers(
    traces: Sequence[dict[str, Any]], y_range: tuple[float, float], *, log: bool, theme: str
) -> list[dict[str, Any]]:
    """Each raw point of the left axis outside ``y_range`` as a marker on the chart's edge (a
    triangle pointing where it lies, its value in the hover): a spike that the default range
    leaves out stays in the chart itself.  An even sample of at most
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
        markers.append(
            dict(
                x=x[rows],
                y=np.full(len(rows), edge),
                customdata=y[rows],
                mode="markers",
                name=OFF_SCALE,
                meta=OFF_SCALE,
                showlegend=False,
                cliponaxis=False,
                yaxis="y3",
                marker={"symbol": symbol, "size": 7, "color": THEMES[theme]["muted"]},
                hovertemplate="off-scale: %{customdata:.4~g}<extra></extra>",
            )
        )
    return markers


def ends_low(columns: Sequence[np.ndarray], y_range: Sequence[float], *, log: bool) -> bool:
    """Whether the curves end in the lower half of ``y_range`` (log10 units with ``log``): a loss
    that converged, whose end the off-scale note, in a corner of the plot, must not cover (it goes
    to the top corner then, else to the bottom one)."""
    ends = []
    for values in columns:
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values) & (values > 0)] if log else values[np.isfinite(values)]
        if len(values):
            ends.append(np.log10(values[-1]) if log else values[-1])
    return bool(ends) and float(np.mean(ends)) < (y_range[0] + y_range[1]) / 2


def log_ticks(values: np.ndarray) -> dict[str, Any]:
    """Tick settings of a log axis over ``values``: within a decade or three, labels at 1, 2 and 5
    of each decade (``D2``) where plotly would label every digit (0.1, 0.09, 0.08… crammed)."""
    positive = values[np.isfinite(values) & (values > 0)]
    if not len(positive):
        return {}
    decades = np.log10(positive.max() / positive.min())
    return {"dtick": "D2"} if 0.3 <= decades <= 3 else {}


def y_axes(
    layout: dict[str, Any],
    axes: dict[bool, Axis | None],
    drawn: dict[bool, list[np.ndarray]],
    *,
    log_y: bool,
    theme: str,
) -> tuple[float, float] | None:
    """Titles, formats and default ranges of the primary (left, ``axes[False]``) and secondary
    (right, ``axes[True]``) y axes, set in ``layout``, from the values ``drawn`` on each side;
    the left axis' range when ``robust_range`` chose it (points may lie outside it)."""
    palette = THEMES[theme]
    off_scale = 0
    logged = False
    chosen = None
    for secondary in (False, True):
        axis = axes[secondary]
        if axis is None:
            continue
        log = log_y and not secondary
        settings = {
            "title": {"text": plotly_text(axis.title), "standoff": 4, "font": {"size": 11}},
            "tickformat": axis.tickformat,
            "hoverformat": axis.hoverformat,
            "exponentformat": "e",
            "separatethousands": True,
        }
        values = np.concatenate(drawn[secondary]).astype(np.float64) if drawn[secondary] else np.zeros(0)
        logged |= bool(np.isfinite(values).any())
        if log:
            settings |= log_ticks(values)
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
            settings = {
                "overlaying": "y",
                "side": "right",
                "showgrid": False,
                "zeroline": False,
                "rangemode": "tozero",
                "tickmode": "auto",
                **settings,
            }
            layout["margin"] = {**layout["margin"], "r": RIGHT_AXIS_PX}  # room for the right axis' ticks and title
        name = "yaxis2" if secondary else "yaxis"
        layout[name] = {**layout.get(name, {}), **settings}
    if not logged:  # no axis of made-up numbers around nothing
        layout["yaxis"] = {**layout["yaxis"], "showticklabels": False}
        layout.setdefault("annotations", []).append(
            {
                "x": 0.5,
                "y": 0.5,
                "xref": "paper",
                "yref": "paper",
                "showarrow": False,
                "text": "none logged",
                "font": {"size": 13, "color": palette["muted"]},
            }
        )
    if off_scale:
        top = chosen is not None and ends_low(drawn[False], chosen, log=log_y)
        layout.setdefault("annotations", []).append(
            {
                "x": 1,
                "y": 1 if top else 0,
                "xref": "paper",
                "yref": "paper",
                "xanchor": "right",
                "yanchor": "top" if top else "bottom",
                "showarrow": False,
                "opacity": 0.9,
                "bgcolor": palette["plot"],
                "text": f"{off_scale:,} point{'s' if off_scale > 1 else ''} off-scale (▲ ▼ at the edge) · "
                "autoscale ⤢ shows all",
                "font": {"size": 9, "color": palette["muted"]},
            }
        )
    return chosen
