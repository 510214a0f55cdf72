"""Sweeps: a 3 × 4 sweep written with the project's own writer, read through the store as the runs
table and the sweep page read it: the swept keys are exactly the varying ones, each run's last and
best value of a metric equal the ones computed from its file, the sweep page's charts hold the swept
keys and not the constant ones, and a range chosen on one key keeps the runs inside it."""

from __future__ import annotations

import math
import re
from contextlib import nullcontext
from pathlib import Path

import orjson
import pytest

from metrics_core.dashboard.figures.sweep_figures import chart_key, sweep_chart
from metrics_core.dashboard.store.rows import MetricTails
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.config_tables import runs_table, swept_keys
from metrics_core.dashboard.views.runs_table import readable_runs
from metrics_core.dashboard.views.sweep import (
    MAX_AXES,
    best_is_max,
    chosen_ranges,
    metric_keys,
    parse_range,
    range_text,
    sweep_inputs,
    sweep_of,
    sweep_query,
    sweep_table,
    with_metric_columns,
)
from metrics_core.read.run_reader import RunReader
from metrics_core.write.training_session import training_session
from metrics_core.write.writer import TrainingState
from tests.support.sweeps import PEAK_LRS, SEEDS, SWEPT, sweep_run_name, write_sweep


@pytest.fixture(scope="module")
def sweep_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    write_sweep(root)
    return root


@pytest.fixture(scope="module")
def table(sweep_root: Path):
    store = RunStore(sweep_root, StoreSettings(loader_delay_s=0.0, load_budget_s=60.0))
    try:
        yield store.runs_table().set_index("run")
    finally:
        store.close()


def file_values(path: Path, event: str, key: str) -> list[float]:
    """Every finite ``key`` of the ``event`` records of a run file, in file order (one session: none superseded)."""
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return [r[key] for r in records if r["event"] == event and isinstance(r.get(key), (int, float))]


def test_the_swept_keys_are_exactly_the_keys_that_vary(table) -> None:
    """Of the 12 runs' configs, the swept keys are peak_lr, seed and init, none of the shared ones; the
    runs table shows them as columns by default, next to the run, and still the keys picked by hand."""
    assert swept_keys(table["config"]) == SWEPT
    shown, error = runs_table(table.reset_index(), keys=["warmup"], config_filter="", swept=True)
    columns = readable_runs(shown).columns.tolist()
    assert error is None and columns[:6] == ["run", "status", *SWEPT, "warmup"]
    assert not {"model", "optim.name", "optim.betas"} & set(columns)


def test_the_swept_keys_follow_the_config_filter(table) -> None:
    """Filtered to one learning rate, peak_lr no longer varies: the columns are seed and init."""
    shown, error = runs_table(table.reset_index(), keys=[], config_filter="peak_lr=3e-4", swept=True)
    assert error is None and len(shown) == len(SEEDS)
    assert [column for column in SWEPT if column in shown.columns] == ["init", "seed"]


def test_last_and_best_equal_the_values_in_the_files(sweep_root: Path, table) -> None:
    """Each run's last and best train loss (best: the least) and validation accuracy (best: the
    greatest, by the rule) in the runs table equal those computed from its metrics.jsonl."""
    for lr in PEAK_LRS:
        for seed in SEEDS:
            name = sweep_run_name(lr, seed)
            path = sweep_root / name / "metrics.jsonl"
            losses, accuracy = file_values(path, "train", "train_loss"), file_values(path, "validation", "val_acc")
            row = with_metric_columns(table.reset_index(), dict(table["metrics"]), "train_loss", best_max=False)
            row = row.set_index("run").loc[name]
            assert (row["train loss"], row["train loss best (min)"]) == (losses[-1], min(losses))
            tails = table.at[name, "metrics"]
            sweep = sweep_of({name: table.at[name, "config"]}, {name: tails}, metric="val_acc", value="best")
            assert sweep.best_max and sweep.values == (max(accuracy),)
            assert tails["val_acc"] == (accuracy[-1], min(accuracy), max(accuracy))
    assert best_is_max("val_acc") and not best_is_max("train_loss") and not best_is_max("val_loss")
    assert metric_keys(table["metrics"])[:2] == ["train_loss", "val_loss"]


