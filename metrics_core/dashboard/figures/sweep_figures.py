"""The sweep page's charts: one per swept key, the key on x and the metric on y, a point per run.

plotly's ``parcoords`` is not in the basic bundle the pages load (scatter, bar and pie only:
``vendor/README.md``), so a sweep is a grid of scatter charts, one per swept key, which read the
same way: the runs a range on one key keeps stand out in every other.  A categorical key's values
are its tick labels; a numeric key spanning a decade (a rate, twice) is drawn on a log axis, whole
numbers (a seed) on whole ticks, a key of a few values with a tick at each.  Pure functions: a
``views.sweep.Sweep`` in, plotly's JSON as plain dicts out.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from metrics_core.dashboard.display_text import TITLE_CHARS, WORD_CHARS, plotly_text, shorten
from metrics_core.dashboard.figures.figure_dicts import Figure, figure_of
from metrics_core.dashboard.figures.layout import NO_TEMPLATE, THEMES
from metrics_core.dashboard.views.sweep import Sweep, SweepAxis

CHOSEN_COLOUR = "#1f77b4"
SWEEP_CHART_HEIGHT = 300


def chart_key(axis: SweepAxis) -> str:
    """A widget key for ``axis``'s chart: stable for the key whatever else is swept, and free of the
    key's text (which comes from a file)."""
    return "sweep_chart_" + hashlib.sha1(axis.key.encode()).hexdigest()[:16]


def _label(axis: SweepAxis, position: float | None) -> str:
    if position is None:
        return "—"
    return axis.labels[int(position)] if axis.categorical else f"{position:.4g}"


def sweep_chart(
    sweep: Sweep,
    axis: SweepAxis,
    chosen: Sequence[bool],
    *,
    xrange: tuple[float, float] | None = None,
    theme: str = "light",
) -> Figure:
    """``axis``'s key against the sweep's metric, a point per run that has both; the ``chosen`` runs
    in colour, the others faded.  ``xrange``: the data-unit range to show (the page's chosen range
    of this key), else the whole axis."""
    palette = THEMES[theme]
    metric = f"{sweep.metric} ({sweep.value}{'' if sweep.value == 'last' else ', max' if sweep.best_max else ', min'})"
    traces = []
    for keep, name, colour, opacity in (
        (True, "chosen", CHOSEN_COLOUR, 0.9),
        (False, "others", palette["muted"], 0.35),
    ):
        points = [
            (position, value, run)
            for position, value, run, chosen_run in zip(axis.positions, sweep.values, sweep.runs, chosen, strict=True)
            if chosen_run == keep and position is not None and value is not None and math.isfinite(value)
        ]
        traces.append(
            dict(
                x=[point[0] for point in points],
                y=[point[1] for point in points],
                mode="markers",
                name=name,
                showlegend=False,
                marker={"size": 9, "color": colour, "opacity": opacity},
                hovertext=[
                    plotly_text(f"{shorten(run, TITLE_CHARS)} · {shorten(_label(axis, x), WORD_CHARS)} → {y:.5g}")
                    for x, y, run in points
                ],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    x_axis: dict[str, Any] = {
        "title": {"text": plotly_text(shorten(axis.key, TITLE_CHARS)), "standoff": 2, "font": {"size": 11}},
        "type": "log" if axis.log else "linear",
        "gridcolor": palette["grid"],
        "zeroline": False,
    }
    if axis.categorical:
        x_axis |= {
            "tickvals": list(range(len(axis.labels))),
            "ticktext": [plotly_text(shorten(label, WORD_CHARS)) for label in axis.labels],
        }
    elif len(swept := sorted({p for p in axis.positions if p is not None})) <= VALUE_TICKS:
        # A few values swept (lr 0.02 and 0.05, seeds 0–3): a tick at each, none between.
        x_axis |= {"tickvals": swept, "ticktext": [f"{value:.4g}" for value in swept]}
    elif axis.integer:  # many whole numbers: whole ticks, never 0.5
        x_axis |= {"tickformat": ",d", "tick0": 0, "dtick": _whole_step(axis)}
    if xrange is not None:
        x_axis["range"] = [math.log10(v) for v in xrange] if axis.log and min(xrange) > 0 else list(xrange)
    layout = dict(
        template=NO_TEMPLATE,
        font={"family": "sans-serif", "size": 11, "color": palette["font"]},
        paper_bgcolor=palette["paper"],
        plot_bgcolor=palette["plot"],
        title={"text": plotly_text(shorten(axis.key, TITLE_CHARS)), "x": 0.01, "font": {"size": 14}},
        height=SWEEP_CHART_HEIGHT,
        margin={"l": 60, "r": 20, "t": 40, "b": 40},
        uirevision=chart_key(axis),
        hovermode="closest",
        hoverlabel={"namelength": -1},
        xaxis=x_axis,
        yaxis={
            "title": {"text": plotly_text(shorten(metric, TITLE_CHARS)), "font": {"size": 11}},
            "gridcolor": palette["grid"],
            "zeroline": False,
        },
    )
    return figure_of(traces, layout)


VALUE_TICKS = 8  # a numeric key with at most this many values swept has a tick at each


def _whole_step(axis: SweepAxis) -> int:
    """The step between whole ticks: 1, 2, 5, 10, 20… so that about eight ticks cover the values."""
    numbers = [position for position in axis.positions if position is not None]
    span = max(numbers) - min(numbers) if numbers else 0.0
    return next(step for step in (m * 10**e for e in range(19) for m in (1, 2, 5)) if span / step <= 8)
