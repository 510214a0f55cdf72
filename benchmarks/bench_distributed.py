"""Cost of reducing a log window across ranks (gloo, CPU, loopback), beside a single-process summary().

Run: python benchmarks/bench_distributed.py   (needs torch; CPU build: pip install torch==2.13.0)
Spawns 2 and then 4 real processes on 127.0.0.1.  Each rank holds a 100-attempt window (Python
floats, then 0-d tensors) and times, interleaved in the same run: ``TrainingWindow.summary()``
(local, what a single process pays), ``DistributedWindow.summary()`` (its two all_reduce
included), and one bare 1-element all_reduce (the floor any collective pays).  Rank 0 prints
medians.  With more processes than cores the collective also measures the scheduler: on a
2-core machine read the 4-process line as an upper bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import median_us_interleaved
from metrics_core.testing.live_server import free_port

ATTEMPTS = 100


def child(rank: int, world: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    from metrics_core import TrainingWindow
    from metrics_core.write.distributed import DistributedWindow

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    one = torch.zeros(1, dtype=torch.float64)
    lines = []
    for kind in ("floats", "tensors"):
        plain, reduced = TrainingWindow(), DistributedWindow()
        for i in range(ATTEMPTS):
            loss, norm, skipped = 2.0 + rank + i / ATTEMPTS, 0.5 + i / ATTEMPTS, i % 17 == 0
            if kind == "tensors":
                loss, norm, skipped = torch.tensor(loss), torch.tensor(norm), torch.tensor(skipped)
            for window in (plain, reduced):
                window.add(loss, 4096 + 64 * rank, norm, skipped, 1.0)
        medians = median_us_interleaved(
            {"local": lambda w=plain: w.summary(1e-3), "reduced": lambda w=reduced: w.summary(1e-3),
             "bare": lambda: dist.all_reduce(one)},
            calls=20, batches=25,
        )  # fmt: skip
        lines.append(
            f"{world} ranks, {ATTEMPTS}-attempt window of {kind:7}: summary() local {medians['local']:7.0f} us   "
            f"reduced across ranks {medians['reduced']:7.0f} us   (one bare all_reduce: {medians['bare']:5.0f} us)"
        )
    dist.destroy_process_group()
    if rank == 0:
        print("\n".join(lines), flush=True)


def main() -> None:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    print(f"{os.cpu_count()} CPU cores; gloo over loopback")
    for world in (2, 4):
        port = free_port()
        ranks = [
            subprocess.Popen([sys.executable, __file__, "--child", str(rank), str(world), str(port)], env=env)
            for rank in range(world)
        ]
        try:
            for process in ranks:
                if process.wait(timeout=600) != 0:
                    raise SystemExit(f"a rank exited with status {process.returncode}")
        finally:
            for process in ranks:
                if process.poll() is None:
                    process.kill()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(*map(int, sys.argv[2:]))
    else:
        main()
