"""Per-log-window training statistics, accumulated between two ``train`` records.

Why this exists: the usual ``mean(losses)`` over a window is wrong twice over.  It weights a
short batch like a long one, and it forgets that an FP16-overflow step *consumed* its tokens
without producing an update.  ``TrainingWindow`` keeps the quantities separate:

* every attempt adds its loss weighted by its tokens, its tokens and one attempt — skipped or not;
* only successful updates count as updates and contribute gradient-norm statistics;
* a non-finite gradient norm on a successful update is counted, never averaged in;
* an update is clipped when a positive ``max_grad_norm`` is set and the pre-clip norm exceeds it;
* a NaN or infinite loss is accepted, never raised on: a diverged run is the moment it most needs
  its records, so its training loop must not die of its metrics.  The window's ``train_loss`` is
  then ``None`` with ``nonfinite_loss: True`` (a token-weighted mean over it has no value, and
  JSON has no NaN), as the framework integrations write it; the loop decides what to do.

``summary()`` reports ``None`` for a quantity with no data (no tokens, no successful update),
never a made-up zero, and its output goes straight into ``MetricsWriter.write("train", ...)``.
The window is reset at each log boundary; it is not checkpoint state.
"""

from __future__ import annotations

import math
import operator
import sys
from dataclasses import dataclass, field, fields
from typing import Any

from metrics_core.errors import RecordTypeError, RecordValueError


def _is_tensor(value: Any) -> bool:
    """A torch tensor, recognised without importing torch (it is loaded if one exists)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "device")


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


@dataclass(frozen=True, slots=True)
class WindowTotals:
    """The additive sums of a window, from which a ``train`` record is derived.

    Kept apart from ``TrainingWindow`` so that one process's sums and the sums reduced over a
    process group (``metrics_core.write.distributed``) become a record by the same code.
    ``grad_norm_max`` is ``-inf`` when no finite norm was counted.
    """

    loss_sum: float
    tokens: int
    attempts: int
    updates: int
    skips: int
    grad_norms: int
    grad_norm_sum: float
    grad_norm_max: float
    nonfinite: int
    clipped: int

    def summary(self, lr: float | None) -> dict[str, Any]:
        """The ``train`` record fields.  A non-finite loss anywhere in the window makes ``loss_sum``
        non-finite: it is noticed here, once per window (for tensor losses that avoids a device sync
        per step), and reported as ``train_loss`` None plus ``nonfinite_loss`` True."""
        nonfinite_loss = not math.isfinite(self.loss_sum)
        summary = {
            "train_loss": self.loss_sum / self.tokens if self.tokens and not nonfinite_loss else None,
            "lr": lr,
            "tokens": self.tokens,
            "attempted_updates": self.attempts,
            "updates": self.updates,
            "skipped_updates_in_window": self.skips,
            "grad_norm_avg": self.grad_norm_sum / self.grad_norms if self.grad_norms else None,
            "grad_norm_max": self.grad_norm_max if self.grad_norms else None,
            "clipped_fraction": self.clipped / self.updates if self.updates else None,
            "nonfinite_grad_norms": self.nonfinite,
        }
        if nonfinite_loss:
            summary["nonfinite_loss"] = True
        return summary


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
    _device_attempts: Any = field(default=None, repr=False, compare=False)

    def add(
        self,
        loss: Any,
        tokens: int,
        grad_norm: Any = None,
        skipped: Any = False,
        max_grad_norm: float | None = None,
    ) -> None:
        """Record one optimizer attempt (one backward pass + step or skip).

        ``grad_norm`` is the pre-clipping norm (what ``clip_grad_norm_`` returns); ``None`` means
        it was not measured.  ``loss``, ``grad_norm`` and ``skipped`` may be 0-d torch tensors:
        then nothing is transferred to the host until ``summary()`` (see ``tensor_window``).  A NaN
        or infinite loss is accumulated like any other and reported by ``summary()``; invalid
        input (a loss that is not a number, a bad token count) raises before anything is
        accumulated.
        """
        count = _token_count(tokens)
        if "torch" in sys.modules and any(map(_is_tensor, (loss, grad_norm, skipped))):
            if self._device_attempts is None:
                from metrics_core.write.tensor_window import TensorAttempts

                device = next(value.device for value in (loss, grad_norm, skipped) if _is_tensor(value))
                self._device_attempts = TensorAttempts(device)
            self._device_attempts.add(loss, count, grad_norm, skipped, max_grad_norm)
            self.tokens += count
            self.attempts += 1
            return
        loss_value = float(loss)
        self.loss_sum += loss_value * count  # NaN or ±inf stays so: summary() reports it
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

    def host_totals(self) -> WindowTotals:
        """The sums of the attempts added as Python numbers (tensor attempts are not in them)."""
        return WindowTotals(
            loss_sum=self.loss_sum,
            tokens=self.tokens,
            attempts=self.attempts,
            updates=self.updates,
            skips=self.skips,
            grad_norms=self.grad_norms,
            grad_norm_sum=self.grad_norm_sum,
            grad_norm_max=self.grad_norm_max if self.grad_norms else -math.inf,
            nonfinite=self.nonfinite_grad_norms,
            clipped=self.clipped_updates,
        )

    def summary(self, lr: float | None = None) -> dict[str, Any]:
        """The window as the fields of a ``train`` record (one host transfer if tensors were added)."""
        totals = self.host_totals()
        if self._device_attempts is not None:
            device = self._device_attempts.fold()
            totals = WindowTotals(
                loss_sum=totals.loss_sum + device["loss_sum"],
                tokens=totals.tokens,
                attempts=totals.attempts,
                updates=totals.updates + int(device["updates"]),
                skips=totals.skips + int(device["skips"]),
                grad_norms=totals.grad_norms + int(device["grad_norms"]),
                grad_norm_sum=totals.grad_norm_sum + device["grad_norm_sum"],
                grad_norm_max=max(totals.grad_norm_max, device["grad_norm_max"]),
                nonfinite=totals.nonfinite + int(device["nonfinite"]),
                clipped=totals.clipped + int(device["clipped"]),
            )
        return totals.summary(lr)

    def reset(self) -> None:
        """Start a new window (call after each ``train`` record)."""
        for item in fields(self):
            setattr(self, item.name, item.default)
