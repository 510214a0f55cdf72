"""The dashboard's alerts without a page: the lines a page shows, and the server's alerter
evaluating in its own thread within its share of a core."""

from __future__ import annotations

import math
import random
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from metrics_core.alerts.rules import AlertConfig
from metrics_core.alerts.webhooks import Alert
from metrics_core.dashboard import alerting
from metrics_core.dashboard.alerting import Pacer, ServerAlerter, alerts_notice, firing_lines, run_alert_lines
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from tests.support import append_records, base_record, read_records
from tests.support.alerts import nan_and_healthy_runs, write_losses

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def test_alert_lines_are_plain_text_newest_first_and_bounded() -> None:
    """Firing alerts read run · condition since when: message, newest first, capped with a count;
    control characters from run names are gone; cleared ones newest first; a run's own lines omit
    its name."""
    hostile = "**evil**\x1b[31m [x](http://e)"
    firing = {
        "a": [Alert("a", "stalled", "firing", "no new record", T0)],
        hostile: [Alert(hostile, "nonfinite_loss", "firing", "train loss was NaN", T0 + timedelta(minutes=1), 7)],
    }
    lines = firing_lines(firing)
    assert lines == (
        "**evil** [x](http://e) · nonfinite_loss since 2026-01-02 03:05:05 UTC: train loss was NaN",
        "a · stalled since 2026-01-02 03:04:05 UTC: no new record",
    )
    many = {f"r{i}": [Alert(f"r{i}", "failed", "firing", "x", T0 + timedelta(seconds=i))] for i in range(5)}
    assert firing_lines(many, limit=2) == (
        "r4 · failed since 2026-01-02 03:04:09 UTC: x",
        "r3 · failed since 2026-01-02 03:04:08 UTC: x",
        "… and 3 more",
    )
    recent = [Alert("a", "stalled", "cleared", "no longer holds", T0 + timedelta(seconds=s)) for s in range(3)]
    recent.insert(1, firing["a"][0])
    notice = alerts_notice(firing, recent, ready=True, cleared=2)
    assert notice.cleared == (
        "a · stalled cleared 2026-01-02 03:04:07 UTC: no longer holds",
        "a · stalled cleared 2026-01-02 03:04:06 UTC: no longer holds",
    )
    assert notice == alerts_notice(firing, recent, ready=True, cleared=2)  # equal values: no redraw
    assert run_alert_lines(firing, "a") == ("stalled since 2026-01-02 03:04:05 UTC: no new record",)
    assert run_alert_lines(firing, "other") == ()


def test_the_server_alerter_evaluates_in_its_thread_until_closed(tmp_path: Path) -> None:
    """Built, it passes over the root in its own thread (no page waits for it) and reports ready;
    close stops that thread."""
    nan_and_healthy_runs(tmp_path)
    store = RunStore(tmp_path)
    alerter = ServerAlerter(store, AlertConfig(), webhook=None, interval=0.05)
    try:
        deadline = time.monotonic() + 30
        while not alerter.ready and time.monotonic() < deadline:
            time.sleep(0.02)
        assert alerter.ready and set(alerter.firing()) == {"nan"}
        assert [(a.run, a.condition, a.state) for a in alerter.recent()] == [("nan", "nonfinite_loss", "firing")]
    finally:
        alerter.close()
        store.close()
    assert not any(thread.name == f"alerts {tmp_path}" for thread in threading.enumerate())


class Waits:
    """A stop event that records the waits asked of it and lets the clock run through them."""

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.asked = clock, []

    def wait(self, timeout: float) -> bool:
        self.asked.append(timeout)
        self.clock[0] += timeout
        return False


def test_the_server_alerter_reads_at_most_its_share_of_a_core() -> None:
    """After each block read, the alerter's thread waits until its CPU time since the last block
    is ``share`` of the wall time since: a block that took a second of CPU, and as long on the
    wall clock, is followed by three seconds' wait at a quarter of a core; a block read long after
    the last (an append, the next pass) by none."""
    cpu, wall = [0.0], [0.0]
    stop = Waits(wall)
    pacer = Pacer(stop, share=0.25, cpu=lambda: cpu[0], wall=lambda: wall[0])  # type: ignore[arg-type]
    pacer()  # the first block: nothing to pace it against
    cpu[0] += 1.0
    wall[0] += 1.0
    pacer()
    assert stop.asked == [3.0]
    cpu[0] += 0.5
    wall[0] += 1.5  # waited for the lock: wall time the pages had
    pacer()
    assert stop.asked == [3.0, 0.5]
    cpu[0] += 0.01
    wall[0] += 10.0
    pacer()
    assert stop.asked == [3.0, 0.5]


