"""Alerts: real runs written by the real writer (and real writers killed or hung), a real local
HTTP receiver, the rules against a from-scratch oracle, and a pass that reads nothing new costing nothing."""

from __future__ import annotations

import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest

from metrics_core import MetricsWriter, RunContext, TrainingState, TrainingWindow
from metrics_core.alerts.evaluator import Alerter, AlertEvaluator
from metrics_core.alerts.rules import AlertConfig, RunRules, Threshold, load_config
from metrics_core.alerts.webhooks import Alert, Delivery, webhook_body
from metrics_core.errors import AlertConfigError
from metrics_core.write.training_session import training_session
from tests.support import Receiver, spawn_python

LATER = timedelta(seconds=600)  # past the stall threshold of a run logging every few ms


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    yield started
    started.close()


def write_run(directory: Path, losses: list[float], *, fail: bool = False) -> None:
    """One session through ``training_session``: a window per loss, then finished (or failed)."""

    def windows() -> None:
        with training_session(directory, handle_sigterm=False) as session:
            for loss in losses:
                session.window.add(loss, 100, 0.5, False, 1.0)
                session.log_window(1e-3)
            if fail:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

    if fail:
        with pytest.raises(RuntimeError):
            windows()
    else:
        windows()


def healthy(count: int, seed: int) -> list[float]:
    noise = random.Random(seed)
    return [3.0 / (1 + step / 10) + noise.uniform(-0.02, 0.02) for step in range(count)]


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


def training_window_with(loss: float) -> TrainingWindow:
    window = TrainingWindow()
    window.add(loss, 100, 0.5, False, 1.0)
    return window


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


