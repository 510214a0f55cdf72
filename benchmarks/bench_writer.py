"""Cost of MetricsWriter.write() and TrainingWindow.add() against their floors, measured side by side.

Run: python benchmarks/bench_writer.py
Floor of write(): orjson.dumps + write + flush of the same dict on an open binary file, i.e. what
any JSONL logger must pay; write() adds validation, the timestamp and the base fields.
Floor of add(): the same four field updates done inline on plain attributes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import median_us_interleaved
from metrics_core import MetricsWriter, RunContext, TrainingState, TrainingWindow

TRAIN_VALUES = {
    "train_loss": 2.3456789,
    "lr": 3e-4,
    "tokens": 524288,
    "attempted_updates": 10,
    "updates": 9,
    "skipped_updates_in_window": 1,
    "grad_norm_avg": 0.87654,
    "grad_norm_max": 1.2345,
    "clipped_fraction": 0.1111,
    "nonfinite_grad_norms": 0,
}


class _Floor:
    __slots__ = ("attempts", "loss_sum", "tokens", "updates")

    def __init__(self) -> None:
        self.loss_sum, self.tokens, self.attempts, self.updates = 0.0, 0, 0, 0


def main() -> None:
    state = TrainingState(step=1000, tokens_seen=10**9, skipped_updates=3)
    with tempfile.TemporaryDirectory() as tmp:
        floor_file = open(Path(tmp) / "floor.jsonl", "ab")  # noqa: SIM115
        record = {
            "schema_version": 1,
            "time": "2026-11-29T17:00:00.000000+00:00",
            "run_id": "r",
            "session_id": "s",
            "event": "train",
            "step": 1000,
            "tokens_seen": 10**9,
            "skipped_updates": 3,
            **TRAIN_VALUES,
        }

        def floor_write() -> None:
            floor_file.write(orjson.dumps(record) + b"\n")
            floor_file.flush()

        with MetricsWriter(RunContext(Path(tmp) / "run", "r", "s")) as writer:
            writes = median_us_interleaved(
                {"write": lambda: writer.write("train", state, **TRAIN_VALUES), "floor": floor_write}
            )
        floor_file.close()

    window, plain = TrainingWindow(), _Floor()

    def floor_add() -> None:
        plain.loss_sum += 2.5 * 4096
        plain.tokens += 4096
        plain.attempts += 1
        plain.updates += 1

    adds = median_us_interleaved(
        {"add": lambda: window.add(2.5, 4096, 0.9, False, 1.0), "floor": floor_add}, calls=5000
    )
    print(
        f"write(): median {writes['write']:.2f} us, floor {writes['floor']:.2f} us, "
        f"ratio {writes['write'] / writes['floor']:.2f}x  (targets: <= 5 us, <= 3x)"
    )
    print(
        f"add():   median {adds['add']:.3f} us, floor {adds['floor']:.3f} us, ratio {adds['add'] / adds['floor']:.2f}x"
    )


if __name__ == "__main__":
    main()
