"""A hyperparameter sweep written through the project's own writer, for the tests and benchmarks of
grouped runs: peak learning rates × seeds, each run a directory ``<prefix>lr<value>-seed<n>`` with
a ``config`` record (``peak_lr``, ``seed`` and a constant ``warmup``), ``train`` records every 10
steps (``train_loss``, ``lr``, and ``epoch``, a counter that grows) and ``validation`` every 50.

Deterministic: the same arguments write the same bytes (a fixed clock, seeded noise), so two test
modules may share a run.  ``short`` runs stop at half the steps, as a diverged or killed run does.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Sequence
from pathlib import Path

from metrics_core.write.writer import MetricsWriter, RunContext, TrainingState

PEAK_LRS = (1e-4, 3e-4, 1e-3)
SEEDS = (0, 1, 2, 3)
START_NS = 1_764_400_000 * 10**9
STEPS_PER_EPOCH = 50


def sweep_name(prefix: str, peak_lr: float, seed: int) -> str:
    """The run name of one point of the sweep."""
    return f"{prefix}lr{peak_lr:g}-seed{seed}"


def write_sweep(
    root: Path,
    *,
    prefix: str = "sweep/",
    peak_lrs: Sequence[float] = PEAK_LRS,
    seeds: Sequence[int] = SEEDS,
    steps: int = 400,
    extra_keys: int = 0,
    short: Collection[str] = (),
) -> list[str]:
    """Write one run per (peak_lr, seed) under ``root``; return their names.  ``extra_keys`` more
    numbers per train record (``k/000`` ...); the runs named in ``short`` stop at ``steps // 2``."""
    names = []
    for peak_lr in peak_lrs:
        for seed in seeds:
            name = sweep_name(prefix, peak_lr, seed)
            last = steps // 2 if name in short else steps
            _write_run(root / name, name, peak_lr=peak_lr, seed=seed, steps=last, extra_keys=extra_keys)
            names.append(name)
    return names


def _write_run(directory: Path, name: str, *, peak_lr: float, seed: int, steps: int, extra_keys: int) -> None:
    rng = random.Random(f"{name}")
    clock = iter(range(START_NS, START_NS + 10**15, 10**9))
    state = TrainingState()
    run = RunContext(str(directory), name, "s1")
    with MetricsWriter(run, clock=lambda: next(clock)) as writer:
        writer.write("session_start", state)
        writer.write_config(state, {"peak_lr": peak_lr, "seed": seed, "warmup": 100})
        for step in range(10, steps + 1, 10):
            state.step, state.tokens_seen = step, step * 4096
            loss = 2.0 + 6.0 / math.sqrt(1 + step * peak_lr * 100) + rng.gauss(0, 0.05)
            extra = {f"k/{number:03d}": rng.random() for number in range(extra_keys)}
            lr = peak_lr * min(1.0, step / 100)
            writer.write("train", state, train_loss=loss, lr=lr, epoch=step // STEPS_PER_EPOCH, **extra)
            if step % 50 == 0:
                writer.write("validation", state, val_loss=loss + 0.1 + rng.gauss(0, 0.02), val_tokens=65536)
        writer.write("session_end", state, status="finished")
