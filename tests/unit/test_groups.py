"""Groups of runs on the compare page and any growing key as x, tested without a server: a sweep
written through the project's writer (3 peak learning rates × 4 seeds) read back through the store,
the figures compared with numbers computed from the files themselves."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest

from metrics_core.dashboard.figures.figure_dicts import figure_json
from metrics_core.dashboard.figures.group_figures import align, band_edges
from metrics_core.dashboard.figures.run_charts import compare_chart, run_charts
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.views.chart_specs import ChartOptions
from metrics_core.dashboard.views.compare import compare_x_keys
from metrics_core.dashboard.views.config_tables import view_config
from metrics_core.dashboard.views.groups import (
    ALL_RUNS,
    SINGLE,
    cut_first_match,
    default_group,
    group_error,
    run_groups,
    swept_keys,
)
from metrics_core.dashboard.views.memo import view_x_keys
from metrics_core.dashboard.views.x_keys import grows, x_error
from metrics_core.testing.sweep import STEPS_PER_EPOCH, sweep_name, write_sweep

SHORT = sweep_name("sweep/", 1e-3, 3)  # stops at half the steps


@pytest.fixture
def sweep(tmp_path: Path) -> Iterator[tuple[Path, RunStore, list[str]]]:
    names = write_sweep(tmp_path, short={SHORT}, extra_keys=20)
    store = RunStore(tmp_path)
    yield tmp_path, store, names
    store.close()


def file_values(root: Path, name: str, event: str, column: str) -> dict[int, float]:
    """``column`` of ``event``'s records by step, read straight from the run's file."""
    values = {}
    for line in (root / name / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["event"] == event and column in record:
            values[record["step"]] = record[column]
    return values


def views_and_configs(store: RunStore, names: list[str]) -> tuple[dict, dict]:
    views = {name: store.view(name) for name in names}
    return views, {name: view_config(view).values for name, view in views.items()}


def traces_of(figure: dict) -> dict[str, dict]:
    return {trace["name"]: trace for trace in figure["data"] if trace.get("name")}


@pytest.mark.parametrize("band", ["minmax", "std"])
def test_group_means_and_bands_equal_those_computed_from_the_files(sweep, band: str) -> None:
    """Grouped by peak_lr: one line per group, at each step the mean of the group's runs that
    reached it (the short run leaves the mean at its end without a cliff), the band's edges the
    min/max (or mean ± std) of the same values, and the run count in each legend entry."""
    root, store, names = sweep
    views, configs = views_and_configs(store, names)
    groups = run_groups(names, configs, "peak_lr")
    figure = compare_chart(views, "train_loss", x="step", smoothing=0.0, log_y=False, groups=groups, band=band)
    traces = traces_of(figure)
    assert [trace["name"] for trace in figure["data"] if trace.get("showlegend")] == [
        "peak_lr=0.0001 (4 runs)",
        "peak_lr=0.0003 (4 runs)",
        "peak_lr=0.001 (4 runs)",
    ]
    for label, runs in groups.items():
        by_step: dict[int, list[float]] = defaultdict(list)
        for name in runs:
            for step, value in file_values(root, name, "train", "train_loss").items():
                by_step[step].append(value)
        steps = sorted(by_step)
        values = [np.array(by_step[step]) for step in steps]
        mean = np.array([v.mean() for v in values])
        if band == "std":
            low, high = mean - [v.std() for v in values], mean + [v.std() for v in values]
        else:
            low, high = [v.min() for v in values], [v.max() for v in values]
        name = f"{label} (4 runs)"
        line = traces[name]
        assert list(line["x"]) == steps
        np.testing.assert_allclose(line["y"], mean, rtol=1e-6)
        np.testing.assert_allclose(traces[f"{name} low"]["y"], low, rtol=1e-6)
        np.testing.assert_allclose(traces[f"{name} high"]["y"], high, rtol=1e-6)
        assert list(line["customdata"][:, 2]) == [len(v) for v in values]
    counts = traces["peak_lr=0.001 (4 runs)"]["customdata"][:, 2]
    assert counts[0] == 4 and counts[-1] == 3  # past the short run's end, the three that went on
    validated = go.Figure(figure)  # plotly accepts every property the figure sets
    assert json.loads(validated.to_json()) == json.loads(figure_json(figure))


def test_runs_on_different_steps_are_interpolated_onto_one_grid_and_count_only_where_they_ran() -> None:
    """Two runs logged at different steps: the grid is every step either logged, each run
    interpolated within its own span only, so the mean never drops where one of them ends."""
    grid, matrix = align(
        [(np.array([0.0, 10.0, 20.0]), np.array([1.0, 2.0, 3.0])), (np.array([5.0, 15.0]), np.array([10.0, 20.0]))]
    )
    assert list(grid) == [0, 5, 10, 15, 20]
    stats = band_edges(grid, matrix, "minmax")
    assert list(stats.runs) == [1, 2, 2, 2, 1]
    np.testing.assert_allclose(stats.mean, [1.0, (1.5 + 10) / 2, (2 + 15) / 2, (2.5 + 20) / 2, 3.0])
    wide, _ = align([(np.arange(5000.0), np.ones(5000))], points=100)
    assert len(wide) == 100 and wide[0] == 0 and wide[-1] == 4999


def test_a_name_pattern_groups_runs_by_the_name_left_when_its_match_is_cut() -> None:
    """``name:-seed*`` cuts ``-seed<n>`` off the end; a leading or middle ``*`` and an unmatched name
    behave as documented; a long hostile pattern is linear work, not a backtracking search."""
    assert cut_first_match("lr3e-4-seed0", "-seed*") == "lr3e-4"
    assert cut_first_match("a/lr3e-4-seed12/x", "-seed*/") == "a/lr3e-4x"
    assert cut_first_match("run-b", "*-") == "b"
    assert cut_first_match("plain", "-seed*") is None
    assert cut_first_match("anything", "*") == ""
    assert cut_first_match("a" * 10_000, "a*" * 50 + "b") is None
    names = ["lr1-seed0", "lr1-seed1", "lr2-seed0", "other"]
    assert run_groups(names, {}, "name:-seed*") == {"lr1": names[:2], "lr2": [names[2]], "other": ["other"]}
    assert run_groups(names, {}, ALL_RUNS) == {"all runs": names}
    assert group_error("name:") is not None and group_error("name:" + "x" * 500) is not None
    assert run_groups(names, {}, SINGLE) == {name: [name] for name in names}


def test_a_hundred_runs_open_grouped_by_the_swept_key_of_fewest_values(tmp_path: Path) -> None:
    """100 runs and no grouping asked: grouped by the swept key with the fewest values (peak_lr, not
    seed), so each chart has five legend entries, not a hundred; constant keys are not swept."""
    names = write_sweep(tmp_path, peak_lrs=(1e-4, 2e-4, 3e-4, 5e-4, 1e-3), seeds=tuple(range(20)), steps=30)
    store = RunStore(tmp_path)
    try:
        views, configs = views_and_configs(store, names)
        assert swept_keys(configs) == ["peak_lr", "seed"]
        group = default_group(configs)
        figure = compare_chart(
            views, "train_loss", x="step", smoothing=0.6, log_y=False, groups=run_groups(names, configs, group)
        )
    finally:
        store.close()
    assert group == "peak_lr"
    entries = [trace["name"] for trace in figure["data"] if trace.get("showlegend")]
    assert len(entries) == 5 and all(entry.endswith("(20 runs)") for entry in entries)
    assert default_group(dict(list(configs.items())[:12])) == SINGLE
    assert default_group({str(n): {"same": "1"} for n in range(13)}) == ALL_RUNS


def test_epoch_is_offered_as_x_and_the_loss_chart_draws_against_it(sweep) -> None:
    """The sweep's epoch grows: it is the one logged key offered as x (random keys are not), and
    x=epoch draws each train point at its record's epoch and each validation point at the epoch
    of the train records around it."""
    root, store, names = sweep
    view = store.view(names[0])
    assert view_x_keys(view) == ("epoch",)
    assert compare_x_keys({name: store.view(name) for name in names[:3]}) == ["epoch"]
    loss = run_charts(view, ChartOptions(x="epoch"))["loss"]
    traces = {trace["name"]: trace for trace in loss["data"] if trace.get("x") is not None and len(trace["x"]) > 1}
    epochs = {step: value for step, value in file_values(root, names[0], "train", "epoch").items()}
    assert list(traces["train · S1"]["x"]) == [epochs[step] for step in sorted(epochs)]
    val_steps = sorted(file_values(root, names[0], "validation", "val_loss"))
    assert list(traces["validation · S1"]["x"]) == [step // STEPS_PER_EPOCH for step in val_steps]
    assert loss["layout"]["xaxis"]["title"]["text"] == "epoch"
    grouped = compare_chart(
        {n: store.view(n) for n in names}, "val_loss", x="epoch", smoothing=0.0, log_y=False, groups={"all": names}
    )
    assert list(traces_of(grouped)["all (12 runs)"]["x"]) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_key_grows_only_if_it_never_goes_down_within_a_session() -> None:
    """An epoch that starts over in a resumed session grows; a loss, a constant and a key that goes
    down within one session do not; missing values are skipped; a refused x is said."""
    sessions = np.array([0, 0, 0, 1, 1, 1])
    assert grows(np.array([0.0, 1.0, 2.0, 0.0, 1.0, 1.0]), sessions)
    assert grows(np.array([0.0, np.nan, 2.0, 2.0, np.nan, 3.0]), sessions)
    assert not grows(np.array([3.0, 2.0, 2.5, 2.0, 1.9, 1.8]), sessions)
    assert not grows(np.array([1.0] * 6), sessions)
    assert not grows(np.array([0.0, 2.0, 1.0, 3.0, 4.0, 5.0]), sessions)
    assert x_error("epoch", ["epoch"]) is None and x_error("tokens_seen", []) is None
    assert "not a number that grows" in x_error("train_loss", ["epoch"])
