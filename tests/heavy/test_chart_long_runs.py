"""The live chart's transport on runs of 30k and 300k records: every append is an extension."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from metrics_core.dashboard.figures.chart_memo import view_charts
from metrics_core.dashboard.live.chart_component import (
    encode,
    next_payload,
)
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.chart_specs import (
    ChartOptions,
)
from metrics_core.testing.generate import record, train_values, write_run


class LiveRun:
    """A generated run of ``records`` records (three sessions) that one more train record at a time is
    appended to, in its last session, and the payloads that append sends the run page."""

    def __init__(self, root: Path, records: int) -> None:
        self.path = root / "live" / "metrics.jsonl"
        write_run(self.path, records)
        self.store = RunStore(root, StoreSettings(safety_interval=0.0))
        self.options = ChartOptions(smoothing=0.6)
        self.sent = {key: next_payload(None, encode(figure), resync=False)
                     for key, figure in view_charts(self.store.view("live"), self.options).items()}  # fmt: skip
        last = self.store.view("live").frames["train"].iloc[-1]
        self.session, self.step = str(last["session_id"]), int(last["step"])
        self.t_ns = pd.Timestamp(last["time"]).value
        self.rng = random.Random(1)

    def append(self) -> None:
        """Append one record; build the page's charts and their payloads for it."""
        self.step += 10
        self.t_ns += 2 * 10**9
        with open(self.path, "ab") as out:
            out.write(record(self.session, "train", self.step, self.step * 419_430, 0, self.t_ns,
                             **train_values(self.step, self.rng)))  # fmt: skip
        view = self.store.view("live")
        for key, figure in view_charts(view, self.options).items():
            self.sent[key] = next_payload(self.sent[key], encode(figure), resync=False)


def test_every_live_update_of_a_long_run_is_an_extension(tmp_path: Path) -> None:
    """Twelve appends to a 30k- and a 300k-record run: every chart's payload extends what the page holds
    (or is the same), never a full figure, and a legend entry keeps its one null point (an
    extension grows lines, not the legend).  What an append costs is measured in benchmarks/."""
    small, big = LiveRun(tmp_path / "small", 30_000), LiveRun(tmp_path / "big", 300_000)
    try:
        for _ in range(12):
            for run in (small, big):
                run.append()
        for run in (small, big):
            assert {sent.payload["op"] for sent in run.sent.values()} <= {"extend", "same"}
            figures = view_charts(run.store.view("live"), run.options).values()
            entries = [
                list(t["x"]) for f in figures for t in f["data"] if t.get("showlegend") and t.get("hoverinfo") == "skip"
            ]
            assert entries and all(x == [None] for x in entries), entries
    finally:
        small.store.close()
        big.store.close()
