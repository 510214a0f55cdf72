"""Cost of MetricsWriter.write() and TrainingWindow.add() against their floors, measured side by side.

Run: python benchmarks/bench_writer.py [--calls 20000] [--rounds 3]
Floor of write(): ``orjson.dumps`` of the finished record dict (its time string already made, the
newline appended by orjson) + ``write`` + ``flush`` on an open buffered binary file, i.e. what any
JSONL logger must pay; write() adds validation, the timestamp and the base fields.  Each round
times ``--calls`` calls of each, one call at a time and alternating, and takes the medians; the
ratio printed is the median of the rounds' ratios.
Floor of add(): the same four field updates done inline on plain attributes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
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


def median_ns_per_call(candidates: dict[str, Callable[[], object]], calls: int) -> dict[str, float]:
    """Median ns of one call of each candidate, over ``calls`` calls each, the candidates alternating
    call by call so that the machine's noise falls on all of them alike."""
    clock = time.perf_counter_ns
    taken: dict[str, list[int]] = {name: [] for name in candidates}
    pairs = [(fn, taken[name].append) for name, fn in candidates.items()]
    for _ in range(calls):
        for fn, keep in pairs:
            start = clock()
            fn()
            keep(clock() - start)
    return {name: statistics.median(values) for name, values in taken.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000, help="calls of write() and of the floor per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
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
            floor_file.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
            floor_file.flush()

        with MetricsWriter(RunContext(Path(tmp) / "run", "r", "s")) as writer:
            rounds = [
                median_ns_per_call(
                    {"write": lambda: writer.write("train", state, **TRAIN_VALUES), "floor": floor_write}, args.calls
                )
                for _ in range(args.rounds)
            ]
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
    ratios = [timed["write"] / timed["floor"] for timed in rounds]
    print(
        f"write(): median {statistics.median(r['write'] for r in rounds) / 1000:.2f} us, floor "
        f"{statistics.median(r['floor'] for r in rounds) / 1000:.2f} us, ratio {statistics.median(ratios):.2f}x "
        f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)}; medians of {args.calls:,} calls; targets: <= 5 us, <= 2.5x)"
    )
    print(
        f"add():   median {adds['add']:.3f} us, floor {adds['floor']:.3f} us, ratio {adds['add'] / adds['floor']:.2f}x"
    )


if __name__ == "__main__":
    main()
