"""The run page's charts, as pure functions of a ``RunView`` and the page's options."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from metrics_core.analysis import tokens_per_second
from metrics_core.dashboard.figures import Series, metric_figure
from metrics_core.dashboard.store import RunView


@dataclass(frozen=True)
class ChartOptions:
    """What the run page's controls choose."""

    x: str = "step"
    smoothing: float = 0.0
    log_y: bool = False
    history: str = "effective"  # or "all": superseded records drawn dimmed


def _rows(view: RunView, event: str, history: str) -> tuple[pd.DataFrame, np.ndarray | None]:
    if history == "effective":
        return view.effective(event), None
    return view.frames[event], view.superseded[event]


def run_charts(view: RunView, options: ChartOptions) -> dict[str, go.Figure]:
    """Loss, clipped fraction, skipped updates, grad norm, LR and throughput, keyed by chart id."""
    train, train_superseded = _rows(view, "train", options.history)
    validation, validation_superseded = _rows(view, "validation", options.history)
    throughput = train.assign(tokens_per_s=tokens_per_second(train)) if len(train) else train
    # chart id: (title, series, smoothed, log-scale allowed)
    specs: dict[str, tuple[str, list[Series], bool, bool]] = {
        "loss": ("Loss", [
            Series(train, "train_loss", "train", train_superseded),
            Series(validation, "val_loss", "validation", validation_superseded, markers=True),
        ], True, True),
        "clipped": ("Clipped fraction", [
            Series(train, "clipped_fraction", "clipped", train_superseded, gap_markers=True),
        ], False, False),
        "skipped": ("Skipped updates", [
            Series(train, "skipped_updates_in_window", "per window", train_superseded),
            Series(train, "skipped_updates", "cumulative", train_superseded, secondary_y=True),
        ], False, False),
        "grad_norm": ("Gradient norm (pre-clip)", [
            Series(train, "grad_norm_avg", "avg", train_superseded, gap_markers=True),
            Series(train, "grad_norm_max", "max", train_superseded),
        ], True, True),
        "lr": ("Learning rate", [Series(train, "lr", "lr", train_superseded)], False, True),
        "throughput": ("Throughput (tokens/s)", [
            Series(throughput, "tokens_per_s", "tokens/s", train_superseded),
        ], True, False),
    }  # fmt: skip
    return {
        key: metric_figure(
            series,
            title=title,
            sessions=view.sessions,
            x=options.x,
            smoothing=options.smoothing if smoothed else 0.0,
            log_y=options.log_y and loggable,
            revision=f"{view.name}:{key}:{options.x}:{options.log_y and loggable}",
        )
        for key, (title, series, smoothed, loggable) in specs.items()
    }
