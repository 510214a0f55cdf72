"""Alerts without a receiver: the rules against a from-scratch oracle on runs written by the real
writer, and a pass that reads nothing new costing nothing (posting is in
tests/integration/test_alerts_posting.py)."""

from __future__ import annotations

import math
import os
import random
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.alerts.evaluator import AlertEvaluator
from metrics_core.alerts.rules import AlertConfig, RunRules, Threshold, load_config
from metrics_core.alerts.webhooks import Alert, Delivery, webhook_body
from metrics_core.errors import AlertConfigError
from tests.support.alerts import healthy, training_window_with, write_run


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


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://hooks.slack.com/services/T0/B0/sec ret", "a space or a control character"),
        ("https://hooks.slack.com/services/T0/B0/sec\tret", "a space or a control character"),
        ("https://hooks.slack.com/services/T0/B0/secret\n", "a space or a control character"),
        ("https://hooks.slack.com:99999/services/T0/B0/secret", "its port is not a number"),
        ("https://[::1/services/T0/B0/secret", "expected an http:// or https:// URL"),
    ],
)
def test_a_webhook_url_the_client_would_refuse_is_refused_once_without_its_secret(url: str, why: str) -> None:
    """A URL that http.client would refuse (whose error quotes the path) is refused when the delivery
    is made, by scheme and host only: nothing is queued or retried, and the secret is never said."""
    reports: list[str] = []
    with pytest.raises(AlertConfigError) as refused:
        Delivery(url, root="/r", report=reports.append)
    assert why in str(refused.value) and "secret" not in str(refused.value) and "sec" not in str(refused.value)
    assert reports == []
    if "[" not in url:
        assert "'https://hooks.slack.com" in str(refused.value)


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


SECRET_HOOK = "https://hooks.slack.com/services/T0/B0/SECRETPATH"


def alerts_command(*argv: str) -> tuple[int, str]:
    """``python -m metrics_core alerts`` run in this process: its status and stderr."""
    import io

    from metrics_core.cli.main import main

    err = io.StringIO()
    return main(["alerts", *argv], io.StringIO(), err), err.getvalue()


def test_the_alerts_command_takes_its_webhook_and_config_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no --webhook, $METRICS_WEBHOOK is the webhook (a bad one is refused as the flag's would
    be); with no --config, $METRICS_ALERTS_CONFIG is the config."""
    (tmp_path / "runs").mkdir()
    monkeypatch.setenv("METRICS_WEBHOOK", "ftp://host/secret")
    status, said = alerts_command(str(tmp_path / "runs"), "--once")
    assert status == 2 and "webhook 'ftp://host/…': expected an http:// or https:// URL" in said
    monkeypatch.delenv("METRICS_WEBHOOK")
    (tmp_path / "alerts.toml").write_text("spike_z = -1\n")
    monkeypatch.setenv("METRICS_ALERTS_CONFIG", str(tmp_path / "alerts.toml"))
    status, said = alerts_command(str(tmp_path / "runs"), "--once")
    assert status == 2 and "alerts.toml: spike_z is -1: expected" in said


def test_a_webhook_with_a_path_on_the_command_line_is_warned_of_without_its_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`alerts --webhook <Slack URL>` works and warns once that every user reads the command line,
    naming the receiver by scheme and host; from the environment, or without a path, no warning.
    The dashboard's --webhook gets the same warning."""
    from metrics_core.dashboard.settings import parse_settings

    (tmp_path / "runs").mkdir()
    status, said = alerts_command(str(tmp_path / "runs"), "--webhook", SECRET_HOOK, "--once")
    assert status == 0 and said.count("\n") == 1 and "SECRETPATH" not in said
    assert (
        said.startswith("warning: the webhook https://hooks.slack.com/… is on the command line")
        and "$METRICS_WEBHOOK" in said
    )
    assert alerts_command(str(tmp_path / "runs"), "--webhook", "http://127.0.0.1:9", "--once") == (0, "")
    monkeypatch.setenv("METRICS_WEBHOOK", SECRET_HOOK)
    assert alerts_command(str(tmp_path / "runs"), "--once") == (0, "")
    assert parse_settings([], {"METRICS_WEBHOOK": SECRET_HOOK}).webhook_warning is None
    served = parse_settings(["--webhook", SECRET_HOOK], {})
    assert served.webhook == SECRET_HOOK and "SECRETPATH" not in served.webhook_warning
