"""TrainingWindow: token weighting, skipped-update semantics, grad-norm statistics, None summaries."""

from __future__ import annotations

import math

import numpy as np
import pytest

from metrics_core import (
    MetricsWriter,
    RecordTypeError,
    RecordValueError,
    RunContext,
    TrainingState,
    TrainingWindow,
)
from tests.support import read_records

SUMMARY_KEYS = {
    "train_loss",
    "lr",
    "tokens",
    "attempted_updates",
    "updates",
    "skipped_updates_in_window",
    "grad_norm_avg",
    "grad_norm_max",
    "clipped_fraction",
    "nonfinite_grad_norms",
}


def test_loss_is_token_weighted_not_batch_averaged() -> None:
    """(2.0 over 100 tokens, 4.0 over 300 tokens) is 3.5, not the batch mean 3.0."""
    window = TrainingWindow()
    window.add(2.0, 100, 1.0, False, 1.0)
    window.add(4.0, 300, 1.0, False, 1.0)
    assert window.summary(1e-3)["train_loss"] == pytest.approx(3.5)


def test_skipped_attempt_consumes_tokens_but_is_not_an_update() -> None:
    """An FP16-overflow skip counts its tokens, loss and attempt, but no update or grad norm."""
    window = TrainingWindow()
    window.add(2.0, 100, 0.5, False, 1.0)
    window.add(6.0, 100, math.inf, True, 1.0)
    summary = window.summary(3e-4)
    assert summary == {
        "train_loss": pytest.approx(4.0),
        "lr": 3e-4,
        "tokens": 200,
        "attempted_updates": 2,
        "updates": 1,
        "skipped_updates_in_window": 1,
        "grad_norm_avg": 0.5,
        "grad_norm_max": 0.5,
        "clipped_fraction": 0.0,
        "nonfinite_grad_norms": 0,
    }
    assert summary["attempted_updates"] == summary["updates"] + summary["skipped_updates_in_window"]


def test_empty_window_reports_none_not_zero() -> None:
    """No data means None for every derived quantity, never a fabricated 0."""
    summary = TrainingWindow().summary(None)
    assert set(summary) == SUMMARY_KEYS
    assert summary["train_loss"] is None
    assert summary["grad_norm_avg"] is None and summary["grad_norm_max"] is None
    assert summary["clipped_fraction"] is None
    assert (summary["tokens"], summary["attempted_updates"], summary["updates"]) == (0, 0, 0)


def test_all_skipped_window_has_loss_but_no_update_statistics() -> None:
    """A window of only skipped attempts still reports its loss; update statistics are None."""
    window = TrainingWindow()
    for _ in range(3):
        window.add(3.0, 10, math.nan, True, 1.0)
    summary = window.summary(1e-4)
    assert summary["train_loss"] == 3.0 and summary["skipped_updates_in_window"] == 3
    assert summary["updates"] == 0
    assert summary["grad_norm_avg"] is None and summary["grad_norm_max"] is None
    assert summary["clipped_fraction"] is None


def test_nonfinite_grad_norm_on_successful_update_is_counted_not_averaged() -> None:
    """A successful update with an inf/NaN norm is an update, counted as non-finite, outside the mean."""
    window = TrainingWindow()
    window.add(1.0, 10, 2.0, False, 1.0)
    window.add(1.0, 10, math.inf, False, 1.0)
    window.add(1.0, 10, math.nan, False, 1.0)
    window.add(1.0, 10, 4.0, False, 1.0)
    summary = window.summary(1e-3)
    assert summary["updates"] == 4 and summary["nonfinite_grad_norms"] == 2
    assert summary["grad_norm_avg"] == 3.0 and summary["grad_norm_max"] == 4.0
    assert summary["clipped_fraction"] == 0.5  # 2.0 and 4.0 exceed 1.0; clipped / updates