def test_a_garbage_reply_is_retried_not_raised(tmp_path: Path) -> None:
    """A receiver that answers with no HTTP status line is treated as down: retried, never an exception."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_garbage() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"nonsense\r\n\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    delivery = Delivery(url, root=str(tmp_path), clock=lambda: 0.0, report=lambda message: None)
    delivery.put(Alert("a", "crashed", "firing", "gone", datetime.now(timezone.utc)))
    try:
        assert delivery.pump() == 1.0 and delivery.pending == 1 and delivery.stats["failed_attempts"] == 1
    finally:
        thread.join(timeout=30)
        listener.close()


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


def test_many_runs_second_pass_reads_nothing(tmp_path: Path) -> None:
    """200 runs: the first pass reads every byte once and keeps no ended run's file open; a pass
    with nothing appended reads no byte and parses no record; an append to a live run costs
    exactly the appended bytes."""
    root = tmp_path / "runs"
    for index in range(199):
        write_run(root / f"group{index % 10}" / f"run{index:03d}", healthy(12, index))
    live = RunContext(root / "live", "live", "s1")
    evaluator = AlertEvaluator(root)
    with MetricsWriter(live) as writer:
        state = TrainingState()
        writer.write("train", state, **training_window_with(2.0).summary(1e-3))
        total = sum(path.stat().st_size for path in root.rglob("metrics.jsonl"))
        assert evaluator.evaluate(now=datetime.now(timezone.utc)) == []
        assert (evaluator.stats["bytes_read"], evaluator.stats["runs_read"]) == (total, 200)
        assert open_metrics_files(root) == 2  # the live run's, by its writer and by the evaluator
        first = dict(evaluator.stats)
        assert evaluator.evaluate(now=datetime.now(timezone.utc)) == []
        assert {key: evaluator.stats[key] - first[key] for key in first} == {
            "passes": 1, "walks": 0, "bytes_read": 0, "records": 0, "runs_read": 0, "errors": 0}  # fmt: skip
        before = live.directory.joinpath("metrics.jsonl").stat().st_size
        writer.write("train", state, **training_window_with(1.9).summary(1e-3))
        appended = live.directory.joinpath("metrics.jsonl").stat().st_size - before
        evaluator.evaluate(now=datetime.now(timezone.utc))
        assert evaluator.stats["bytes_read"] - first["bytes_read"] == appended
        assert evaluator.stats["records"] - first["records"] == 1
    evaluator.close()


def open_metrics_files(root: Path) -> int:
    """Descriptors of this process open on a metrics file under ``root`` (Linux /proc)."""
    links = [os.readlink(link) for link in Path("/proc/self/fd").iterdir() if link.is_symlink()]
    return sum(link.startswith(str(root)) and link.endswith("metrics.jsonl") for link in links)


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
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


def test_config_file_sets_rules_and_thresholds(tmp_path: Path) -> None:
    """Every key of the TOML file reaches AlertConfig; a threshold on any logged key fires and clears."""
    path = tmp_path / "alerts.toml"
    path.write_text(
        'statuses = ["crashed", "interrupted"]\nspike_z = 4.5\nspike_windows = 20\nspike_min_windows = 5\n'
        "clipped_fraction_above = 0.9\nskipped_fraction_above = 0.25\nignore_after_h = 0\nnotify_cleared = true\n"
        'webhook = "https://hooks.slack.com/services/T/B/X"\n'
        '[[threshold]]\nkey = "val_loss"\nevent = "validation"\nabove = 4\n'
    )
    config = load_config(path)
    assert config == AlertConfig(
        statuses=("crashed", "interrupted"), spike_z=4.5, spike_windows=20, spike_min_windows=5,
        clipped_fraction_above=0.9, skipped_fraction_above=0.25, ignore_after_h=0, notify_cleared=True,
        webhook="https://hooks.slack.com/services/T/B/X",
        thresholds=(Threshold("val_loss", "validation", above=4.0),),
    )  # fmt: skip
    rules = RunRules(config)
    rules.add([record(1, event="validation", val_loss=4.5)])
    assert [c.name for c in rules.conditions("live")] == ["threshold validation.val_loss > 4"]
    rules.add([record(2, event="validation", val_loss=3.9)])
    assert rules.conditions("live") == []
    for bad, expected in (('statuses = ["exploded"]', "'exploded'"), ("spike_z = -1", "spike_z"),
                          ('[[threshold]]\nkey = "x"', "an above or a below"), ("nonfinite_loss = 1", "bool"),
                          ('webhook = "file:///etc/passwd"', "http"), ("spike_z = ", "not valid TOML")):  # fmt: skip
        path.write_text(bad + "\n")
        with pytest.raises(AlertConfigError, match=expected) as refused:
            load_config(path)
        assert str(path) in str(refused.value)


def record(step: int, *, event: str = "train", **values: object) -> dict:
    return {"event": event, "step": step, "session_id": "s1", **values}


def train(step: int, loss: float | None, *, skipped: int = 0, session: str = "s1", **values: object) -> dict:
    counts = {"attempted_updates": 10, "skipped_updates_in_window": skipped, "session_id": session}
    if loss is None or math.isfinite(loss):
        return record(step, train_loss=loss, **counts, **values)
    return record(step, train_loss=None, nonfinite_loss=True, **counts)


def test_skipped_updates_fire_except_in_a_sessions_first_window() -> None:
    """A session's first window may skip while FP16 loss scaling calibrates; 6 of 10 skipped later fires."""
    rules = RunRules(AlertConfig())
    rules.add([train(0, 2.0, skipped=10), train(10, 2.0, skipped=1)])
    assert rules.conditions("live") == []
    rules.add([train(20, 2.0, skipped=6)])
    (skipped,) = rules.conditions("live")
    assert skipped.name == "skipped_updates" and skipped.message.startswith("60% of the window's attempts skipped")
    rules.add([train(0, 2.0, skipped=10, session="s2")])  # a resumed session's first window
    assert [c.name for c in rules.conditions("live")] == ["skipped_updates"]  # still the last judged one
    rules.add([train(10, 2.0, skipped=0, session="s2")])
    assert rules.conditions("live") == []