def test_the_server_takes_the_alerts_command_settings(tmp_path: Path) -> None:
    """--webhook and --alerts-config (or their environment variables) reach the settings."""
    from metrics_core.dashboard.settings import parse_settings

    config = parse_settings(["--webhook", "http://127.0.0.1:9/hook", "--alerts-config", "a.toml"], {})
    assert (config.webhook, config.alerts_config) == ("http://127.0.0.1:9/hook", Path("a.toml"))
    from_env = parse_settings([], {"METRICS_WEBHOOK": "https://x/y", "METRICS_ALERTS_CONFIG": "b.toml"})
    assert (from_env.webhook, from_env.alerts_config) == ("https://x/y", Path("b.toml"))
    assert parse_settings([], {}).webhook is None and parse_settings([], {}).alerts_config is None


def test_the_server_alerter_reads_through_the_store_and_finds_what_the_command_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over appends to a live run (spikes, NaNs, clipped and skipped fractions, thresholds on one
    event and on any, a resumed session; each session's first pass a long block, of which the
    rules are fed only what ``RunRules.memory`` says they need) and a finished run the store read
    and let go: the server's evaluator, reading through the store (``StoreFollow``), says what the
    command's (its own reading, every record) says after every pass, reads no byte itself, takes
    each record once, and keeps no reader the store let go."""
    import gc
    import random

    from metrics_core import MetricsWriter, RunContext, TrainingState
    from metrics_core.alerts.evaluator import AlertEvaluator
    from metrics_core.alerts.rules import Threshold
    from metrics_core.dashboard.alerting import StoreFollow
    from metrics_core.read.run_reader import RunReader

    root = tmp_path / "runs"
    write_losses(root / "done", [2.0, 1.9, math.nan, 1.8])
    thresholds = (Threshold("val_loss", below=1.0), Threshold("grad_norm_avg", event="train", above=5.0))
    config = AlertConfig(
        spike_min_windows=3, spike_windows=5, clear_after_windows=4, thresholds=thresholds, clipped_fraction_above=0.5
    )
    fed: list[int] = []  # records the server's rules were fed
    records_of = alerting._records
    monkeypatch.setattr(alerting, "_records", lambda *args: fed.append(len(found := records_of(*args))) or found)
    store = RunStore(root, StoreSettings(idle_s=0.0, safety_interval=0.0))  # every pass reads what was appended
    shared = AlertEvaluator(root, config, follow=lambda info: StoreFollow(store, info, config, None))
    own = AlertEvaluator(root, config)
    rng = random.Random(3)
    state = TrainingState()

    def both(now: datetime) -> None:
        found = [(a.run, a.condition, a.state, a.message) for a in shared.evaluate(now=now)]
        assert found == [(a.run, a.condition, a.state, a.message) for a in own.evaluate(now=now)]
        assert shared.firing().keys() == own.firing().keys()

    try:
        for session in ("s1", "s2"):
            with MetricsWriter(RunContext(root / "live", "live", session)) as writer:
                for round_ in range(12):
                    for _ in range(300 if round_ == 0 else rng.randint(1, 9)):
                        state.step += 1
                        loss = rng.choice([1.0 + rng.random() * 0.01] * 8 + [50.0, None])  # None: a NaN window
                        skipped = {"attempted_updates": 4, "skipped_updates_in_window": rng.randint(0, 4)}
                        fractions = rng.choice([{}, {"clipped_fraction": rng.choice([0.1, 0.9])}, skipped])
                        writer.write(
                            "train",
                            state,
                            train_loss=loss,
                            nonfinite_loss=loss is None,
                            grad_norm_avg=rng.choice([1.0, 9.0, None]),
                            **fractions,
                        )
                        if state.step % 4 == 0:
                            writer.write("validation", state, val_loss=rng.choice([0.5, 2.0]))
                    both(datetime.now(timezone.utc))
            state.step -= 5  # the next session resumes from an earlier checkpoint
        both(datetime.now(timezone.utc) + timedelta(hours=1))  # stalled or crashed: the status rules too
        assert shared.stats["bytes_read"] == 0 and own.stats["bytes_read"] > 0
        records = [r["event"] for path in root.rglob("metrics.jsonl") for r in read_records(path)]
        assert shared.stats["records"] == len(records)  # each taken once (a threshold on any event reads all)
        assert sum(fed) < len(records) - 400  # of the long blocks, the rules were fed what they need
        gc.collect()
        held = [entry.reader for entry in store._entries.values() if entry.reader is not None]
        alive = [o for o in gc.get_objects() if isinstance(o, RunReader) and root in o.path.parents]
        assert len(alive) == len(held)  # the alerter keeps no reader alive
    finally:
        shared.close()
        own.close()
        store.close()


def test_every_rule_kind_says_the_same_fed_the_rows_the_server_picks_as_fed_every_record(tmp_path: Path) -> None:
    """By construction over the rule kinds: over random runs (resumed sessions, spikes, NaN
    windows, fractions on a session's first window, no attempts, thresholds), the rules fed what
    the server's alerter feeds them of each block (the reader's columns, of a long block only
    ``needed_rows``) say after every block what the rules fed every record as the command reads
    them say; every condition a train record raises is a declared kind (``TRAIN_KINDS``, a
    threshold), and every declared kind fires: a new kind is checked as soon as it exists."""
    from metrics_core.alerts.rules import TRAIN_KINDS, RunRules, Threshold
    from metrics_core.read.run_digest import batches, follow_file
    from metrics_core.read.run_reader import RunReader

    thresholds = (Threshold("grad_norm_avg", event="train", above=5.0), Threshold("lr", below=1e-4))
    config = AlertConfig(spike_min_windows=3, spike_windows=6, clear_after_windows=5, thresholds=thresholds,
                         clipped_fraction_above=0.5, skipped_fraction_above=0.3)  # fmt: skip
    declared = {kind.name for kind in TRAIN_KINDS} | {threshold.name for threshold in thresholds}
    fired: set[str] = set()
    fed = total = 0
    for seed in range(8):
        rng = random.Random(seed)
        path = tmp_path / f"run{seed}" / "metrics.jsonl"
        records, step = [], 0
        for session in "abcdef":
            step -= rng.randint(0, 30)  # a resume from an earlier checkpoint
            for row in range(rng.randint(20, 150)):
                step += 1
                # Rare values: a long block's last ``memory`` windows often set none, so the rows
                # before them that do must be fed (a session's first window often: it sets none).
                values: dict = {}
                if rng.random() < 0.03:
                    values["grad_norm_avg"] = rng.choice([1.0, 9.0])
                if rng.random() < 0.03:
                    values["lr"] = rng.choice([3e-4, 5e-5])
                if rng.random() < (0.9 if row == 0 else 0.03):
                    skipped = {"attempted_updates": rng.choice([0, 4]), "skipped_updates_in_window": rng.randint(0, 4)}
                    values |= rng.choice([{"clipped_fraction": rng.choice([0.1, 0.9])}, skipped])
                loss = rng.choice([1.0 + rng.random() * 0.01] * 40 + [50.0, None, "keys"])
                if loss is None:
                    values["nonfinite_loss"] = True
                elif loss == "keys":
                    values |= {"train_loss": 1.0, "nonfinite_keys": rng.choice(["loss,grad_norm", "grad_norm"])}
                else:
                    values["train_loss"] = loss
                records.append(base_record(step, session=session, **values))
        append_records(path, *records)
        reader = RunReader(path.parent)
        reader.refresh()
        parsed = [record for batch in batches(follow_file(path)) for record in batch.records]
        every, server = RunRules(config), RunRules(config)
        start = 0
        while start < len(parsed):
            stop = min(len(parsed), start + rng.choice([1, 7, 40, 300]))
            every.add(parsed[start:stop])
            names = (*server.fields("train"), "time")
            columns = {name: alerting._slice(reader.column("train", name), start, stop) for name in names
                       if reader.column("train", name) is not None}  # fmt: skip
            block = alerting._records([("train", columns)], server)
            server.add(block)
            fed, total, start = fed + len(block), total + stop - start, stop
            found = every.conditions("running")
            assert server.conditions("running") == found
            fired |= {condition.name for condition in found}
    assert fired <= declared and fired == declared
    assert fed < total / 2  # of the long blocks, the rules were fed what they need


def test_the_rows_the_rules_need_are_found_without_a_copy_of_every_field() -> None:
    """``needed_rows`` over a long block of a run logging many keys the rules never read makes
    float64 copies of the few fields they read, one at a time: its allocations stay a small
    multiple of one field's, not one copy per field (what a server's first pass over a long run
    held at its peak)."""
    import tracemalloc

    import numpy as np

    from metrics_core.alerts.needed_rows import needed_rows
    from metrics_core.alerts.rules import RunRules

    rows, fields = 50_000, 40
    columns = {f"key{index}": ("float", np.ones(rows), []) for index in range(fields)}
    columns |= {"step": ("int", np.arange(rows), []), "train_loss": ("float", np.ones(rows), [])}
    columns["session_id"] = ("cat", np.zeros(rows, dtype=np.int32), ["a"])
    tracemalloc.start()
    try:
        found = needed_rows(columns, RunRules(AlertConfig()))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found is not None and found[-1] == rows - 1
    assert peak < 4 * rows * 8, peak  # a field is rows * 8 bytes; every field copied: 42 of them
