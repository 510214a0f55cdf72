"""The runs page's sweep columns and the sweep page under AppTest, on a 3 × 4 sweep written with the
project's writer: widgets found by key, controls read from and written to the URL."""

from __future__ import annotations

import math
from pathlib import Path

from metrics_core.dashboard.views.sweep import range_text
from tests.support import all_read, open_page
from tests.support.sweeps import NAMES_ORDER, SEEDS, SWEPT, sweep_run_name, write_sweep


def test_the_runs_page_shows_the_swept_keys_and_a_chosen_metrics_last_and_best(runs_root: Path) -> None:
    """By default the swept keys are columns; a metric picked adds its last and best value (best the
    least, unless chosen otherwise); switching the swept keys off leaves only the keys picked."""
    write_sweep(runs_root)
    app = all_read(open_page("runs"))
    assert {*SWEPT} <= set(app.dataframe[0].value.columns) and "model" not in app.dataframe[0].value.columns
    app.selectbox(key="runs_metric").set_value("train_loss").run()
    columns = list(app.dataframe[0].value.columns)
    assert columns[columns.index("seed") + 1 :][:1] == ["train loss best (min)"]  # its last: "train loss"
    app.button_group(key="runs_best").set_value("max").run()
    assert "train loss best (max)" in app.dataframe[0].value.columns
    app.toggle(key="swept_columns").set_value(False).run()
    assert not {*SWEPT} & set(app.dataframe[0].value.columns) and not app.exception


def test_the_sweep_page_reads_and_writes_its_url(runs_root: Path) -> None:
    """``run=``, ``metric=``, ``value=`` and ``range=`` set the page; an unknown run is named; a range on
    peak_lr lists that rate's runs; a metric picked is written back to the URL.  With no ``run=``, every
    run of the root."""
    write_sweep(runs_root)
    all_read(open_page("runs"))
    around = range_text("peak_lr", (2e-4, 5e-4))
    app = open_page("sweep", run=[*NAMES_ORDER, "ghost"], metric="val_acc", value="best", range=around)
    assert not app.exception
    assert "ghost" in app.warning[0].value
    assert app.selectbox(key="sweep_metric").value == "val_acc"
    listed = app.dataframe[0].value
    assert sorted(listed["run"]) == sorted(f"run?run={sweep_run_name(3e-4, seed)}" for seed in SEEDS)
    assert listed["val_acc best"].is_monotonic_decreasing  # best first: the greatest accuracy
    app.selectbox(key="sweep_metric").set_value("train_loss").run()
    assert app.query_params["metric"] in ("train_loss", ["train_loss"]) and app.query_params["range"] in (
        around,
        [around],
    )
    everything = open_page("sweep")
    assert not everything.exception and len(everything.dataframe[0].value) == len(NAMES_ORDER)
    value, best = everything.button_group(key="sweep_value"), everything.button_group(key="sweep_best")
    assert (value.value, best.value) == ("last", "min")  # the choices in force show selected
    assert not math.isnan(everything.dataframe[0].value.iloc[0, -1])
