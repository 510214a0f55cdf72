"""The built-in demo: a sweep trained through the real writer, its live run's crashes with torn
tails and resumes, written only inside its root, and dying with the dashboard that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from metrics_core.dashboard.demo import STORY_RUN, SWEEP
from metrics_core.read.run_digest import RunDigest
from metrics_core.read.run_reader import RunReader
from metrics_core.read.run_status import run_status
from metrics_core.roots.discovery import find_runs
from tests.support import read_records, spawn_python


def test_demo_trains_a_sweep_whose_live_run_crashes_and_resumes(tmp_path: Path) -> None:
    """Four runs, two learning rates × two seeds, each with its config; the live run has three
    sessions, each resume cut a torn tail and redid steps; skips and clipping happen; the others
    finish in one session.  Nothing is written outside the root."""
    root = tmp_path / "demo"
    subprocess.run(
        [sys.executable, "-m", "metrics_core.dashboard.demo", str(root), "--steps", "1100", "--pace", "0"],
        check=True, timeout=240,
    )  # fmt: skip
    assert [run.name for run in find_runs(root)] == sorted(SWEEP)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
    for name, (lr, seed) in SWEEP.items():
        written = sorted(p.name for p in (root / name).iterdir())
        assert written == [".metrics.jsonl.failure", "checkpoints", "metrics.jsonl"]  # the history dir is gone
        reader = RunReader(root / name)
        reader.refresh()
        assert reader.bad_lines == 0 and reader.pending_bytes == 0
        configs = [r["config"] for r in read_records(root / name / "metrics.jsonl") if r["event"] == "config"]
        assert {(config["optim"]["lr"], config["seed"]) for config in configs} == {(lr, seed)}
        assert reader.sessions[-1].end_status == "finished" and len(reader.sessions) == (3 if name == STORY_RUN else 1)
        train = reader.frame("train")
        assert train["train_loss"].iloc[-1] < train["train_loss"].iloc[0]
    reader = RunReader(root / STORY_RUN)
    reader.refresh()
    s1, s2, s3 = reader.sessions
    assert s1.discarded_bytes == 0 and s2.discarded_bytes > 0 and s3.discarded_bytes > 0
    assert s2.resumed_from_step < s1.last_step and s2.steps_replayed > 0
    assert s3.resumed_from_step < s2.last_step and s3.steps_replayed > 0
    assert (s1.end_status, s2.end_status, s3.end_status) == (None, None, "finished")
    train = reader.frame("train")
    assert train["skipped_updates_in_window"].sum() > 0
    assert (train["clipped_fraction"] > 0).any()
    assert (train["attempted_updates"] == train["updates"] + train["skipped_updates_in_window"]).all()


def test_the_demo_reads_live_from_the_moment_it_appears(tmp_path: Path) -> None:
    """Its replayed crashes are history: from its first readable record to its live windows, every
    read of the run's status says live, never crashed (a torn tail with no writer) nor stalled."""
    run = tmp_path / "demo" / STORY_RUN
    demo = subprocess.Popen([sys.executable, "-m", "metrics_core.dashboard.demo", str(run.parent), "--pace", "0.05"])
    statuses: list[str] = []
    digest = None
    try:
        deadline = time.monotonic() + 120
        live = lambda: digest and len(digest.sessions) == 3 and digest.sessions[2].records > 10  # noqa: E731
        while time.monotonic() < deadline and not live():
            if digest is None and (run / "metrics.jsonl").exists():
                digest = RunDigest(run)
            if digest is not None:
                digest.refresh()
                statuses.append(run_status(digest, now=datetime.now(UTC)))
            time.sleep(0.02)
    finally:
        demo.terminate()
        demo.wait(timeout=30)
    assert digest is not None and digest.sessions[2].records > 10
    assert set(statuses) == {"live"}


PARENT = """
import sys, time
from pathlib import Path
from metrics_core.dashboard.demo import start_demo
process = start_demo(Path(sys.argv[1]))
print(process.pid, flush=True)
time.sleep(120)
"""


def demo_pids(root: Path, *, besides: int) -> set[int]:
    """Processes running the demo module on ``root`` (other than ``besides``, the test's parent)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "metrics_core.dashboard.demo" in command and str(root) in command:
                pids.add(int(entry.name))
    return pids - {besides}


def test_demo_stops_when_the_dashboard_process_dies(tmp_path: Path) -> None:
    """SIGKILL the process that started the demo: supervisor and trainer exit on their own."""
    root = tmp_path / "demo"
    parent = spawn_python(PARENT, str(root))
    supervisor = int(parent.stdout.readline())
    deadline = time.monotonic() + 60
    while not (root / STORY_RUN / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert supervisor in demo_pids(root, besides=parent.pid)  # and a trainer, unless between sessions
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    while demo_pids(root, besides=parent.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert demo_pids(root, besides=parent.pid) == set()