def test_the_sweep_charts_hold_the_swept_keys_and_not_the_constant_ones(table) -> None:
    """A chart per swept key, its x-axis the key: peak_lr on a log axis, init categorical with its
    values as tick labels; no chart of a shared key; every run a point on every chart."""
    configs, tails = dict(table["config"]), dict(table["metrics"])
    sweep = sweep_of(configs, tails, metric="train_loss", value="last")
    figures = {axis.key: sweep_chart(sweep, axis, sweep.chosen({})) for axis in sweep.axes}
    assert [figure["layout"]["xaxis"]["title"]["text"] for figure in figures.values()] == SWEPT
    assert figures["peak_lr"]["layout"]["xaxis"]["type"] == "log"
    assert figures["init"]["layout"]["xaxis"]["ticktext"] == ["normal", "xavier"]
    assert figures["seed"]["layout"]["xaxis"]["type"] == "linear"
    for figure in figures.values():
        chosen, others = figure["data"]
        assert len(chosen["x"]) == len(PEAK_LRS) * len(SEEDS) and others["x"] == []
    assert sorted(set(figures["peak_lr"]["data"][0]["x"])) == list(PEAK_LRS)
    assert len({chart_key(axis) for axis in sweep.axes}) == len(SWEPT)


def test_a_range_on_one_key_keeps_the_runs_inside_it(table) -> None:
    """A zoom on peak_lr's log axis to around 3e-4 keeps that learning rate's 4 runs: listed, drawn in
    colour on every chart, the others faded; the range survives the URL exactly."""
    configs, tails = dict(table["config"]), dict(table["metrics"])
    sweep = sweep_of(configs, tails, metric="train_loss", value="best")
    peak_lr = next(axis for axis in sweep.axes if axis.key == "peak_lr")
    low, high = peak_lr.data_range([math.log10(5e-4), math.log10(2e-4)])  # a log axis reports log10, any order
    chosen = sweep.chosen({"peak_lr": (low, high)})
    listed = sweep_table(sweep, configs, chosen)
    assert sorted(listed["run"]) == sorted(sweep_run_name(3e-4, seed) for seed in SEEDS)
    assert listed["train_loss best"].is_monotonic_increasing  # best first: the least loss
    seed_chart = sweep_chart(sweep, next(axis for axis in sweep.axes if axis.key == "seed"), chosen)
    assert [len(trace["x"]) for trace in seed_chart["data"]] == [4, 8]
    init = next(axis for axis in sweep.axes if axis.key == "init")
    assert sum(sweep.chosen({"init": (0.5, 1.5)})) == 6  # categorical: positions, "xavier" is 1
    assert parse_range(range_text("a:b", (low, high))) == ("a:b", (low, high))
    assert parse_range("peak_lr:x:1") is None and init.labels == ("normal", "xavier")


def test_metric_tails_extended_by_appends_equal_a_fresh_read(tmp_path: Path) -> None:
    """A run appended to, then resumed from an earlier step (its redone rows superseded): the tails
    kept from read to read equal those of a fresh ``MetricTails``, and leave the redone rows out."""
    run, state = tmp_path / "run", TrainingState()
    kept = MetricTails()
    with training_session(run, state=state, system_metrics=False) as session:
        reader = RunReader(run)
        for loss in (5.0, 1.0, 4.0, 3.0):
            session.window.add(loss, 10, 0.5, False, 1.0)
            session.log_window(lr=0.1, val_acc=loss / 10)
            reader.refresh()
            assert kept.update(reader, len(reader.sessions)) == MetricTails().update(reader, len(reader.sessions))
    resumed = TrainingState(step=1, tokens_seen=10)
    with training_session(run, state=resumed, resumed_from_step=1, system_metrics=False) as session:
        for loss in (2.0, 2.5):
            session.window.add(loss, 10, 0.5, False, 1.0)
            session.log_window(lr=0.1)
            reader.refresh()
            assert kept.update(reader, len(reader.sessions)) == MetricTails().update(reader, len(reader.sessions))
    tails = kept.update(reader, len(reader.sessions))
    assert tails["train_loss"] == (2.5, 2.0, 5.0)  # 1.0, 4.0, 3.0 were redone from step 1
    assert tails["val_acc"] == (0.5, 0.5, 0.5)
    reader.close()


def test_shared_keys_are_no_sweep() -> None:
    """Runs sharing every key, or a single run, sweep nothing; a run without a config is left out."""
    shared = {"model": "gpt2-small", "optim.betas": "[0.9,0.95]"}
    assert swept_keys([shared | {"a": "1"}, shared | {"a": "1"}, None, {}]) == []
    assert swept_keys([{"a": "1"}]) == []
    assert swept_keys([{"a": "1"}, {"a": "1", "b": "2"}]) == ["b"]  # present in one run only: it differs