def test_runs_that_appear_or_go_are_noticed_at_the_next_walk(tmp_path: Path) -> None:
    """A run created after a pass is read at the next walk of the root; one removed clears its alerts."""
    root = tmp_path / "runs"
    write_run(root / "first", [2.0, math.nan])
    clock = [0.0]
    evaluator = AlertEvaluator(root, rediscover_s=60.0, clock=lambda: clock[0])
    assert [(a.run, a.state) for a in evaluator.evaluate(now=datetime.now(timezone.utc))] == [("first", "firing")]
    write_run(root / "second", [2.0, math.inf])
    clock[0] = 30.0
    assert evaluator.evaluate(now=datetime.now(timezone.utc)) == []  # not walked yet
    (root / "first" / "metrics.jsonl").unlink()
    clock[0] = 60.0
    alerts = evaluator.evaluate(now=datetime.now(timezone.utc))
    assert {(a.run, a.state) for a in alerts} == {("first", "cleared"), ("second", "firing")}
    assert evaluator.stats["walks"] == 2 and set(evaluator.firing()) == {"second"}
    evaluator.close()


def test_spike_fires_holds_for_a_window_then_clears() -> None:
    """A loss 10x the recent level is a spike; it holds for clear_after_windows windows, then clears."""
    rules = RunRules(AlertConfig(spike_windows=10, spike_min_windows=5, clear_after_windows=10))
    rules.add([train(step, 2.0 + 0.01 * (step % 3)) for step in range(10)])
    assert rules.conditions("live") == []
    rules.add([train(10, 20.0)])
    (spike,) = rules.conditions("live")
    assert spike.name == "loss_spike" and spike.step == 10 and "20 at step 10" in spike.message
    rules.add([train(step, 2.0) for step in range(11, 20)])
    assert [c.name for c in rules.conditions("live")] == ["loss_spike"]
    rules.add([train(20, 2.0)])
    assert rules.conditions("live") == []


def test_flat_loss_noise_is_not_a_spike() -> None:
    """A constant loss and a rounding-level wobble on it raise nothing (the 1%-of-mean floor)."""
    rules = RunRules(AlertConfig())
    rules.add([train(step, 2.0 + (1e-9 if step % 7 == 0 else 0.0)) for step in range(500)])
    assert rules.conditions("finished") == []


def test_rules_fed_in_any_split_equal_the_from_scratch_oracle() -> None:
    """After every append, the incremental rules answer as new rules fed the whole prefix at once."""
    noise = random.Random(11)
    config = AlertConfig(spike_windows=8, spike_min_windows=4, clear_after_windows=5, clipped_fraction_above=0.5,
                         thresholds=(Threshold("grad_norm_max", above=3.0),))  # fmt: skip
    records = []
    for step in range(400):
        loss = noise.choice([2.0 + noise.gauss(0, 0.05)] * 30 + [9.0, math.nan, None])
        records.append(train(step, loss, clipped_fraction=noise.random(), grad_norm_max=noise.uniform(0, 4)))
        if step % 50 == 49:
            records.append(record(step, event="session_end", status="failed", error=f"boom {step}"))
    incremental, start = RunRules(config), 0
    while start < len(records):
        end = min(len(records), start + noise.randint(1, 9))
        incremental.add(records[start:end])
        oracle = RunRules(config)
        oracle.add(records[:end])
        for status in ("live", "failed"):
            assert incremental.conditions(status, age_s=5.0) == oracle.conditions(status, age_s=5.0)
        start = end


def test_old_runs_raise_no_new_alert(tmp_path: Path, receiver: Receiver) -> None:
    """An alerter started on a root of runs that crashed long ago pages no one (ignore_after_h)."""
    root = tmp_path / "runs"
    write_run(root / "old-nan", [2.0, math.nan])
    alerter = Alerter(root, webhook=receiver.url)
    assert alerter.tick(now=datetime.now(timezone.utc) + timedelta(hours=25)) == []
    assert receiver.posts == []
    alerter.close()


