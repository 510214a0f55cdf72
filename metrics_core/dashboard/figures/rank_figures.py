"""A data-parallel run's ranks (``straggler_figure``): per session, the band from the fastest
rank's time per step to the slowest's, their ratio, and the windows whose ranks were out of
lockstep, on ``layout.chart_layout``; above it, always, the latest ratio, and the rank that is
consistently slowest when there is one (``rank_spread``).  The ratio the chart and its CSV share,
and whether a run has more than one rank, are the chart spec's (``views.chart_specs``).

*Consistently slowest*: of the last ``RECENT_WINDOWS`` windows that name a slowest rank and a
ratio, the same rank was the slowest, by at least ``CONSISTENT_RATIO`` × the fastest rank's time
per step, in at least ``CONSISTENT_WINDOWS``.  A small steady lead is what a rank on a slower
link, a busier host or a larger share of long samples shows; in a balanced job the slowest rank
changes from window to window and the ratio stays near 1, so neither alone is enough.  (The
diagnostics' ``straggler rank`` warning is the stronger claim: a streak of windows at 1.2×.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from metrics_core.analysis.downsample import Downsampler, minmax_indices
from metrics_core.dashboard.figures.figure_dicts import Figure, figure_of
from metrics_core.dashboard.figures.layout import (
    CHART_POINTS,
    LABEL_ROW_PX,
    MIN_TRACE_POINTS,
    SUPERSEDED_OPACITY,
    TRACE_POINTS,
    Highlight,
    chart_layout,
    compact,
    rgba,
    session_colour,
    x_values,
)
from metrics_core.dashboard.views.chart_specs import STRAGGLER_TITLE, column_numbers, rank_time_ratio
from metrics_core.read.run_reader import Session

BAND_OPACITY = 0.25
RECENT_WINDOWS = 10
CONSISTENT_WINDOWS = 8
CONSISTENT_RATIO = 1.05


def out_of_lockstep(frame: pd.DataFrame) -> np.ndarray:
    """Per window, whether its ranks disagreed on the step counts (``ranks_in_lockstep`` is false);
    a missing or non-boolean value is not a disagreement."""
    if "ranks_in_lockstep" not in frame.columns:
        return np.zeros(len(frame), dtype=bool)
    return np.fromiter(
        (value is False or value is np.False_ for value in frame["ranks_in_lockstep"].astype(object)),
        dtype=bool,
        count=len(frame),
    )


@dataclass(frozen=True, slots=True)
class RankSpread:
    """The latest window's slowest/fastest ratio, and the consistently slowest rank (module docstring)."""

    latest_ratio: float | None
    slowest_rank: int | None  # consistently slowest, else None
    slowest_windows: int  # of ``recent_windows``, those it was slowest in by CONSISTENT_RATIO or more
    recent_windows: int
    slowest_ratio: float | None  # its median ratio over those windows

    def text(self) -> str:
        """What the chart says above its plot: the ratio always, the consistently slowest rank if any."""
        if self.latest_ratio is None:
            return "slowest / fastest: no data"
        text = f"slowest / fastest: {self.latest_ratio:.2f}× (latest window)"
        if self.slowest_rank is not None:
            text += (
                f" · rank {self.slowest_rank} consistently slowest: {self.slowest_windows} of the last "
                f"{self.recent_windows} windows, median {self.slowest_ratio:.2f}×"
            )
        return text


def rank_spread(frame: pd.DataFrame) -> RankSpread:
    """The spread of ``frame``'s train windows, in the frame's order (the latest last)."""
    ratio, slowest = rank_time_ratio(frame), column_numbers(frame, "slowest_rank")
    known = np.flatnonzero(np.isfinite(ratio) & np.isfinite(slowest))
    if not len(known):
        return RankSpread(None, None, 0, 0, None)
    recent = known[-RECENT_WINDOWS:]
    latest = float(ratio[recent[-1]])
    leading = recent[ratio[recent] >= CONSISTENT_RATIO]
    ranks, counts = np.unique(slowest[leading], return_counts=True)
    if not len(ranks) or counts.max() < CONSISTENT_WINDOWS:
        return RankSpread(latest, None, 0, len(recent), None)
    rank = ranks[counts.argmax()]  # at most one rank can hold 8 of 10 windows
    mine = leading[slowest[leading] == rank]
    return RankSpread(latest, int(rank), len(mine), len(recent), float(np.median(ratio[mine])))


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
    downsample: Downsampler = minmax_indices,
) -> Figure:
    """Per-rank time per step of a data-parallel run, from its ``train`` records.

    Per session (and dimmed where superseded): a band from the fastest rank's time per step to
    the slowest's, whose hover names the slowest rank ("slowest: rank 3") and the max/min ratio;
    the ratio itself on the right axis; and a red mark on the chart's floor at every window whose
    ranks were not in lockstep; above the plot, ``rank_spread(frame).text()``.  The band's two
    edges are downsampled together (each edge's points, picked by ``downsample``, are kept for
    both), so a spike of either edge survives.
    """
    origin = pd.Timestamp(sessions[0].start_time) if sessions else None
    traces: list[dict[str, Any]] = []
    if len(frame):
        points_per_row = max_points / len(frame) / 3
        _add_band(traces, frame, superseded, x=x, origin=origin, points_per_row=points_per_row, downsample=downsample)
    xs = x_values(frame, x, origin) if len(frame) else np.array([])
    spans = [float(np.nanmin(xs)), float(np.nanmax(xs))] if len(xs) else []
    layout = chart_layout(
        traces,
        title=STRAGGLER_TITLE,
        sessions=sessions,
        x=x,
        origin=origin,
        log_y=False,
        revision=revision,
        highlights=highlights,
        theme=theme,
        spans=spans,
    )
    layout["margin"] = {"l": 60, "r": 55, "t": 50 + LABEL_ROW_PX, "b": 30}  # room for the ratio axis and its title
    layout["yaxis"] = {
        **layout["yaxis"],
        "title": {"text": "time per step (s)", "standoff": 2, "font": {"size": 11}},
        "rangemode": "tozero",
        "tickformat": ".3~g",
        "hoverformat": ".4~g",
    }
    layout["yaxis2"] = {
        "overlaying": "y",
        "side": "right",
        "showgrid": False,
        "rangemode": "tozero",
        "tickmode": "auto",
        "title": {"text": "slowest / fastest", "standoff": 2, "font": {"size": 11}},
    }
    spread = rank_spread(frame)
    layout["annotations"] = [
        *layout.get("annotations", []),
        {
            "name": "rank spread",
            "text": spread.text(),
            "x": 1.0,
            "y": 1.0,
            "xref": "paper",
            "yref": "paper",
            "xanchor": "right",
            "yanchor": "bottom",
            "yshift": LABEL_ROW_PX,
            "showarrow": False,
            "font": {"size": 11, **({"color": "#d62728"} if spread.slowest_rank is not None else {})},
        },
    ]
    return figure_of(traces, layout)


