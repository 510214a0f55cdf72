"""Views in their URL under AppTest: the runs page's and the run page's controls (found by key) are
seeded from the URL and written back to it, and what a URL asks is bounded and shown as text."""

from __future__ import annotations

import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

from metrics_core.dashboard.controls.url_state import URL_MAX_VALUES
from metrics_core.dashboard.views.chart_filter import FILTER_MAX_CHARS
from tests.support import all_read, open_page, small_run
from tests.support.sweeps import write_sweep


def param(app: AppTest, name: str) -> list[str]:
    """Every value of ``?name=`` in the app's URL now."""
    value = app.query_params.get(name, [])
    return [value] if isinstance(value, str) else list(value)


def test_a_runs_page_url_reopens_its_view_and_each_control_writes_it(runs_root: Path) -> None:
    """filter, config, column, swept, metric and best set the runs page's controls and table; a
    control changed is written back; one set back to its default leaves the URL."""
    write_sweep(runs_root)
    all_read(open_page("runs"))
    query = {"filter": "lr0.001", "config": "seed!=0", "column": ["model", "warmup"], "swept": "0"}
    app = open_page("runs", **query, metric="val_acc", best="min")
    assert not app.exception and not app.warning
    assert app.text_input(key="run_filter").value == "lr0.001"
    assert app.text_input(key="config_filter").value == "seed!=0"
    assert app.multiselect(key="config_columns").value == ["model", "warmup"]
    assert app.toggle(key="swept_columns").value is False
    assert app.selectbox(key="runs_metric").value == "val_acc"
    assert app.button_group(key="runs_best").value == "min"
    table = app.dataframe[0].value
    assert len(table) == 3 and {"model", "warmup", "val_acc best (min)"} <= set(table.columns)
    assert "seed" not in table.columns  # the swept keys are off
    app.text_input(key="run_filter").input("s1").run()
    app.button_group(key="runs_best").set_value("max").run()
    app.toggle(key="swept_columns").set_value(True).run()
    app.multiselect(key="config_columns").set_value(["warmup"]).run()
    app.selectbox(key="runs_metric").set_value("train_loss").run()
    assert (param(app, "filter"), param(app, "best"), param(app, "column")) == (["s1"], ["max"], ["warmup"])
    assert (param(app, "metric"), param(app, "swept"), param(app, "config")) == (["train_loss"], [], ["seed!=0"])
    app.text_input(key="config_filter").input("").run()
    assert "config" not in app.query_params and len(app.dataframe[0].value) == 3


def test_a_run_page_url_reopens_its_chart_filter(runs_root: Path) -> None:
    """``charts=`` sets the run page's chart filter; typing one writes it to the URL."""
    small_run(runs_root / "alpha" / "metrics.jsonl")
    app = open_page("run", run="alpha", charts="loss")
    assert not app.exception
    assert app.text_input(key="filter_charts").value == "loss"
    app.text_input(key="filter_charts").input("grad").run()
    assert param(app, "charts") == ["grad"] and param(app, "run") == ["alpha"]
    app.text_input(key="filter_charts").input("").run()
    assert "charts" not in app.query_params


def test_what_a_url_asks_is_bounded_and_shown_as_text(runs_root: Path) -> None:
    """Too long a filter, too many columns and an unknown best are said and ignored; markup in a
    metric's name is a name, never markup."""
    write_sweep(runs_root, windows=4)
    all_read(open_page("runs"))
    columns = [f"k{number}" for number in range(URL_MAX_VALUES + 500)]
    app = open_page("runs", filter="a" * (FILTER_MAX_CHARS + 1), column=columns, best="**max**", metric="[x](http://e)")
    assert not app.exception
    assert app.text_input(key="run_filter").value == ""
    assert app.multiselect(key="config_columns").value == columns[:URL_MAX_VALUES]
    assert app.button_group(key="runs_best").value == "min" and "best" not in app.query_params  # by its name
    warnings = " ".join(warning.value for warning in app.warning)  # markdown, every mark escaped
    read_as = re.sub(r"\\(.)", r"\1", warnings)
    assert r"\*\*max\*\*" in warnings and "filter= is longer" in read_as and "500 column=" in read_as
    assert app.selectbox(key="runs_metric").value == "[x](http://e)"
    assert len(app.dataframe[0].value) == 12


def test_the_runs_order_is_in_the_url_and_sorts_every_listed_run(runs_root: Path) -> None:
    """sort=best with a metric lists the runs best first (the least loss, across the pages'
    order, not one page's); picking "run name" writes sort=name; without a metric, the order
    by a metric falls back to newest activity."""
    write_sweep(runs_root, windows=4)
    all_read(open_page("runs"))
    app = open_page("runs", metric="train_loss", sort="best")
    assert not app.exception and app.selectbox(key="runs_sort").value == "best"
    best = [float(value) for value in app.dataframe[0].value["train loss best (min)"]]
    assert best == sorted(best) and len(best) == 12
    app.selectbox(key="runs_sort").set_value("name").run()
    names = list(app.dataframe[0].value["run"])
    assert names == sorted(names) and param(app, "sort") == ["name"]
    plain = open_page("runs", sort="best")
    assert plain.selectbox(key="runs_sort").value == "activity" and "sort" not in plain.query_params


def test_smoothing_log_y_and_alignment_are_in_the_url_of_the_run_and_sessions_pages(runs_root: Path) -> None:
    """``smoothing=`` and ``log=`` set the run page's slider and toggle, ``align=`` and
    ``smoothing=`` the sessions page's; a change is written back, a smoothing no slider offers is
    said and ignored."""
    small_run(runs_root / "alpha" / "metrics.jsonl")
    app = open_page("run", run="alpha", smoothing="0.85", log="1")
    assert not app.exception and not app.warning
    assert (app.slider(key="smoothing").value, app.toggle(key="log_y").value) == (0.85, True)
    app.toggle(key="log_y").set_value(False).run()
    assert "log" not in app.query_params and param(app, "smoothing") == ["0.85"]
    app.slider(key="smoothing").set_value(0.6).run()
    assert "smoothing" not in app.query_params  # the default
    app = open_page("sessions", run="alpha", align="tokens_seen", smoothing="0.3")
    assert not app.exception
    assert (app.button_group(key="align").value, app.slider(key="smoothing").value) == ("tokens_seen", 0.3)
    app.slider(key="smoothing").set_value(0.0).run()
    assert "smoothing" not in app.query_params and param(app, "align") == ["tokens_seen"]
    refused = open_page("run", run="alpha", smoothing="0.123")
    assert refused.slider(key="smoothing").value == 0.6 and "must be a multiple of" in refused.warning[0].value
