"""Importing a TensorBoard logdir against TensorBoard's own ``EventAccumulator`` loading it.

Run: python benchmarks/bench_import_tensorboard.py [--scalars 1000000] [--rounds 1] [--logdir DIR]

The logdir: ``--scalars`` scalars in two runs, each written by TensorBoard's own
``EventFileWriter`` as two processes would (two event files, the second resumed over the last
quarter of the first's steps), four tags a step, one value an event (as torch's ``SummaryWriter``
logs).  Kept in ``--logdir`` and reused when it is there.  Its checksums are computed with
google-crc32c when installed (the same CRC-32C, only to make the logdir faster: every one is
checked by the loader when read).

Each round runs, in fresh processes one after the other, TensorBoard's ``EventAccumulator``
(every scalar kept: ``size_guidance`` 0) over each run, and ``python -m metrics_core import
tensorboard`` into an empty root; printed: the seconds of each, their ratio (the goal: at most
1.5), and each process's peak resident memory.  A second, half-size logdir's import shows the
import's memory does not grow with the logdir (``EventAccumulator`` holds every point).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TAGS = ("train/loss", "train/learning_rate", "train/grad_norm", "throughput")
RUNS = 2


def fast_checksums() -> None:
    """Make TensorBoard's record writer compute its CRC-32C with google-crc32c (module docstring)."""
    try:
        import google_crc32c
    except ImportError:
        return
    from tensorboard.summary.writer import record_writer

    def masked(data: bytes) -> int:
        crc = google_crc32c.value(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    record_writer.masked_crc32c = masked


def write_logdir(logdir: Path, scalars: int) -> None:
    """``scalars`` scalars over ``RUNS`` runs of two event files each (module docstring)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    fast_checksums()
    steps = scalars // (RUNS * len(TAGS))
    first_steps = steps * 4 // 5  # the first process logs 80%; the restart replays the last 25% of those
    resume = first_steps * 3 // 4
    for run in range(RUNS):
        for process, (start, stop) in enumerate(((0, first_steps), (resume, resume + steps - first_steps))):
            writer = EventFileWriter(str(logdir / f"run{run}"), max_queue_size=1000, filename_suffix=f".{process}")
            for step in range(start, stop):
                wall = 1.7e9 + process * 1e5 + step
                for number, tag in enumerate(TAGS):
                    value = Summary.Value(tag=tag, simple_value=1.0 / (step + 1 + number))
                    writer.add_event(Event(wall_time=wall, step=step, summary=Summary(value=[value])))
            writer.close()


def child(kind: str, logdir: Path, root: Path) -> None:
    """Run one candidate in this process and print its seconds and peak RSS as JSON."""
    start = time.perf_counter()
    if kind == "accumulator":
        from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator

        points = 0
        for run in sorted(path for path in logdir.iterdir() if path.is_dir()):
            accumulator = EventAccumulator(str(run), size_guidance={SCALARS: 0, TENSORS: 0})
            accumulator.Reload()
            points += sum(len(accumulator.Scalars(tag)) for tag in accumulator.Tags()["scalars"])
    else:
        from metrics_core.imports.tensorboard_import import import_logdir

        points = import_logdir(logdir, root).scalars
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "points": points, "peak_mib": peak_mib}))


def measure(kind: str, logdir: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-import-") as root:
        command = [sys.executable, __file__, "--child", kind, "--logdir", str(logdir), "--root", root]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scalars", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--logdir", type=Path, default=Path(tempfile.gettempdir()) / "bench-import-tensorboard")
    parser.add_argument("--child", choices=("accumulator", "import"))
    parser.add_argument("--root", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.logdir, args.root)
        return
    logdirs = {}
    for scalars in (args.scalars // 2, args.scalars):
        logdir = args.logdir / str(scalars)
        if not logdir.exists():
            start = time.perf_counter()
            write_logdir(logdir.with_suffix(".partial"), scalars)
            shutil.move(logdir.with_suffix(".partial"), logdir)
            print(f"wrote {scalars} scalars in {time.perf_counter() - start:.0f} s: {logdir}")
        logdirs[scalars] = logdir
    for round_number in range(args.rounds):
        theirs, ours = measure("accumulator", logdirs[args.scalars]), measure("import", logdirs[args.scalars])
        assert theirs["points"] == ours["points"] == args.scalars, (theirs, ours)
        print(
            f"round {round_number + 1}: {args.scalars} scalars: EventAccumulator {theirs['seconds']:.1f} s "
            f"(peak {theirs['peak_mib']:.0f} MiB), import {ours['seconds']:.1f} s (peak {ours['peak_mib']:.0f} MiB): "
            f"ratio {ours['seconds'] / theirs['seconds']:.2f}"
        )
    half = measure("import", logdirs[args.scalars // 2])
    print(f"import of {args.scalars // 2} scalars: {half['seconds']:.1f} s, peak {half['peak_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
