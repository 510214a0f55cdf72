"""Alerts posted for real: runs written by real writers (killed or hung ones too), a local HTTP
receiver that is down, refuses or answers, and the ``alerts`` command run as a process."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.alerts.alerter import Alerter
from metrics_core.alerts.rules import AlertConfig
from metrics_core.alerts.webhooks import Alert, Delivery
from tests.support import Receiver, interruptible, spawn_python
from tests.support.alerts import healthy, training_window_with, write_run

LATER = timedelta(seconds=600)  # past the stall threshold of a run logging every few ms


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    yield started
    started.close()


WRITER = """
import sys, time
from metrics_core.write.training_session import training_session
with training_session(sys.argv[1], handle_sigterm=False) as session:
    for _ in range(20):
        session.window.add(2.0, 100, 0.5, False, 1.0)
        session.log_window(1e-3)
    print("ready", flush=True)
    while True:
        if sys.argv[2] == "hang":
            time.sleep(1)  # holds the writer's lock and writes nothing: a hung collective
        else:
            session.window.add(2.0, 100, 0.5, False, 1.0)
            session.log_window(1e-3)
"""


def start_writer(directory: Path, mode: str) -> subprocess.Popen:
    """A real writer process that logs 20 windows, says so, then hangs or keeps writing."""
    child = spawn_python(WRITER, str(directory), mode)
    watchdog = threading.Timer(60, child.kill)  # a child that never gets ready fails the test, never hangs it
    watchdog.start()
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
    finally:
        watchdog.cancel()
    return child


def test_each_bad_run_posts_exactly_once_and_healthy_runs_none(tmp_path: Path, receiver: Receiver) -> None:
    """NaN, failed, SIGKILLed and hung runs each get one POST, over passes; healthy runs none."""
    root = tmp_path / "runs"
    write_run(root / "healthy", healthy(40, 1))
    write_run(root / "team" / "also-healthy", healthy(40, 2))
    write_run(root / "nan", [*healthy(20, 3), math.nan, 1.5])
    write_run(root / "failed", healthy(5, 4), fail=True)
    write_run(root / "diverged", [*healthy(20, 5), math.inf])
    crashed = start_writer(root / "crashed", "write")
    crashed.send_signal(signal.SIGKILL)
    crashed.wait(timeout=30)
    hung = start_writer(root / "stalled", "hang")
    alerter = Alerter(root, webhook=receiver.url)
    try:
        now = datetime.now(timezone.utc)
        alerter.tick(now=now)
        assert "stalled" not in receiver.by_run()  # its last records are seconds old: live
        for later in (now + LATER, now + 2 * LATER, now + 3 * LATER):
            alerter.tick(now=later)
        assert alerter.delivery.pending == 0
        assert receiver.by_run() == {"nan": 1, "diverged": 1, "failed": 1, "crashed": 1, "stalled": 1}
        conditions = {post["run"]: post["condition"] for post in receiver.posts}
        assert conditions == {"nan": "nonfinite_loss", "diverged": "nonfinite_loss", "failed": "failed",
                              "crashed": "crashed", "stalled": "stalled"}  # fmt: skip
        failed = next(post for post in receiver.posts if post["run"] == "failed")
        assert "illegal memory access" in failed["message"] and failed["state"] == "firing"
        assert set(failed) == {"source", "state", "run", "root", "condition", "message", "step", "time"}
        assert set(alerter.evaluator.firing()) == {"nan", "diverged", "failed", "crashed", "stalled"}
    finally:
        hung.kill()
        hung.wait(timeout=30)
        alerter.close()


def test_nan_window_then_recovery_fires_once_and_clears(tmp_path: Path, receiver: Receiver) -> None:
    """A loop that kept going after a NaN: one POST when it lands, nothing while it holds, a cleared
    alert (not posted by default) once clear_after_windows finite windows followed."""
    root = tmp_path / "runs"
    context = RunContext(root / "nan", "nan", "s1")
    state = TrainingState()
    alerter = Alerter(root, AlertConfig(clear_after_windows=2), webhook=receiver.url)
    with MetricsWriter(context) as writer:
        window = training_window_with(2.0)
        writer.write("train", state, **window.summary(1e-3))
        alerter.tick()
        window = training_window_with(math.nan)
        writer.write("train", state, **window.summary(1e-3))
        assert [(a.condition, a.state) for a in alerter.tick()] == [("nonfinite_loss", "firing")]
        assert alerter.tick() == []
        writer.write("train", state, **training_window_with(1.9).summary(1e-3))
        assert alerter.tick() == []
        writer.write("train", state, **training_window_with(1.8).summary(1e-3))
        assert [(a.condition, a.state) for a in alerter.tick()] == [("nonfinite_loss", "cleared")]
    assert [post["condition"] for post in receiver.posts] == ["nonfinite_loss"]
    assert [(a.run, a.state) for a in alerter.evaluator.recent()] == [("nan", "firing"), ("nan", "cleared")]
    alerter.close()


def test_receiver_down_then_up_gets_the_alert_once(tmp_path: Path) -> None:
    """Connection refused, then 503, then 200: retried with doubling backoff, delivered exactly once."""
    probe = Receiver()
    port = int(probe.url.split(":")[2].split("/")[0])
    url = probe.url
    probe.close()  # nothing listens on the port now: the receiver is down
    clock = [0.0]
    reports: list[str] = []
    delivery = Delivery(url, root=str(tmp_path), clock=lambda: clock[0], backoff_s=1.0, report=reports.append)
    delivery.put(Alert("nan", "nonfinite_loss", "firing", "train loss is NaN", datetime.now(timezone.utc), 7))
    assert delivery.pump() == 1.0  # refused: next try in 1 s
    assert delivery.pump() == 1.0 and delivery.stats["failed_attempts"] == 1  # not due yet: no attempt
    up = Receiver(port, codes=(503,))
    try:
        clock[0] = 1.0
        assert delivery.pump() == 2.0  # 503: the backoff doubled
        clock[0] = 3.0
        assert delivery.pump() is None
        clock[0] = 100.0
        assert delivery.pump() is None
        assert [post["condition"] for post in up.posts] == ["nonfinite_loss"]
        assert delivery.stats == {"sent": 1, "failed_attempts": 2, "rejected": 0, "dropped": 0}
        assert len(reports) == 2 and all("127.0.0.1" in report and "/hook" not in report for report in reports)
    finally:
        up.close()


def test_a_4xx_is_final_and_the_queue_moves_on(tmp_path: Path) -> None:
    """A receiver that refuses a body (400) is not retried; the next alert goes through."""
    receiver = Receiver(codes=(400,))
    try:
        delivery = Delivery(receiver.url, root=str(tmp_path), report=lambda message: None)
        for run in ("a", "b"):
            delivery.put(Alert(run, "crashed", "firing", "gone", datetime.now(timezone.utc)))
        assert delivery.pump() is None
        assert [post["run"] for post in receiver.posts] == ["b"] and delivery.stats["rejected"] == 1
    finally:
        receiver.close()


def test_alerts_command_once_posts_and_prints(tmp_path: Path, receiver: Receiver) -> None:
    """``python -m metrics_core alerts ROOT --webhook URL --once``: one POST per bad run, a line each."""
    root = tmp_path / "runs"
    write_run(root / "ok", healthy(30, 6))
    write_run(root / "nan", [*healthy(12, 7), math.nan])
    write_run(root / "failed", healthy(3, 8), fail=True)
    done = subprocess.run([sys.executable, "-m", "metrics_core", "alerts", str(root), "--webhook", receiver.url,
                           "--once"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert receiver.by_run() == {"nan": 1, "failed": 1}
    printed = done.stdout.splitlines()
    assert len(printed) == 2 and all("firing" in line for line in printed)
    assert any("nan  nonfinite_loss: train loss was NaN" in line for line in printed)


def test_alerts_command_once_with_state_posts_each_condition_once_across_calls(
    tmp_path: Path, receiver: Receiver
) -> None:
    """--once from cron: with --state a second call posts nothing and a new condition once; a state
    file that is not one is refused (exit 2), never overwritten."""
    root, state = tmp_path / "runs", tmp_path / "alerts-state.json"
    write_run(root / "nan", [2.0, math.nan])
    once = [sys.executable, "-m", "metrics_core", "alerts", str(root), "--webhook", receiver.url, "--once"]

    def call(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*once, *extra], capture_output=True, text=True, timeout=120)

    assert call("--state", str(state)).returncode == 0 and call("--state", str(state)).returncode == 0
    assert receiver.by_run() == {"nan": 1}
    write_run(root / "failed", [2.0], fail=True)
    assert call("--state", str(state)).returncode == 0
    assert receiver.by_run() == {"nan": 1, "failed": 1}
    assert call().returncode == 0  # without a state every call alerts anew
    assert receiver.by_run() == {"nan": 2, "failed": 2}
    state.write_text("[1, 2]")
    refused = call("--state", str(state))
    assert refused.returncode == 2 and "not an alerts state file" in refused.stderr and state.read_text() == "[1, 2]"


def wait_for(condition: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def test_alerts_command_keeps_watching_and_posts_each_new_condition_once(tmp_path: Path, receiver: Receiver) -> None:
    """Without --once: a condition is posted once over many passes, a new one (the run resumed and
    failed) once more; Ctrl-C ends it with status 0."""
    root = tmp_path / "runs"
    write_run(root / "nan", [2.0, math.nan])
    command = [
        sys.executable,
        "-m",
        "metrics_core",
        "alerts",
        str(root),
        "--webhook",
        receiver.url,
        "--interval",
        "0.1",
    ]
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=interruptible)  # fmt: skip
    try:
        wait_for(lambda: len(receiver.posts) == 1)
        write_run(root / "nan", [1.9], fail=True)
        wait_for(lambda: len(receiver.posts) == 2)
        time.sleep(1.0)  # passes go on; none may post again
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    assert [(post["run"], post["condition"]) for post in receiver.posts] == [
        ("nan", "nonfinite_loss"),
        ("nan", "failed"),
    ]
    assert [line.split()[2] for line in out.splitlines()] == ["firing", "firing"]


def test_alerts_command_refuses_a_bad_config_in_one_line(tmp_path: Path) -> None:
    """An unknown key is refused before any pass, naming the file and the key; exit status 2."""
    (tmp_path / "runs").mkdir()
    config = tmp_path / "alerts.toml"
    config.write_text("spike_z = 4\nspike_zz = 5\n")
    done = subprocess.run([sys.executable, "-m", "metrics_core", "alerts", str(tmp_path / "runs"), "--config",
                           str(config), "--once"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and str(config) in done.stderr and "'spike_zz'" in done.stderr


def test_alerts_command_refuses_a_webhook_url_with_a_space_once_without_its_secret(
    tmp_path: Path, receiver: Receiver
) -> None:
    """`alerts ROOT --webhook "<URL with a space>"` on a root with a NaN run: refused before any pass
    in one line naming the receiver by scheme and host only, exit status 2, nothing posted."""
    root = tmp_path / "runs"
    write_run(root / "nan", [*healthy(12, 9), math.nan])
    url = f"{receiver.url}/T0/B0/sec ret"
    done = subprocess.run([sys.executable, "-m", "metrics_core", "alerts", str(root), "--webhook", url, "--once"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stdout == "" and receiver.posts == []
    assert done.stderr.count("\n") == 1 and "a space or a control character" in done.stderr, done.stderr
    assert "127.0.0.1" in done.stderr and "T0" not in done.stderr and "sec" not in done.stderr


def test_old_runs_raise_no_new_alert(tmp_path: Path, receiver: Receiver) -> None:
    """An alerter started on a root of runs that crashed long ago pages no one (ignore_after_h)."""
    root = tmp_path / "runs"
    write_run(root / "old-nan", [2.0, math.nan])
    alerter = Alerter(root, webhook=receiver.url)
    assert alerter.tick(now=datetime.now(timezone.utc) + timedelta(hours=25)) == []
    assert receiver.posts == []
    alerter.close()


def test_the_terminal_tools_do_not_load_the_network_code() -> None:
    """``tail`` and ``summary`` share cli.py with ``alerts``: http.client and urllib.request load only to post."""
    code = (
        "import sys, metrics_core.cli.main; print(sorted({'http.client', 'urllib.request', 'ssl'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


def record(step: int, *, event: str = "train", **values: object) -> dict:
    return {"event": event, "step": step, "session_id": "s1", **values}


def train(step: int, loss: float | None, *, skipped: int = 0, session: str = "s1", **values: object) -> dict:
    counts = {"attempted_updates": 10, "skipped_updates_in_window": skipped, "session_id": session}
    if loss is None or math.isfinite(loss):
        return record(step, train_loss=loss, **counts, **values)
    return record(step, train_loss=None, nonfinite_loss=True, **counts)
