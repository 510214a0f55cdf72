"""RunStore and a writer killed with SIGKILL: the run reads as crashed at the next refresh, not
after the heartbeat."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from tests.support import append_records, base_record, spawn_python

WRITER_THEN_WAIT = """
import sys, time
from metrics_core import MetricsWriter, RunContext, TrainingState
with MetricsWriter(RunContext(sys.argv[1], "r", "s1")) as writer:
    for step in (1, 2, 3):
        writer.write("train", TrainingState(step=step), train_loss=1.0)
    print("written", flush=True)
    time.sleep(600)
"""


def test_a_killed_writer_reads_crashed_at_the_next_refresh_not_after_the_heartbeat(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A real writer holding its lock is live on the runs page; SIGKILLed, its run reads crashed at
    the very next runs page, though its last record is seconds old: on a local disk a free lock is a
    dead writer.  So does a file that no writer ever locked, and a store started after the kill,
    and ``summary`` and ``query`` in a terminal."""
    writer = spawn_python(WRITER_THEN_WAIT, str(tmp_path / "r"))
    try:
        assert writer.stdout.readline().strip() == "written"
        append_records(
            tmp_path / "plain" / "metrics.jsonl",
            base_record(1, train_loss=1.0, time=datetime.now(timezone.utc).isoformat()),
        )
        store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
        try:
            status = lambda: store.runs_table().set_index("run")["status"].to_dict()  # noqa: E731
            assert status() == {"r": "live", "plain": "crashed"}
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=30)
            assert status() == {"r": "crashed", "plain": "crashed"}
        finally:
            store.close()
    finally:
        writer.kill()
        writer.wait()
    fresh = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        assert fresh.runs_table(now=datetime.now(timezone.utc)).set_index("run").loc["r", "status"] == "crashed"
    finally:
        fresh.close()
    terminal = {
        "summary": ["summary", str(tmp_path / "r")],
        "query": ["query", str(tmp_path), "SELECT status FROM runs WHERE run = 'r'", "--format", "csv",
                  "--cache-dir", str(tmp_path_factory.mktemp("cache"))],
    }  # fmt: skip
    for command, arguments in terminal.items():
        said = subprocess.run([sys.executable, "-m", "metrics_core", *arguments, "--quiet"], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert said.returncode == 0 and "crashed" in said.stdout and "live" not in said.stdout, (command, said)
