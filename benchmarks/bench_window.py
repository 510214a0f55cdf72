"""Cost of TrainingWindow.add() per attempt: Python floats vs 0-d CPU tensors, side by side.

Run: python benchmarks/bench_window.py   (needs torch; CPU build: pip install torch==2.13.0)
On a GPU the tensor path's point is not its CPU cost but that it never waits for the device; this
measures what it adds to the host's work per step, which is what a training loop pays.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import median_us_interleaved
from metrics_core import TrainingWindow


def main() -> None:
    floats, tensors = TrainingWindow(), TrainingWindow()
    loss, norm, skipped = torch.tensor(2.5), torch.tensor(0.9), torch.tensor(False)

    def add_tensor() -> None:
        tensors.add(loss, 4096, norm, skipped, 1.0)
        if tensors.attempts >= 100:
            tensors.reset()

    def add_float() -> None:
        floats.add(2.5, 4096, 0.9, False, 1.0)

    def loss_item() -> None:  # what a naive logger does every step: one host transfer
        loss.item()

    medians = median_us_interleaved({"float": add_float, "tensor": add_tensor, "item": loss_item}, calls=100)
    # (each batch's 100 tensor attempts are folded away so the window stays a realistic size)
    ratio = medians["tensor"] / medians["float"]
    print(f"add() floats: {medians['float']:.2f} us   add() 0-d CPU tensors: {medians['tensor']:.2f} us "
          f"(ratio {ratio:.1f}x)   one loss.item(): {medians['item']:.2f} us")  # fmt: skip
    window = TrainingWindow()
    for _ in range(100):
        window.add(loss, 4096, norm, skipped, 1.0)
    summary_us = median_us_interleaved({"summary": lambda: window.summary(1e-3)}, calls=20, batches=10)
    print(f"summary() of a 100-attempt tensor window (its one host transfer): {summary_us['summary']:.0f} us")


if __name__ == "__main__":
    main()
