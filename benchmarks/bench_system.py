"""What system metrics cost a training loop, side by side with a 100 ms step.

Run: python benchmarks/bench_system.py [--windows 2000]

* per window, on the loop: ``log_window`` with ``system_metrics`` on minus off (median of
  ``--windows``, each window one ``add``), single process and, with torch installed, a
  ``DistributedWindow`` on a one-rank gloo group (the sample's slots in the window's SUM);
* off the loop: one sample on the sampler's thread (median of 50), and that cost spread over
  the default interval, the share of one core the thread takes;
* each as a percentage of a 100 ms step (the goal: at most 1 %).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.write.system_sampler import DEFAULT_INTERVAL_S, start_sampler
from metrics_core.write.training_session import training_session

STEP_MS = 100.0


def window_ms(directory: Path, windows: int, *, system_metrics: bool) -> float:
    """Median wall time of ``add`` + ``log_window`` with a real writer (page cache, no fsync)."""
    times = []
    with training_session(directory, system_metrics=system_metrics, handle_sigterm=False) as session:
        for _ in range(windows):
            start = time.perf_counter()
            session.window.add(1.0, 100)
            session.log_window(1e-3)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def sample_ms() -> float:
    sampler = start_sampler(interval=3600.0)
    if sampler is None:
        raise SystemExit("psutil is not installed: pip install metrics-core[system]")
    try:
        times = []
        for _ in range(50):
            start = time.perf_counter()
            sampler._sample()
            times.append(time.perf_counter() - start)
    finally:
        sampler.close()
    return statistics.median(times) * 1e3


def distributed_ms(windows: int) -> tuple[float, float] | None:
    """Median ``DistributedWindow.summary`` without and with a sample, on a one-rank gloo group."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    from metrics_core.write.distributed import DistributedWindow

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    sampler = start_sampler(interval=3600.0)
    sample = sampler.latest() if sampler is not None else {}
    try:
        result = []
        for system in (None, sample):
            window, times = DistributedWindow(), []
            for _ in range(windows):
                window.add(1.0, 100)
                start = time.perf_counter()
                window.summary(1e-3, system=system)
                times.append(time.perf_counter() - start)
                window.reset()
            result.append(statistics.median(times) * 1e3)
    finally:
        if sampler is not None:
            sampler.close()
        dist.destroy_process_group()
    return result[0], result[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        off = window_ms(Path(root) / "off", args.windows, system_metrics=False)
        on = window_ms(Path(root) / "on", args.windows, system_metrics=True)
    one_sample = sample_ms()
    spread = one_sample / (DEFAULT_INTERVAL_S * 1e3) * STEP_MS  # the thread's ms per 100 ms of training

    def row(what: str, ms: float) -> None:
        print(f"{what:<58} {ms:9.4f} ms  {100 * ms / STEP_MS:7.3f} % of a {STEP_MS:.0f} ms step")

    row("log_window, system metrics off", off)
    row("log_window, system metrics on", on)
    row("  cost per window (on - off)", on - off)
    reduced = distributed_ms(args.windows)
    if reduced is not None:
        row("DistributedWindow.summary, 1-rank gloo, no sample", reduced[0])
        row("DistributedWindow.summary, 1-rank gloo, with sample", reduced[1])
        row("  cost per window (with - without)", reduced[1] - reduced[0])
    row("one sample, on the sampler thread (off the loop)", one_sample)
    row(f"  that sample spread over its {DEFAULT_INTERVAL_S:.0f} s interval, per step", spread)


if __name__ == "__main__":
    main()
