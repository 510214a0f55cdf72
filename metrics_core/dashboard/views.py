"""What the pages chart: pure functions of ``RunView`` snapshots and page options.

``chart_specs`` picks, per chart of the run page, the rows and columns it draws (per history mode:
the effective history, every session with superseded records dimmed, or sessions overlaid with
their replays shaded); ``run_charts`` draws them (``metric_figures``, ``rank_figures``) in one
pass over the specs; ``chart_csv`` gives exactly the rows a chart draws.  ``session_overlay`` and
``compare_chart`` are the sessions and compare pages' charts.  Nothing here memoises: what a live
page recomputes per snapshot is ``live_views``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from metrics_core.analysis import replay_windows, tokens_per_second
from metrics_core.dashboard.figures import CHART_POINTS, Figure, Highlight, session_colour, x_values
from metrics_core.dashboard.metric_figures import Series, metric_figure
from metrics_core.dashboard.rank_figures import STRAGGLER_TITLE, is_distributed, rank_time_ratio, straggler_figure
from metrics_core.dashboard.store import RunView

HISTORY_MODES = {
    "effective": "effective history",
    "all": "all sessions (superseded dimmed)",
    "sessions": "sessions overlaid, replays shaded",
}
# metric -> (event, label) for the compare page
COMPARE_METRICS = {
    "train_loss": ("train", "train loss"),
    "val_loss": ("validation", "validation loss"),
    "grad_norm_avg": ("train", "grad norm avg"),
    "clipped_fraction": ("train", "clipped fraction"),
    "skipped_updates": ("train", "skipped updates (cumulative)"),
    "lr": ("train", "learning rate"),
    "tokens_per_s": ("train", "tokens/s"),
}
RUN_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


@dataclass(frozen=True)
class ChartOptions:
    """What the run page's controls choose, and the browser's theme ("light"/"dark", ``THEMES``).

    The theme is part of every memo and lineage key the options are, so a dark tab and a light
    tab each get their own figures, built coloured (no recoloured copy per snapshot).
    """

    x: str = "step"
    smoothing: float = 0.0
    log_y: bool = False
    history: str = "effective"
    theme: str = "light"


@dataclass(frozen=True)
class ChartSpec:
    """One chart: its series, and whether smoothing and a log scale apply to it.

    ``kind`` "lines" is drawn by ``metric_figure``; "straggler" by ``straggler_figure`` from the
    first series' frame (the other series are what its CSV holds).
    """

    title: str
    series: list[Series]
    smoothed: bool
    loggable: bool
    kind: str = "lines"


def _with_throughput(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(tokens_per_s=tokens_per_second(frame)) if len(frame) else frame


def _rows(view: RunView, event: str, history: str) -> tuple[pd.DataFrame, np.ndarray | None]:
    """The rows a history mode draws, and which of them to dim."""
    if history == "effective":
        return view.effective(event), None
    return view.frames[event], view.superseded[event] if history == "all" else None


def chart_specs(view: RunView, history: str) -> dict[str, ChartSpec]:
    """Loss, clipped fraction, skipped updates, grad norm, LR and throughput, keyed by chart id;
    and for a data-parallel run (``world_size`` > 1), the ranks' step-time spread."""
    train, dim = _rows(view, "train", history)
    validation, validation_dim = _rows(view, "validation", history)
    specs = {
        "loss": ChartSpec("Loss", [Series(train, "train_loss", "train", dim),
                                   Series(validation, "val_loss", "validation", validation_dim, markers=True)],
                          True, True),
        "clipped": ChartSpec("Clipped fraction", [
            Series(train, "clipped_fraction", "clipped", dim, gap_markers=True)], False, False),
        "skipped": ChartSpec("Skipped updates", [
            Series(train, "skipped_updates_in_window", "per window", dim),
            Series(train, "skipped_updates", "cumulative", dim, secondary_y=True)], False, False),
        "grad_norm": ChartSpec("Gradient norm (pre-clip)", [
            Series(train, "grad_norm_avg", "avg", dim, gap_markers=True),
            Series(train, "grad_norm_max", "max", dim)], True, True),
        "lr": ChartSpec("Learning rate", [Series(train, "lr", "lr", dim)], False, True),
        "throughput": ChartSpec("Throughput (tokens/s)", [
            Series(_with_throughput(train), "tokens_per_s", "tokens/s", dim)], True, False),
    }  # fmt: skip
    if is_distributed(view.frames["train"]):
        ranks = train.assign(rank_step_time_ratio=rank_time_ratio(train))
        specs["straggler"] = ChartSpec(STRAGGLER_TITLE, [
            Series(ranks, "rank_step_time_min_s", "fastest rank's time", dim),
            Series(ranks, "rank_step_time_max_s", "slowest rank's time", dim),
            Series(ranks, "rank_step_time_ratio", "slowest / fastest", dim),
            Series(ranks, "slowest_rank", "slowest rank", dim),
            Series(ranks, "ranks_in_lockstep", "ranks in lockstep", dim)], False, False, kind="straggler")  # fmt: skip
    return specs


