"""Per-log-window training statistics, accumulated between two ``train`` records.

Why this exists: the usual ``mean(losses)`` over a window is wrong twice over.  It weights a
short batch like a long one, and it forgets that an FP16-overflow step *consumed* its tokens
without producing an update.  ``TrainingWindow`` keeps the quantities separate:

* every attempt adds its loss weighted by its tokens, its tokens and one attempt — skipped or not;
* only successful updates count as updates and contribute gradient-norm statistics;
* a non-finite gradient norm on a successful update is counted, never averaged in;
* an update is clipped when a positive ``max_grad_norm`` is set and the pre-clip norm exceeds it.

``summary()`` reports ``None`` for a quantity with no data (no tokens, no successful update),
never a made-up zero, and its output goes straight into ``MetricsWriter.write("train", ...)``.
The window is reset at each log boundary; it is not checkpoint state.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, fields
from typing import Any

from metrics_core.errors import RecordTypeError, RecordValueError


def _finite_loss(loss: Any) -> float:
    value = float(loss)
    if not math.isfinite(value):
        raise RecordValueError(
            f"loss is {value!r}: a non-finite loss cannot be token-weighted; the window was not changed"
        )
    return value


def _token_count(tokens: Any) -> int:
    if isinstance(tokens, bool):
        raise RecordTypeError("tokens is a bool: expected the int number of tokens in the batch")
    try:
        count = operator.index(tokens)
    except TypeError:
        raise RecordTypeError(
            f"tokens has type {type(tokens).__qualname__}: expected the int number of tokens in the batch"
        ) from None
    if count < 0:
        raise RecordValueError(f"tokens is {count}: a batch cannot hold a negative number of tokens")
    return count


@dataclass
class TrainingWindow:
    """Accumulates one log window of optimizer attempts; see the module docstring."""

    loss_sum: float = 0.0
    tokens: int = 0
    attempts: int = 0
    updates: int = 0
    skips: int = 0
    grad_norms: int = 0
    grad_norm_sum: float = 0.0
    grad_norm_max: float = 0.0
    nonfinite_grad_norms: int = 0
    clipped_updates: int = 0

    def add(
        self,
        loss: float,
        tokens: int,
        grad_norm: float | None = None,
        skipped: bool = False,
        max_grad_norm: float | None = None,
    ) -> None:
        """Record one optimizer attempt (one backward pass + step or skip).

        ``grad_norm`` is the pre-clipping norm (what ``clip_grad_norm_`` returns); ``None`` means
        it was not measured.  Invalid input raises before anything is accumulated.
        """
        loss_value = _finite_loss(loss)
        count = _token_count(tokens)
        self.loss_sum += loss_value * count
        self.tokens += count
        self.attempts += 1
        if skipped:
            self.skips += 1
            return
        self.updates += 1
        if grad_norm is None:
            return
        norm = float(grad_norm)
        if not math.isfinite(norm):
            self.nonfinite_grad_norms += 1
            return
        self.grad_norms += 1
        self.grad_norm_sum += norm
        self.grad_norm_max = max(self.grad_norm_max, norm)
        if max_grad_norm is not None and max_grad_norm > 0 and norm > max_grad_norm:
            self.clipped_updates += 1

    def summary(self, lr: float | None = None) -> dict[str, Any]:
        """The window as the fields of a ``train`` record."""
        return {
            "train_loss": self.loss_sum / self.tokens if self.tokens else None,
            "lr": lr,
            "tokens": self.tokens,
            "attempted_updates": self.attempts,
            "updates": self.updates,
            "skipped_updates_in_window": self.skips,
            "grad_norm_avg": self.grad_norm_sum / self.grad_norms if self.grad_norms else None,
            "grad_norm_max": self.grad_norm_max if self.grad_norms else None,
            "clipped_fraction": self.clipped_updates / self.updates if self.updates else None,
            "nonfinite_grad_norms": self.nonfinite_grad_norms,
        }

    def reset(self) -> None:
        """Start a new window (call after each ``train`` record)."""
        for field in fields(self):
            setattr(self, field.name, field.default)