def test_a_sweep_of_thousands_of_differing_keys_charts_a_bounded_number() -> None:
    """Two runs whose configs differ in 2,000 keys: ``MAX_AXES`` charts, the rest counted, not drawn."""
    configs = {run: {f"k{i:04d}": f"{run}{i}" for i in range(2000)} for run in ("a", "b")}
    sweep = sweep_of(configs, {}, metric="train_loss")
    assert len(sweep.axes) == MAX_AXES and sweep.uncharted == 2000 - MAX_AXES
    assert sweep.values == (None, None) and all(axis.categorical for axis in sweep.axes)


def test_the_sweep_pages_inputs_ranges_and_url(table) -> None:
    """The page's inputs from the runs table (asked runs only, unknown ones dropped; a row not read yet
    has None, so two reads compare equal); a zoom in this session wins over the URL's range, a zoom
    back out clears it; the URL holds every control."""
    rows = table.reset_index()
    asked = [sweep_run_name(1e-4, 0), "ghost", sweep_run_name(1e-3, 3)]
    configs, tails = sweep_inputs(rows, asked)
    assert list(configs) == [asked[0], asked[2]] and (configs, tails) == sweep_inputs(rows, asked)
    loading = rows.assign(config=[float("nan")] * len(rows))
    assert set(sweep_inputs(loading, [])[0].values()) == {None} and sweep_inputs(loading, []) == sweep_inputs(
        loading, []
    )
    sweep = sweep_of(dict(table["config"]), dict(table["metrics"]), metric="train_loss", value="best")
    key = lambda axis: axis.key  # noqa: E731
    url = {"seed": (1.0, 2.0), "init": (0.0, 0.0)}
    assert chosen_ranges(sweep, {"init": None}, url, key) == {"seed": (1.0, 2.0)}
    assert chosen_ranges(sweep, {"seed": [0.0, 1.0]}, url, key) == {"seed": (0.0, 1.0), "init": (0.0, 0.0)}
    query = sweep_query(asked, sweep, {"seed": (1.0, 2.0)})
    assert query == {
        "run": asked,
        "metric": ["train_loss"],
        "value": ["best"],
        "best": ["min"],
        "range": ["seed:1.0:2.0"],
    }
    assert "run" not in sweep_query([], sweep, {})


def test_the_runs_table_says_missing_as_a_dash_and_a_metric_as_the_losses_read(table) -> None:
    """A config key a run lacks reads "—", never None or nan; a metric's last and best read with the
    four digits of the loss columns beside them, and a loss the table shows is named as it is there,
    its last value not repeated."""
    shown, _ = runs_table(table.reset_index(), keys=["absent", "seed"], config_filter="", swept=False)
    accuracy = readable_runs(with_metric_columns(shown, dict(table["metrics"]), "val_acc", best_max=True))
    loss = readable_runs(with_metric_columns(shown, dict(table["metrics"]), "val_loss", best_max=False))
    for readable in (accuracy, loss):
        cells = readable.drop(columns="loss trend", errors="ignore")
        assert not cells.isna().any().any() and not cells.isin(["None", "nan", "NaN", "<NA>"]).any().any()
    assert set(accuracy["absent"]) == {"—"}
    assert all(re.fullmatch(r"0\.\d{1,4}", value) for value in accuracy["val_acc last"])  # as "val loss" reads
    assert "val loss best (min)" in loss.columns and not [c for c in loss.columns if c.startswith("val_loss")]


def test_the_runs_table_has_an_error_column_only_when_a_listed_run_has_an_error(tmp_path: Path) -> None:
    """Finished runs listed: no error column (an empty one pushed the demo's runs table past a
    1,400 px window); a run that failed among them: the column, with its exception."""
    for name in ("done-a", "done-b", "failed"):
        with pytest.raises(ValueError) if name == "failed" else nullcontext():
            with training_session(tmp_path / name, state=TrainingState(), system_metrics=False) as session:
                session.window.add(1.0, 10, 0.5, False, 1.0)
                session.log_window(lr=0.1)
                if name == "failed":
                    raise ValueError("boom at step 0")
    store = RunStore(tmp_path, StoreSettings(loader_delay_s=0.0, load_budget_s=60.0))
    try:
        table = store.runs_table()
    finally:
        store.close()
    assert "error" not in readable_runs(table[table["run"] != "failed"]).columns
    shown = readable_runs(table).set_index("run")
    assert shown.loc["failed", "error"] == "ValueError: boom at step 0" and shown.loc["done-a", "error"] == ""
