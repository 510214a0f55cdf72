"""The compare and run pages' grouping and x-axis controls, run in-process by ``AppTest``: every
control read from the URL, written back to it, and a refused value said on the page."""

from __future__ import annotations

from pathlib import Path

from metrics_core.testing.sweep import sweep_name, write_sweep
from tests.support import open_page


def param(app: object, name: str) -> str | None:
    """``?name=`` of the page's URL as the script left it (AppTest keeps a list or a string)."""
    value = app.query_params.get(name)
    return value[-1] if isinstance(value, list) else value


def test_compare_reads_group_band_and_x_from_the_url_and_writes_them_back(runs_root: Path) -> None:
    """/compare?run=…&group=peak_lr&band=std&x=epoch opens with those controls set, the keys the
    runs differ in offered as groups (not a key they share); a run-name
    pattern picked in the sidebar lands in the URL as group=name:<pattern>; single runs as none."""
    names = write_sweep(runs_root, seeds=(0, 1), steps=100)
    app = open_page("compare", run=names, group="peak_lr", band="std", x="epoch")
    assert not app.exception and not app.warning
    assert app.selectbox(key="compare_group").value == "peak_lr"
    offered = app.selectbox(key="compare_group").options  # warmup, the same for every run, is no group
    assert offered[0] == "single runs" and sorted(offered[1:-1]) == ["peak_lr", "seed"]
    assert app.radio(key="compare_band").value == "std"
    assert app.selectbox(key="compare_x").value == "epoch"
    assert param(app, "group") == "peak_lr" and param(app, "band") == "std" and param(app, "x") == "epoch"
    app.selectbox(key="compare_group").select("(run-name pattern)").run()
    app.text_input(key="compare_group_pattern").input("-seed*").run()
    assert not app.exception and param(app, "group") == "name:-seed*"
    app.selectbox(key="compare_group").select("none").run()
    assert param(app, "group") is None and param(app, "band") is None  # both their defaults for 4 runs


def test_a_key_that_does_not_grow_is_refused_as_x_with_a_message(runs_root: Path) -> None:
    """/run?x=train_loss: refused by name on the page, the charts drawn against the step; the keys
    that grow are offered, and picking one writes x=<key> to the URL."""
    write_sweep(runs_root, peak_lrs=(3e-4,), seeds=(0,), steps=100)
    name = sweep_name("sweep/", 3e-4, 0)
    app = open_page("run", run=name, x="train_loss")
    assert not app.exception
    assert any("is not a number that grows" in warning.value for warning in app.warning)
    assert app.selectbox(key="x_axis").value == "step" and param(app, "x") is None
    assert app.selectbox(key="x_axis").options[-1] == "epoch"
    app.selectbox(key="x_axis").select("epoch").run()
    assert not app.exception and param(app, "x") == "epoch"
    compare = open_page("compare", run=[name], group="no.such.key")
    assert "not a config key" in compare.warning[0].value