@pytest.mark.parametrize(("max_grad_norm", "expected"), [(1.5, 1 / 3), (0.0, 0.0), (None, 0.0), (-1.0, 0.0)])
def test_clipping_needs_a_positive_threshold_exceeded(max_grad_norm: float | None, expected: float) -> None:
    """Only a norm strictly above a positive max_grad_norm counts as clipped."""
    window = TrainingWindow()
    for norm in (1.0, 1.5, 2.0):
        window.add(1.0, 1, norm, False, max_grad_norm)
    assert window.summary(1.0)["clipped_fraction"] == pytest.approx(expected)


def test_grad_norm_not_measured_is_not_counted() -> None:
    """grad_norm=None records an update without inventing a norm."""
    window = TrainingWindow()
    window.add(1.0, 5)
    summary = window.summary(1.0)
    assert summary["updates"] == 1 and summary["grad_norm_avg"] is None and summary["nonfinite_grad_norms"] == 0


def test_numpy_inputs_accumulate_like_floats() -> None:
    """numpy scalars are accepted for loss, tokens and grad norm."""
    a, b = TrainingWindow(), TrainingWindow()
    a.add(np.float32(2.5), np.int64(8), np.float64(0.7), np.bool_(False), 1.0)
    b.add(2.5, 8, 0.7, False, 1.0)
    assert a.summary(1.0) == pytest.approx(b.summary(1.0))


@pytest.mark.parametrize(
    ("loss", "tokens", "error"),
    [
        (1.0, -1, RecordValueError),
        (1.0, 2.5, RecordTypeError),
        (1.0, True, RecordTypeError),
    ],
)
def test_bad_input_raises_and_leaves_the_window_unchanged(loss: float, tokens: object, error: type) -> None:
    """Invalid token counts raise a clear error before anything is accumulated."""
    window = TrainingWindow()
    window.add(1.0, 10, 1.0, False, 1.0)
    before = window.summary(1.0)
    with pytest.raises(error):
        window.add(loss, tokens, 1.0, False, 1.0)
    assert window.summary(1.0) == before


def test_reset_starts_a_new_window() -> None:
    """After reset the window is indistinguishable from a new one."""
    window = TrainingWindow()
    window.add(1.0, 10, 2.0, False, 1.0)
    window.reset()
    assert window == TrainingWindow()


def test_summary_goes_straight_into_the_writer(run: RunContext) -> None:
    """summary() output is valid keyword arguments for write("train", ...), None values included."""
    window, state = TrainingWindow(), TrainingState()
    window.add(2.0, 64, 0.9, False, 1.0)
    window.add(2.0, 64, math.inf, True, 1.0)
    state.step, state.tokens_seen, state.skipped_updates = 1, 128, 1
    with MetricsWriter(run) as writer:
        writer.write("train", state, **window.summary(2e-4))
        writer.write("train", state, **TrainingWindow().summary(2e-4))
    first, empty = read_records(writer.path)
    assert first["train_loss"] == 2.0 and first["skipped_updates_in_window"] == 1
    assert set(empty) >= SUMMARY_KEYS and empty["train_loss"] is None and empty["clipped_fraction"] is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_loss_is_recorded_not_raised(run: RunContext, bad: float) -> None:
    """A NaN/inf loss reaches the file as train_loss null + nonfinite_loss true; the loop goes on."""
    window, state = TrainingWindow(), TrainingState()
    with MetricsWriter(run) as writer:
        window.add(2.0, 100, 0.5, False, 1.0)
        window.add(bad, 100, math.inf, True, 1.0)
        writer.write("train", state, **window.summary(1e-3))
        window.reset()
        window.add(2.0, 100, 0.5, False, 1.0)
        writer.write("train", state, **window.summary(1e-3))
    diverged, recovered = read_records(writer.path)
    assert diverged["train_loss"] is None and diverged["nonfinite_loss"] is True
    assert (diverged["tokens"], diverged["attempted_updates"], diverged["updates"]) == (200, 2, 1)
    assert diverged["skipped_updates_in_window"] == 1 and diverged["grad_norm_avg"] == 0.5
    assert recovered["train_loss"] == 2.0 and "nonfinite_loss" not in recovered
