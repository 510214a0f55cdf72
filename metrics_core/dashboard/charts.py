"""The pages' charts and tables, as pure functions of ``RunView`` snapshots and page options."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from metrics_core.analysis import ReplayWindow, replay_windows, tokens_per_second
from metrics_core.dashboard.figures import (
    STRAGGLER_TITLE,
    Highlight,
    Series,
    is_distributed,
    metric_figure,
    rank_time_ratio,
    session_colour,
    straggler_figure,
    x_values,
)
from metrics_core.dashboard.store import RunView
from metrics_core.diagnostics import Finding, diagnose

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
_log = logging.getLogger(__name__)
RUN_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


@dataclass(frozen=True)
class ChartOptions:
    """What the run page's controls choose."""

    x: str = "step"
    smoothing: float = 0.0
    log_y: bool = False
    history: str = "effective"


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


def replays(view: RunView) -> list[ReplayWindow]:
    return replay_windows(view.frames["train"], view.sessions, view.replaced)


def replay_highlights(view: RunView, x: str) -> list[Highlight]:
    """Shaded x-ranges of each replay window: the superseded tail and its redo, with the loss change."""
    train = view.frames["train"]
    origin = pd.Timestamp(view.sessions[0].start_time) if view.sessions else None
    result = []
    for window in replays(view):
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


def run_charts(view: RunView, options: ChartOptions) -> dict[str, go.Figure]:
    """Every chart of the run page as a figure."""
    highlights = replay_highlights(view, options.x) if options.history == "sessions" else []
    specs = chart_specs(view, options.history)
    figures = {
        key: metric_figure(
            spec.series,
            title=spec.title,
            sessions=view.sessions,
            x=options.x,
            smoothing=options.smoothing if spec.smoothed else 0.0,
            log_y=options.log_y and spec.loggable,
            revision=f"{view.name}:{key}:{options.x}:{options.log_y and spec.loggable}:{options.history}",
            highlights=highlights,
        )
        for key, spec in specs.items()
        if spec.kind == "lines"
    }
    if "straggler" in specs:
        first = specs["straggler"].series[0]
        figures["straggler"] = straggler_figure(
            first.frame, sessions=view.sessions, superseded=first.superseded, x=options.x, highlights=highlights,
            revision=f"{view.name}:straggler:{options.x}:{options.history}",
        )  # fmt: skip
    return figures


def view_charts(view: RunView, options: ChartOptions) -> dict[str, go.Figure]:
    """``run_charts`` computed once per snapshot and options, shared by every tab."""
    return view.memo(("charts", options), lambda: run_charts(view, options))


def view_findings(view: RunView) -> list[Finding]:
    """The run's diagnostics, computed once per snapshot; diagnostics that fail on odd data are
    themselves a finding, never a page that fails to load."""
    return view.memo("findings", lambda: _diagnose(view))


def _diagnose(view: RunView) -> list[Finding]:
    try:
        return diagnose(train=view.frames["train"], sessions=view.sessions, replaced=view.replaced, ingest=view.ingest)
    except Exception as exc:
        _log.warning("diagnostics of run %r failed", view.name, exc_info=True)
        return [Finding("error", "diagnostics", f"the checks could not run on this data: {type(exc).__name__}: {exc}")]


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


def session_overlay(view: RunView, *, x: str, smoothing: float) -> go.Figure:
    """The sessions page's chart: every session's loss on one axis, replay windows shaded."""
    spec = chart_specs(view, "sessions")["loss"]
    return metric_figure(
        spec.series, title="Loss by session", sessions=view.sessions, x=x, smoothing=smoothing,
        revision=f"{view.name}:sessions:{x}", highlights=replay_highlights(view, x),
    )  # fmt: skip


def compare_chart(views: Mapping[str, RunView], metric: str, *, x: str, smoothing: float, log_y: bool) -> go.Figure:
    """One metric of several runs (effective histories), each run a colour and named by its path."""
    event, label = COMPARE_METRICS[metric]
    series = []
    for number, (name, view) in enumerate(views.items()):
        frame = view.effective(event)
        if metric == "tokens_per_s":
            frame = _with_throughput(frame)
        series.append(Series(frame, metric, name, colour=RUN_COLOURS[number % len(RUN_COLOURS)]))
    return metric_figure(
        series, title=label, sessions=[], x=x, smoothing=smoothing, log_y=log_y,
        revision=f"compare:{metric}:{x}:{log_y}:{','.join(views)}",
    )  # fmt: skip
