"""MetricsLogHandler: a library's dict-valued log records become metrics.jsonl records."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest

from metrics_core import MetricsWriter, RunContext
from metrics_core.read.run_reader import RunReader
from metrics_core.write.logging_bridge import capture_logger


def test_speculators_style_metrics_are_captured(tmp_path: Path) -> None:
    """A logger with no handler and WARNING level (the lost-metrics failure) is captured by one call."""
    torch = pytest.importorskip(
        "torch", reason="the PyTorch CPU build is not installed (.ci/run: pip install torch==2.13.0)"
    )
    logger = logging.getLogger("speculators.metrics.test1")
    logger.setLevel(logging.WARNING)
    with MetricsWriter(RunContext(tmp_path / "r", "r", "s")) as writer:
        handler = capture_logger("speculators.metrics.test1", writer)
        logger.info({"train": {"loss": torch.tensor(0.75), "acc": np.float32(0.5)}, "step": 120, "epoch": 0})
        logger.info("plain text is not a metric")
        logger.info({"val/loss": math.nan, "global_step": 130, "event": "x", "lr": 1e-4})
        logger.removeHandler(handler)
    reader = RunReader(tmp_path / "r")
    assert reader.refresh() == 2
    frame = reader.frame("train")
    assert frame["step"].tolist() == [120, 130]
    assert frame["train/loss"][0] == 0.75 and frame["train/acc"][0] == 0.5 and frame["epoch"][0] == 0
    # written as null and named: a field that never held a value is not a column (docs/FORMAT.md)
    assert "val/loss" not in frame and frame["nonfinite_keys"][1] == "val/loss"
    assert frame["metric_event"][1] == "x"


def test_a_broken_value_never_reaches_the_training_loop(tmp_path: Path, capsys) -> None:
    """An error inside the handler is reported by logging, not raised at the call site."""
    logger = logging.getLogger("speculators.metrics.test2")
    with MetricsWriter(RunContext(tmp_path / "r", "r", "s")) as writer:
        handler = capture_logger("speculators.metrics.test2", writer)
        writer.close()  # a write now fails
        logger.info({"loss": 1.0})  # must not raise
        logger.removeHandler(handler)
    assert "WriterStateError" in capsys.readouterr().err
