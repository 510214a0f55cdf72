"""Runs for the alert tests of every tier: loss series written through a real training session,
healthy or not, and a window holding one loss."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from metrics_core import TrainingWindow
from metrics_core.write.training_session import training_session
from tests.support import read_records


def write_run(directory: Path, losses: list[float], *, fail: bool = False) -> None:
    """One session through ``training_session``: a window per loss, then finished (or failed)."""

    def windows() -> None:
        with training_session(directory, handle_sigterm=False) as session:
            for loss in losses:
                session.window.add(loss, 100, 0.5, False, 1.0)
                session.log_window(1e-3)
            if fail:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

    if fail:
        with pytest.raises(RuntimeError):
            windows()
    else:
        windows()


def healthy(count: int, seed: int) -> list[float]:
    noise = random.Random(seed)
    return [3.0 / (1 + step / 10) + noise.uniform(-0.02, 0.02) for step in range(count)]


def training_window_with(loss: float) -> TrainingWindow:
    window = TrainingWindow()
    window.add(loss, 100, 0.5, False, 1.0)
    return window


def write_losses(directory: Path, losses: list[float]) -> None:
    """A finished run through the real writer: one window per loss."""
    with training_session(directory, handle_sigterm=False) as session:
        for loss in losses:
            session.window.add(loss, 100, 0.5, False, 1.0)
            session.log_window(1e-3)


def nan_and_healthy_runs(root: Path) -> None:
    write_losses(root / "nan", [2.0, 1.9, math.nan])
    write_losses(root / "ok", [2.0, 1.9, 1.8])
    last = [r for r in read_records(root / "nan" / "metrics.jsonl") if r["event"] == "train"][-1]
    assert last["train_loss"] is None and last["nonfinite_loss"] is True  # what the writer records
