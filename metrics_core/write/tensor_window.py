"""The device half of ``TrainingWindow``: 0-d tensors kept on their device, reduced once per window.

Imported by ``TrainingWindow.add`` only when a tensor is passed, so torch stays optional and is
never imported by a training process that logs plain numbers.

Why: ``loss.item()`` or ``if skipped:`` on a CUDA tensor blocks the host until the GPU has
finished everything queued before it — a field report measured 1.3 s per optimizer step from
metric logging alone.  ``add`` therefore only keeps (detached) references to the step's scalars:
no device work at all, ~100× cheaper for the host than doing the window arithmetic as ~20 tiny
tensor ops every step.  ``fold`` stacks them and does the masked arithmetic — ``skipped`` masks,
it is never branched on — as a handful of vector ops, with the single transfer to the host at
the end, once per window.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# The order of ``fold_tensor``: the additive sums first, the one maximum last (-inf when no norm counted).
FOLD_NAMES = ("loss_sum", "updates", "skips", "grad_norms", "grad_norm_sum", "nonfinite", "clipped", "grad_norm_max")


class TensorAttempts:
    """One window's attempts that carried tensors; see the module docstring."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.losses: list[Any] = []
        self.tokens: list[int] = []
        self.norms: list[Any] = []
        self.skipped: list[Any] = []
        self.thresholds: list[float] = []
        self.measured: list[bool] = []

    def add(self, loss: Any, tokens: int, grad_norm: Any, skipped: Any, max_grad_norm: float | None) -> None:
        self.losses.append(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        self.tokens.append(tokens)
        self.norms.append(math.nan if grad_norm is None else grad_norm)
        self.measured.append(grad_norm is not None)
        self.skipped.append(skipped)
        self.thresholds.append(max_grad_norm if max_grad_norm is not None and max_grad_norm > 0 else math.inf)

    def _vector(self, values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        if all(isinstance(value, torch.Tensor) for value in values):
            return torch.stack([value.reshape(()) for value in values]).to(device=self.device, dtype=dtype)
        return torch.stack(
            [
                value.reshape(()).to(device=self.device, dtype=dtype)
                if isinstance(value, torch.Tensor)
                else torch.full((), value, dtype=dtype, device=self.device)
                for value in values
            ]
        )

    def fold_tensor(self) -> torch.Tensor:
        """The window's sums as one float64 vector on the window's device, in ``FOLD_NAMES`` order.

        No host transfer: ``metrics_core.write.distributed`` packs this into its collective as is.
        """
        f64 = torch.float64
        loss = self._vector(self.losses, f64)
        skip = self._vector(self.skipped, torch.bool)
        norm = self._vector(self.norms, f64)
        tokens = torch.tensor(self.tokens, dtype=f64, device=self.device)
        threshold = torch.tensor(self.thresholds, dtype=f64, device=self.device)
        measured = torch.tensor(self.measured, device=self.device)
        ok = ~skip
        finite = torch.isfinite(norm)
        counted = finite & ok
        return torch.stack(
            [
                (loss * tokens).sum(),
                ok.sum(),
                skip.sum(),
                counted.sum(),
                torch.where(counted, norm, 0.0).sum(),
                (ok & measured & ~finite).sum(),
                (counted & (norm > threshold)).sum(),
                torch.where(counted, norm, -math.inf).max(),
            ]
        ).to(f64)

    def fold(self) -> dict[str, float]:
        """The window's sums as Python numbers: the one host transfer of the window."""
        return dict(zip(FOLD_NAMES, self.fold_tensor().tolist(), strict=True))
