"""A snapshot's way to a tab, followed call by call: ``live.feed.feed_answer`` for a tab that holds
the previous snapshot's figures of a live run written by the real writer, after one append.

The tool: every call into a ``metrics_core`` function is seen (``sys.setprofile``); a call from
another module's frame (the nearest ``metrics_core`` frame below it) *enters* its module.  The way
is the modules in the order they are entered; a module entered again was left and came back to.
What the flow must be: each module of the spine (the feed, the views' memo, the figures' memo)
entered once, the snapshot only read, values handed back up the call stack, and no call from a
module into a layer above its own: a memo that keeps values, never one that calls its caller's
function.  The drawing of each chart (``PER_CHART``) is left out of the counts: its modules are
entered once per chart.
"""

from __future__ import annotations

import gc
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from metrics_core import MetricsWriter, RunContext, TrainingState, TrainingWindow
from metrics_core.dashboard.figures.figure_dicts import figure_json
from metrics_core.dashboard.figures.run_charts import chart_builders, run_charts
from metrics_core.dashboard.live.chart_component import encode
from metrics_core.dashboard.live.feed import drawn_charts, feed_answer, page_signature
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.chart_specs import ChartOptions
from tests.support import append_records, base_record, distributed_run, three_session_run
from tests.support.layers import dashboard_layer

PACKAGE = "metrics_core."


@dataclass
class Way:
    """What following one call saw: ``entered``, each module as it was entered, in order (names
    without the ``metrics_core.`` prefix), and ``functions``, the function each entry called;
    ``upward``, each call (caller, callee, function) into a layer above the caller's own (any
    module outside the dashboard sits below all of it)."""

    entered: list[str] = field(default_factory=list)
    functions: list[tuple[str, str]] = field(default_factory=list)  # (module, function) of each entry
    upward: list[tuple[str, str, str]] = field(default_factory=list)

    def count(self, *, leaving_out: frozenset[str] = frozenset()) -> Counter[str]:
        """How often each module was entered, but those of ``leaving_out``."""
        return Counter(module for module in self.entered if module not in leaving_out)

    def returns(self, *, leaving_out: frozenset[str] = frozenset()) -> int:
        """Entries into a module already entered before, but those of ``leaving_out``: the way's bounces."""
        counts = self.count(leaving_out=leaving_out)
        return sum(counts.values()) - len(counts)


def _rank(module: str) -> int:
    return dashboard_layer(module) if module.startswith("metrics_core.dashboard.") else -1


