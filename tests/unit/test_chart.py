"""The live chart's transport: after an append, only the new points travel (extendTraces), else the figure."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import plotly

from metrics_core.dashboard.figures.chart_memo import view_charts
from metrics_core.dashboard.figures.figure_dicts import Figure, figure_of
from metrics_core.dashboard.figures.layout import CHART_POINTS
from metrics_core.dashboard.figures.run_charts import compare_chart, run_charts, session_overlay
from metrics_core.dashboard.live.chart_component import (
    HISTORY,
    encode,
    encoded_by_token,
    extension,
    next_payload,
    plotly_source,
)
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.store.store_settings import StoreSettings
from metrics_core.dashboard.views.chart_specs import ChartOptions
from metrics_core.dashboard.views.compare import COMPARE_METRICS
from metrics_core.testing.generate import write_run
from tests.support import append_records, base_record


def line(xs: list[float], title: str = "t", mode: str | None = None) -> Figure:
    return figure_of([{"x": xs, "y": [x * 2.0 for x in xs], "mode": mode}], {"title": {"text": title}})


def test_appended_points_are_an_extension_and_anything_else_a_full_figure() -> None:
    """Same traces and a prefix: the tails; a changed old point, or fewer points: None."""
    old = encode(line([1.0, 2.0]))
    assert extension(old, encode(line([1.0, 2.0, 3.0]))) == [{"indices": [0], "update": {"x": [[3.0]], "y": [[6.0]]}}]
    assert extension(old, encode(line([1.0, 2.0]))) == []
    assert extension(old, encode(line([1.0, 2.0, 3.0], mode="markers"))) is None
    assert extension(old, encode(line([1.5, 2.0, 3.0]))) is None
    assert extension(old, encode(line([1.0]))) is None


def test_payload_sequence_extends_resends_and_resyncs() -> None:
    """First a full figure; then an extend naming its base; the same data again is a few bytes saying so;
    a page that asked for a resync holding nothing gets the whole figure.  Payloads name figures by token."""
    one, two = encode(line([1.0])), encode(line([1.0, 2.0]))
    first = next_payload(None, one, resync=False)
    assert first.payload["op"] == "full" and first.payload["seq"] == one.token and first.shown is one
    second = next_payload(first, two, resync=False)
    assert second.payload == {"op": "extend", "seq": two.token, "base": one.token, "steps": [
        {"indices": [0], "update": {"x": [[2.0]], "y": [[4.0]]}}]}  # fmt: skip
    same = next_payload(second, encode(line([1.0, 2.0])), resync=False)
    assert same.payload == {"op": "same", "seq": two.token} and same.shown is two
    relaid = next_payload(second, encode(line([1.0, 2.0, 3.0], title="fitted")), resync=False)
    assert relaid.payload["op"] == "extend" and '"fitted"' in relaid.payload["layout"]
    again = next_payload(second, encode(line([1.0, 2.0])), resync=True)
    assert again.payload["op"] == "full"


def test_a_page_that_missed_updates_is_extended_from_what_it_holds() -> None:
    """Three figures were sent but the page drew only the first: its resync is answered with the points
    since that one, not the whole figure.  A page that holds a figure this session never sent (the
    route's payloads brought it there) is extended from it too; one holding a figure nothing keeps
    any more gets the whole figure."""
    figures = [encode(line(xs)) for xs in ([1.0], [1.0, 2.0], [1.0, 2.0, 3.0])]
    sent = None
    for figure in figures:
        sent = next_payload(sent, figure, resync=False)
    caught = next_payload(sent, figures[2], resync=True, held=encoded_by_token(figures[0].token))
    assert caught.payload == {"op": "extend", "seq": figures[2].token, "base": figures[0].token, "steps": [
        {"indices": [0], "update": {"x": [[2.0, 3.0]], "y": [[4.0, 6.0]]}}]}  # fmt: skip
    ahead = encode(line([1.0, 2.0, 3.0, 4.0]))  # drawn from the route, never by this session
    latest = encode(line([1.0, 2.0, 3.0, 4.0, 5.0]))
    fed = next_payload(caught, latest, resync=True, held=encoded_by_token(ahead.token))
    assert fed.payload["base"] == ahead.token and fed.payload["steps"][0]["update"]["x"] == [[5.0]]
    forgotten = encode(line([7.0])).token  # no snapshot, session or tab keeps it
    gc.collect()
    assert next_payload(fed, latest, resync=True, held=encoded_by_token(forgotten)).payload["op"] == "full"


def test_a_live_update_of_a_1k_record_run_sends_under_10_kb(tmp_path: Path) -> None:
    """Ten appended records on a 1,000-record run: every chart is extended, ~O(10) points, not resent."""
    path = tmp_path / "r" / "metrics.jsonl"
    values = lambda s: {"train_loss": 5.0 / s, "grad_norm_avg": 1.0, "grad_norm_max": 2.0, "lr": 1e-4,  # noqa: E731
                        "clipped_fraction": 0.1, "skipped_updates_in_window": 0, "tokens": 100}  # fmt: skip
    append_records(path, *(base_record(s, **values(s)) for s in range(10, 10_001, 10)))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        options = ChartOptions(smoothing=0.6)
        charts = run_charts(store.view("r"), options)
        before = {key: next_payload(None, encode(figure), resync=False) for key, figure in charts.items()}
        full = sum(len(json.dumps(sent.payload)) for sent in before.values())
        append_records(path, *(base_record(s, **values(s)) for s in range(10_010, 10_101, 10)))
        after = {key: next_payload(before[key], encode(f), resync=False)
                 for key, f in run_charts(store.view("r"), options).items()}  # fmt: skip
    finally:
        store.close()
    assert {sent.payload["op"] for sent in after.values()} == {"extend"}
    update = sum(len(json.dumps(sent.payload)) for sent in after.values())
    assert update <= 10_000 < full


def test_two_tabs_on_one_run_share_its_snapshot_charts_and_update(tmp_path: Path) -> None:
    """Two tabs on one live run, each with its own payload history: after an append they get the
    same snapshot and figures (built once) and the very same appended points (compared and converted
    once), naming the same figure."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=5.0 / s) for s in range(10, 1_001, 10)))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        options = ChartOptions(smoothing=0.6)
        figure = view_charts(store.view("r"), options)["loss"]
        first = next_payload(None, encode(figure), resync=False)
        second = next_payload(first, encode(figure), resync=True)  # a tab that reloaded: at seq 2
        append_records(path, base_record(1_010, train_loss=0.005))
        tabs = [store.view("r"), store.view("r")]
        views = store.stats["views"]
        updated = [next_payload(sent, encode(view_charts(view, options)["loss"]), resync=False)
                   for sent, view in zip((first, second), tabs, strict=True)]  # fmt: skip
    finally:
        store.close()
    assert tabs[0] is tabs[1] and views == 2  # the first snapshot and this one: one per version
    assert [sent.payload["op"] for sent in updated] == ["extend", "extend"]
    assert updated[0].payload["seq"] == updated[1].payload["seq"] == encode(view_charts(tabs[0], options)["loss"]).token
    assert updated[0].payload["steps"] is updated[1].payload["steps"]


def test_a_session_keeps_only_the_figures_its_newest_extends(tmp_path: Path) -> None:
    """Kept for a page that missed payloads: the figures the newest one extends, at most HISTORY in
    all.  A figure that replaced the one before (every snapshot of a chart past CHART_POINTS, its
    points downsampled anew) leaves none: a page holding one gets the whole figure anyway, and a
    live long run's charts would otherwise keep HISTORY whole figures per chart and tab."""
    appended = [encode(line([float(x) for x in range(1, n + 1)])) for n in range(1, 7)]
    sent = None
    for figure in appended:
        sent = next_payload(sent, figure, resync=False)
    assert sent.earlier == tuple(reversed(appended[-HISTORY:-1]))
    replaced = next_payload(sent, encode(line([1.0, 3.0, 5.0, 7.0])), resync=False)
    assert replaced.payload["op"] == "full" and replaced.earlier == ()

    path = tmp_path / "r" / "metrics.jsonl"
    steps = range(1, CHART_POINTS + 2_001)
    append_records(path, *(base_record(s, train_loss=5.0 / s, grad_norm_avg=1.0 + s % 3) for s in steps))
    store = RunStore(tmp_path, StoreSettings(safety_interval=0.0))
    try:
        options = ChartOptions(smoothing=0.6)
        charts = run_charts(store.view("r"), options)
        sent = {key: next_payload(None, encode(figure), resync=False) for key, figure in charts.items()}
        for start in range(steps.stop, steps.stop + 3 * 50, 50):
            append_records(path, *(base_record(s, train_loss=5.0 / s) for s in range(start, start + 50)))
            charts = run_charts(store.view("r"), options)
            sent = {key: next_payload(sent[key], encode(charts[key]), resync=False) for key in sent}
    finally:
        store.close()
    assert {key for key, kept in sent.items() if kept.payload["op"] == "full"} >= {"loss", "grad_norm", "throughput"}
    assert {key: len(kept.earlier) for key, kept in sent.items()} == dict.fromkeys(sent, 0)


BASIC_TRACE_TYPES = {"scatter", "bar", "pie"}  # what plotly.js's basic bundle can draw (vendor/README.md)


def test_the_vendored_plotly_bundle_draws_every_trace_the_dashboard_makes(tmp_path: Path) -> None:
    """Every page's figures use only trace types of the basic bundle: a trace type outside it would draw
    nothing in the browser, with no error on the server. The bundle is the plotly.js major version the
    installed plotly package speaks."""
    head = plotly_source().read_bytes()[:200].decode()
    assert "(basic - minified) v4." in head, head
    bundled = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()[:200].decode()
    assert "plotly.js v4." in bundled, "plotly's own plotly.js moved to another major: update vendor/ (README)"
    write_run(tmp_path / "a" / "metrics.jsonl", 600)
    write_run(tmp_path / "b" / "metrics.jsonl", 300, seed=1)
    store = RunStore(tmp_path)
    try:
        views = {name: store.view(name) for name in ("a", "b")}
        figures: list[Figure] = []
        for x in ("step", "tokens_seen", "time"):
            options = ChartOptions(x=x, smoothing=0.6, log_y=False, history="effective", theme="dark")
            figures += run_charts(views["a"], options).values()
            figures.append(session_overlay(views["a"], x=x, smoothing=0.0))
        figures += [compare_chart(views, metric, x="step", smoothing=0.6, log_y=True) for metric in COMPARE_METRICS]
        types = {trace.type or "scatter" for figure in figures for trace in figure.data}
        assert types and types <= BASIC_TRACE_TYPES, types
    finally:
        store.close()