def replay_highlights(view: RunView, x: str) -> list[Highlight]:
    """Shaded x-ranges of each replay window: the superseded tail and its redo, with the loss change."""
    train = view.frames["train"]
    origin = pd.Timestamp(view.sessions[0].start_time) if view.sessions else None
    result = []
    for window in replay_windows(train, view.sessions, view.replaced):
        session = view.sessions[window.session]
        rows = view.replaced[window.session] | (
            (train["session_id"] == session.session_id)
            & (train["step"] >= window.first_step) & (train["step"] <= window.last_step)
        ).to_numpy()  # fmt: skip
        if x in ("step", "tokens_seen"):
            xs = x_values(train[rows], x, origin)
            x0 = session.first_step if x == "step" else session.first_tokens_seen
            delta = "" if window.loss_delta is None else f" · Δloss {window.loss_delta:+.3g}"
            label = f"replay S{window.session}→S{window.session + 1}{delta}"
            result.append(Highlight(float(x0), float(np.max(xs)), label, session_colour(window.session)))
    return result


def run_charts(view: RunView, options: ChartOptions, *, max_points: int = CHART_POINTS) -> dict[str, Figure]:
    """Every chart of the run page as a figure (each with a budget of ``max_points`` drawn points)."""
    highlights = replay_highlights(view, options.x) if options.history == "sessions" else []
    return {key: _spec_figure(view, key, spec, options, highlights, max_points)
            for key, spec in chart_specs(view, options.history).items()}  # fmt: skip


def _spec_figure(
    view: RunView, key: str, spec: ChartSpec, options: ChartOptions, highlights: Sequence[Highlight], max_points: int
) -> Figure:
    """``spec`` drawn; ``layout.uirevision`` names what keeps the user's zoom (run, chart, axes, history)."""
    if spec.kind == "straggler":
        first = spec.series[0]
        return straggler_figure(
            first.frame, sessions=view.sessions, superseded=first.superseded, x=options.x, highlights=highlights,
            revision=f"{view.name}:{key}:{options.x}:{options.history}", max_points=max_points, theme=options.theme,
        )  # fmt: skip
    log_y = options.log_y and spec.loggable
    return metric_figure(
        spec.series,
        title=spec.title,
        sessions=view.sessions,
        x=options.x,
        smoothing=options.smoothing if spec.smoothed else 0.0,
        log_y=log_y,
        revision=f"{view.name}:{key}:{options.x}:{log_y}:{options.history}",
        highlights=highlights,
        max_points=max_points,
        theme=options.theme,
    )


def chart_key(key: str) -> str:
    """The Streamlit key of the run page's live chart ``key`` (its element carries the class
    ``st-key-<that>``)."""
    return f"chart_{key}"


EMA_FORGET = 1e-7  # the smoothing's warm-up: rows until the start's weight falls below this


def warmup_rows(options: ChartOptions) -> int:
    """Rows before the first new one that a chart of a tail needs: the smoothing's memory, and one
    row for the throughput's difference."""
    if options.smoothing <= 0:
        return 2
    return int(np.ceil(np.log(EMA_FORGET) / np.log(options.smoothing))) + 2


def chart_csv(spec: ChartSpec) -> str:
    """Exactly the rows a chart draws (raw, not downsampled, not smoothed), as CSV."""
    parts = []
    for item in spec.series:
        if item.column not in item.frame.columns:
            continue
        part = item.frame[["session_id", "step", "tokens_seen", "time", item.column]].rename(
            columns={item.column: "value"}
        )
        part.insert(0, "series", item.label)
        part.insert(1, "metric", item.column)
        part["superseded"] = item.superseded if item.superseded is not None else False
        parts.append(part)
    return pd.concat(parts).to_csv(index=False) if parts else ""


def session_overlay(view: RunView, *, x: str, smoothing: float, theme: str = "light") -> Figure:
    """The sessions page's chart: every session's loss on one axis, replay windows shaded."""
    spec = chart_specs(view, "sessions")["loss"]
    return metric_figure(
        spec.series, title="Loss by session", sessions=view.sessions, x=x, smoothing=smoothing,
        revision=f"{view.name}:sessions:{x}", highlights=replay_highlights(view, x), theme=theme,
    )  # fmt: skip


def compare_chart(
    views: Mapping[str, RunView],
    metric: str,
    *,
    x: str,
    smoothing: float,
    log_y: bool,
    theme: str = "light",
    legend: bool = True,
) -> Figure:
    """One metric of several runs (effective histories), each run a colour and named by its path;
    ``legend`` False leaves the runs' key to another chart (one colour per run on every chart)."""
    event, label = COMPARE_METRICS[metric]
    series = []
    for number, (name, view) in enumerate(views.items()):
        frame = view.effective(event)
        if metric == "tokens_per_s":
            frame = _with_throughput(frame)
        # Validation is sparse (every N steps): drawn raw with markers, as on the run page, not smoothed.
        series.append(Series(frame, metric, name, markers=event == "validation",
                             colour=RUN_COLOURS[number % len(RUN_COLOURS)]))  # fmt: skip
    figure = metric_figure(
        series, title=label, sessions=[], x=x, smoothing=smoothing, log_y=log_y,
        revision=f"compare:{metric}:{x}:{log_y}:{','.join(views)}", theme=theme,
    )  # fmt: skip
    return Figure(data=figure["data"], layout={**figure["layout"], "showlegend": legend})