def _caller(frame: FrameType | None) -> str | None:
    """The module of the nearest ``metrics_core`` frame, from ``frame`` down the stack."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(PACKAGE):
            return name
        frame = frame.f_back
    return None


def follow(call: Callable[[], Any]) -> tuple[Any, Way]:
    """``call()``'s result and the way it took through the package's modules."""
    way = Way()

    def seen(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(PACKAGE):
            return
        caller = _caller(frame.f_back)
        if caller == name:
            return
        way.entered.append(name.removeprefix(PACKAGE))
        way.functions.append((name.removeprefix(PACKAGE), frame.f_code.co_name))
        if caller is not None and _rank(caller) < _rank(name):
            way.upward.append((caller, name, frame.f_code.co_name))

    # What earlier tests left for the collector (a file's finaliser) would run inside the call and
    # be counted as its way: collected before, the collector off while followed.
    gc.collect()
    gc.disable()
    sys.setprofile(seen)
    try:
        result = call()
    finally:
        sys.setprofile(None)
        gc.enable()
    return result, way


def _train(writer: MetricsWriter, state: TrainingState, windows: int) -> None:
    """``windows`` log windows of ten updates each, with a key the user logs (``mfu``)."""
    window = TrainingWindow()
    for _ in range(windows):
        for _ in range(10):
            window.add(2.0 / (1 + state.step / 100), 800, 0.9, False, 1.0)
            state.tokens_seen += 800
            state.step += 1
        writer.write("train", state, **window.summary(1e-3), mfu=0.4)
        window.reset()


def live_answer(tmp_path: Path, options: ChartOptions) -> tuple[dict[str, Any], Way]:
    """A live run of 20 windows and a validation, drawn by a tab; one window appended; the answer
    that brings the tab to the new snapshot, followed."""
    state = TrainingState()
    with MetricsWriter(RunContext(tmp_path / "r", "r", "s1")) as writer:
        writer.write("session_start", state, discarded_bytes=0, resumed_from_step=None)
        _train(writer, state, 20)
        writer.write("validation", state, val_loss=1.5)
        store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
        try:
            drawn = store.view("r")
            layout = page_signature(drawn, options, ()).layout
            held = {key: encode(figure).token for key, figure in drawn_charts(drawn, options).items()}
            _train(writer, state, 1)
            view = store.view("r")
            assert view is not drawn and view.records == drawn.records + 1
            return follow(lambda: feed_answer(view, options, (), layout, held))
        finally:
            store.close()


# Entered once per chart drawn (seven here), by the figure builders: the drawing of one chart,
# its layout, axes, traces and text, and the min/max downsampling of its points.  A chart's way
# through them is its own; the way between the layers is the spine's.
PER_CHART = frozenset(
    {
        "dashboard.figures.run_charts",
        "dashboard.figures.metric_figures",
        "dashboard.figures.series_traces",
        "dashboard.figures.layout",
        "dashboard.figures.metric_axes",
        "dashboard.figures.figure_dicts",
        "dashboard.display_text",
        "analysis.downsample",
    }
)
# Entered once each: the feed, which asks the views for their values and hands them to the figures;
# the views' memo and the figures' memo, each asked once for everything the answer needs of it.  The
# chart component twice: the figures a tab holds are looked up before the new ones are built (a
# figure nothing holds any more is gone from its table of tokens), their payloads after.
SPINE = {
    "dashboard.live.feed": 1,
    "dashboard.views.memo": 1,
    "dashboard.figures.chart_memo": 1,
    "dashboard.live.chart_component": 2,
}


# What the layers above ask of a snapshot: a memo's place, an event's rows, a frame of some of its
# fields, the kinds of its fields.  Values, every one: the snapshot runs none of their code.
SNAPSHOT_READS = {"kept", "rows", "frame", "effective", "kinds"}
# Entries into a module already entered, on the way but the per-chart drawing: the snapshot read by
# the views' memo (its places, the logged keys' kinds, the checked frame), the figures' memo (its
# places, each event's rows) and the specs (each event's rows, read once for all charts); the specs
# asked for the chart list's filter, the specs and the headings; the chart component twice.
RETURNS_AT_MOST = 25


def test_a_live_answer_goes_down_the_layers_entering_each_module_once(tmp_path: Path) -> None:
    """The feed, the views' memo and the figures' memo are each entered once, in that order (the
    views' values handed down to the figures), the snapshot only read, and no call goes up a
    layer: the snapshot keeps values and calls none of the views' or figures' functions."""
    answer, way = live_answer(tmp_path, ChartOptions(smoothing=0.5))
    assert len(answer["charts"]) >= 6 and {chart["op"] for chart in answer["charts"].values()} == {"extend"}
    assert way.upward == []
    layers = [module.split(".")[1] for module in way.entered if module.startswith("dashboard.")]
    first_entered = [layer for layer in dict.fromkeys(layers) if layer != "display_text"]
    assert first_entered == ["live", "views", "store", "figures"]
    counts = way.count(leaving_out=PER_CHART)
    assert {module: counts[module] for module in SPINE} == SPINE
    assert {function for module, function in way.functions if module == "dashboard.store.snapshot"} <= SNAPSHOT_READS
    assert way.returns(leaving_out=PER_CHART) <= RETURNS_AT_MOST


def test_the_charts_drawn_in_one_pass_are_the_charts_drawn_one_by_one(tmp_path: Path) -> None:
    """``run_charts`` reads the snapshot's rows once for all the charts (``chart_specs.chart_specs``);
    a page drawing them one by one (``chart_builders``) reads each chart's own: the same figures,
    on a resumed run with logged keys and a data-parallel one, in every history mode."""
    three_session_run(tmp_path / "resumed" / "metrics.jsonl")
    extra = [base_record(s, session="s3", mfu=s / 1e3, **{"val/acc": 0.5}) for s in (210, 220)]
    append_records(tmp_path / "resumed" / "metrics.jsonl", *extra)
    distributed_run(tmp_path / "ranks" / "metrics.jsonl")
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        for run in ("resumed", "ranks"):
            view = store.view(run)
            for options in (
                ChartOptions(smoothing=0.6),
                ChartOptions(history="all", x="tokens_seen", log_y=True),
                ChartOptions(history="sessions", only="loss|mfu|rank"),
            ):
                whole = run_charts(view, options)
                one_by_one = {key: draw() for key, draw in chart_builders(view, options).items()}
                assert list(whole) == list(one_by_one) and len(whole) >= 2
                assert [figure_json(figure) for figure in whole.values()] == [
                    figure_json(figure) for figure in one_by_one.values()
                ]
    finally:
        store.close()


def _module_function(module: str, source: str) -> Callable[..., Any]:
    """The function ``f`` of ``source``, run as if module ``module`` held it."""
    namespace: dict[str, Any] = {"__name__": module}
    exec(compile(source, f"<{module}>", "exec"), namespace)
    return namespace["f"]


def test_the_way_finder_sees_a_call_back_up() -> None:
    """The oracle itself: a snapshot's memo that calls the function a figure module handed it is
    seen going up, and entering the figure module twice; calls within a module enter it once."""
    memo = _module_function("metrics_core.dashboard.store.fake", "def f(compute):\n    return compute()\n")
    helper = _module_function("metrics_core.dashboard.figures.fake", "def f():\n    return 1\n")
    figure = _module_function(
        "metrics_core.dashboard.figures.fake", "def f(memo, helper):\n    return memo(helper) + helper()\n"
    )
    result, way = follow(lambda: figure(memo, helper))
    assert result == 2
    assert way.entered == ["dashboard.figures.fake", "dashboard.store.fake", "dashboard.figures.fake"]
    assert way.upward == [("metrics_core.dashboard.store.fake", "metrics_core.dashboard.figures.fake", "f")]
    assert way.returns() == 1 and way.count() == {"dashboard.figures.fake": 2, "dashboard.store.fake": 1}