def _add_band(
    traces: list[dict[str, Any]],
    frame: pd.DataFrame,
    superseded: np.ndarray | None,
    *,
    x: str,
    origin: pd.Timestamp | None,
    points_per_row: float,
    downsample: Downsampler,
) -> None:
    xs = x_values(frame, x, origin)
    low, high = column_numbers(frame, "rank_step_time_min_s"), column_numbers(frame, "rank_step_time_max_s")
    ratio, slowest = rank_time_ratio(frame), column_numbers(frame, "slowest_rank")
    rank_text = np.array([f"{int(r)}" if np.isfinite(r) else "?" for r in slowest], dtype=object)
    codes = frame["session_id"].cat.codes.to_numpy()
    dimmed_rows = superseded if superseded is not None else np.zeros(len(frame), dtype=bool)
    for code in np.unique(codes):
        for dimmed in (False, True):
            rows = np.flatnonzero((codes == code) & (dimmed_rows == dimmed))
            if not len(rows):
                continue
            budget = int(min(TRACE_POINTS, max(MIN_TRACE_POINTS, points_per_row * len(rows))))
            keep = rows[np.union1d(downsample(low[rows], budget), downsample(high[rows], budget))]
            colour, opacity = session_colour(int(code)), SUPERSEDED_OPACITY if dimmed else 1.0
            suffix = f" · S{code + 1}" + (" (superseded)" if dimmed else "")
            group = f"band{suffix}"
            traces.append(
                dict(
                    x=xs[keep],
                    y=compact(low[keep]),
                    name=f"fastest rank{suffix}",
                    legendgroup=group,
                    showlegend=False,
                    mode="lines",
                    opacity=opacity,
                    line={"color": colour, "width": 1},
                    connectgaps=False,
                    hovertemplate="fastest rank: %{y:.3g} s<extra></extra>",
                )
            )
            traces.append(
                dict(
                    x=xs[keep],
                    y=compact(high[keep]),
                    name=f"rank step time, fastest–slowest{suffix}",
                    legendgroup=group,
                    mode="lines",
                    opacity=opacity,
                    fill="tonexty",
                    fillcolor=rgba(colour, BAND_OPACITY),
                    line={"color": colour, "width": 1.5},
                    connectgaps=False,
                    customdata=np.column_stack([rank_text[keep], ratio[keep]]),
                    hovertemplate="slowest: rank %{customdata[0]} · %{y:.3g} s (%{customdata[1]:.2f}×)<extra></extra>",
                )
            )
            traces.append(
                dict(
                    x=xs[keep],
                    y=compact(ratio[keep]),
                    name=f"slowest / fastest{suffix}",
                    yaxis="y2",
                    mode="lines",
                    opacity=opacity,
                    line={"color": colour, "width": 1, "dash": "dot"},
                    connectgaps=False,
                    hovertemplate="slowest / fastest: %{y:.2f}×<extra></extra>",
                )
            )
    apart = np.flatnonzero(out_of_lockstep(frame))
    if len(apart) > TRACE_POINTS:  # marks only point at windows: an even sample keeps the JSON bounded
        apart = np.unique(apart[np.linspace(0, len(apart) - 1, TRACE_POINTS).astype(np.int64)])
    if len(apart):
        traces.append(
            dict(
                x=xs[apart],
                y=np.full(len(apart), 0.03),
                yaxis="y3",
                mode="markers",
                name="ranks out of lockstep",
                marker={"symbol": "x-thin", "size": 9, "color": "#d62728", "line": {"width": 2, "color": "#d62728"}},
                customdata=frame["step"].to_numpy()[apart],
                hovertemplate="ranks out of lockstep (step %{customdata})<extra></extra>",
            )
        )
