"""A sweep written with the project's own writer: 3 peak learning rates × 4 seeds, each run a
``training_session`` with a config holding swept keys (``peak_lr``, ``seed``, and ``init``, a text
key that follows the seed) and keys every run shares.  Losses rise and fall, so a run's last value
is not its least; validation logs an accuracy, whose best is its greatest."""

from __future__ import annotations

import math
from pathlib import Path

from metrics_core.write.training_session import training_session

PEAK_LRS = (1e-4, 3e-4, 1e-3)
SEEDS = (0, 1, 2, 3)
SWEPT = ["init", "peak_lr", "seed"]
SHARED = {"model": "gpt2-small", "optim": {"name": "adamw", "betas": [0.9, 0.95]}, "warmup": 100}


def sweep_run_name(lr: float, seed: int) -> str:
    return f"sweep-lr{lr:g}-s{seed}"


def write_sweep(root: Path, *, windows: int = 12) -> list[str]:
    """The 12 runs under ``root``; returns their names."""
    names = []
    for lr in PEAK_LRS:
        for seed in SEEDS:
            name = sweep_run_name(lr, seed)
            config = {"peak_lr": lr, "seed": seed, "init": "normal" if seed % 2 else "xavier", **SHARED}
            with training_session(root / name, config=config, system_metrics=False) as session:
                for window in range(windows):
                    loss = 3.0 / (1 + 1000 * lr * window) + 0.05 * seed + 0.2 * math.sin(window + seed)
                    for _ in range(4):
                        session.window.add(loss, 256, 0.5, False, 1.0)
                    session.log_window(lr=lr * min(1.0, (window + 1) / 4))
                    if window % 4 == 3:
                        session.log_validation(
                            loss + 0.1, 1024, val_acc=0.5 + 0.3 * math.cos(window * lr * 1000 + seed)
                        )
            names.append(name)
    return names


NAMES_ORDER = [sweep_run_name(lr, seed) for lr in PEAK_LRS for seed in SEEDS]  # the order write_sweep writes them