def test_webhook_bodies_by_host_keep_run_text_as_text() -> None:
    """Slack gets {"text"} with &<> escaped, Discord {"content"} with markdown escaped and no
    mentions, any other URL the generic object; a hostile run name stays text."""
    alert = Alert("<!channel> @everyone *x*\x1b[31m", "crashed", "firing", "gone", datetime(2026, 1, 2, 3, 4, 5,
                  tzinfo=timezone.utc), None)  # fmt: skip
    slack = orjson.loads(webhook_body("https://hooks.slack.com/services/T/B/X", alert, root="/r"))
    assert list(slack) == ["text"] and "&lt;!channel&gt;" in slack["text"] and "<" not in slack["text"]
    assert "\x1b" not in slack["text"]
    discord = orjson.loads(webhook_body("https://discord.com/api/webhooks/1/abc", alert, root="/r"))
    assert discord["allowed_mentions"] == {"parse": []} and "\\*x\\*" in discord["content"]
    assert "\\<!channel\\>" in discord["content"]
    undecodable = Alert("run-\udcff", "crashed", "firing", "gone", alert.time)  # a directory name of bad bytes
    for url in ("https://hooks.slack.com/services/T/B/X", "https://discord.com/api/webhooks/1/a", "http://h/"):
        assert "udcff" in webhook_body(url, undecodable, root="/r").decode()
    generic = orjson.loads(webhook_body("https://example.org/hook", alert, root="/r"))
    assert generic == {"source": "metrics_core", "state": "firing", "run": alert.run, "root": "/r", "step": None,
                       "condition": "crashed", "message": "gone", "time": "2026-01-02T03:04:05Z"}  # fmt: skip


def test_the_terminal_tools_do_not_load_the_network_code() -> None:
    """``tail`` and ``summary`` share cli.py with ``alerts``: http.client and urllib.request load only to post."""
    code = "import sys, metrics_core.cli.main; print(sorted({'http.client', 'urllib.request', 'ssl'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


def test_a_root_gone_for_a_while_keeps_its_runs_and_alerts(tmp_path: Path) -> None:
    """A root that cannot be walked (an NFS hiccup, a move) is an error counted, not an exception
    or a storm of cleared alerts; when it is back nothing fires again."""
    root = tmp_path / "runs"
    write_run(root / "nan", [2.0, math.nan])
    clock = [0.0]
    evaluator = AlertEvaluator(root, clock=lambda: clock[0])
    assert len(evaluator.evaluate(now=datetime.now(timezone.utc))) == 1
    root.rename(tmp_path / "away")
    clock[0] = 60.0
    assert evaluator.evaluate(now=datetime.now(timezone.utc)) == []
    assert evaluator.stats["errors"] == 1 and set(evaluator.firing()) == {"nan"}
    (tmp_path / "away").rename(root)
    clock[0] = 120.0
    assert evaluator.evaluate(now=datetime.now(timezone.utc)) == [] and evaluator.stats["walks"] == 2
    evaluator.close()


def test_a_paced_pass_is_paced_after_each_block_read_and_finds_what_an_unpaced_one_finds(tmp_path: Path) -> None:
    """A server's alerter waits between the blocks it reads (``pace``): called once per block of
    new bytes, never for a run with nothing new, and the alerts are those of an unpaced pass."""
    root = tmp_path / "runs"
    write_run(root / "nan", [2.0, 1.9, math.nan])
    write_run(root / "ok", healthy(12, 1))
    calls: list[int] = []
    paced = AlertEvaluator(root, pace=lambda: calls.append(1))
    unpaced = AlertEvaluator(root)
    now = datetime.now(timezone.utc)
    found = paced.evaluate(now=now)
    assert (
        [(a.run, a.condition, a.state) for a in found]
        == [(a.run, a.condition, a.state) for a in unpaced.evaluate(now=now)]
        == [("nan", "nonfinite_loss", "firing")]
    )
    assert len(calls) == 2  # one block per run
    paced.evaluate(now=now)
    assert len(calls) == 2  # both runs ended: a stat each, nothing read
    paced.close()
    unpaced.close()
