"""Grouped runs and a logged key as x, in a real Chromium: a sweep of 3 peak learning rates × 4
seeds on the compare page, one line and band per group with its run count in the legend, and the
run page drawn against the epoch, each opened from a URL that names the view."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

from metrics_core.testing.live_server import wait_until
from metrics_core.testing.sweep import sweep_name, write_sweep

PREFIX = "groups-sweep/"


def served_runs(root: Path) -> None:
    """The sweep: ``groups-sweep/lr<peak_lr>-seed<n>``, 12 runs of 200 steps, epoch logged."""
    write_sweep(root, prefix=PREFIX, steps=200)


# In the page: per chart, its title, x-axis title, legend entries as drawn, and its traces'
# names, fills and largest x.
CHARTS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(g => ({
  title: g.layout.title.text, xtitle: g.layout.xaxis.title.text,
  entries: [...g.querySelectorAll('.infolayer .legend .traces')].map(t => t.textContent),
  traces: g.data.map(t => ({name: t.name, fill: t.fill || null,
                            xmax: t.x && t.x.length ? Math.max(...Array.from(t.x).filter(v => v !== null)) : null})),
}))"""


def sweep_runs() -> list[str]:
    return [sweep_name(PREFIX, lr, seed) for lr in (1e-4, 3e-4, 1e-3) for seed in range(4)]


def test_the_compare_page_draws_one_line_and_band_per_group_from_its_url(page: object, server: str) -> None:
    """/compare?run=…&group=peak_lr&band=std: each chart has three legend entries, one per peak_lr
    with its run count, each a mean line over a filled band; group=none draws the twelve runs."""
    query = urlencode([*(("run", name) for name in sweep_runs()), ("group", "peak_lr"), ("band", "std")])
    page.goto(f"{server}/compare?{query}")
    # The charts draw in no set order: wait for the one read here, not for the first with a legend.
    (loss,) = wait_until(
        page,
        lambda: [c for c in page.evaluate(CHARTS_JS) if c["title"].startswith("train loss") and c["entries"]],
        timeout=60,
    )
    assert loss["title"] == "train loss · mean, band ± 1 std"
    assert loss["entries"] == ["peak_lr=0.0001 (4 runs)", "peak_lr=0.0003 (4 runs)", "peak_lr=0.001 (4 runs)"]
    assert sum(trace["fill"] == "tonexty" for trace in loss["traces"]) == 3
    assert "group=peak_lr" in page.url and "band=std" in page.url
    page.goto(f"{server}/compare?{urlencode([*(('run', name) for name in sweep_runs()), ('group', 'none')])}")
    single = wait_until(
        page, lambda: [c for c in page.evaluate(CHARTS_JS) if c["title"] == "train loss" and c["entries"]], timeout=60
    )
    runs = [entry for entry in single[0]["entries"] if entry.startswith(PREFIX)]
    assert len(runs) == 12 and not any(trace["fill"] for trace in single[0]["traces"])


def test_the_run_page_draws_against_the_epoch_named_in_its_url(page: object, server: str) -> None:
    """/run?run=…&x=epoch: the loss chart's x axis is the epoch (200 steps, 50 a epoch: up to 4),
    and the sidebar's x-axis control says so."""
    page.goto(f"{server}/run?{urlencode({'run': sweep_runs()[0], 'x': 'epoch'})}")
    charts = wait_until(page, lambda: [c for c in page.evaluate(CHARTS_JS) if c["title"] == "Loss"], timeout=60)
    loss = charts[0]
    assert loss["xtitle"] == "epoch"
    assert max(trace["xmax"] for trace in loss["traces"] if trace["xmax"] is not None) == 4
    shown = "e => e.textContent + [...e.querySelectorAll('input')].map(i => i.value + i.placeholder).join('')"
    assert "epoch" in page.locator(".st-key-x_axis").evaluate(shown)
    assert "x=epoch" in page.url


# In the page: what the compare page's sidebar shows of the controls a link sets.
CONTROLS_JS = """() => ({
  metrics: [...document.querySelectorAll('.st-key-compare_metrics [data-tag]')].map(t => t.textContent),
  smoothing: document.querySelector('.st-key-smoothing input[type="range"]')?.value,
  log: document.querySelector('.st-key-log_y input[type="checkbox"]')?.checked,
  filter: document.querySelector('.st-key-compare_filter input')?.value,
})"""


def test_the_compare_page_reopens_the_metrics_smoothing_log_y_and_filter_of_its_url(page: object, server: str) -> None:
    """/compare?…&metric=val_loss&smoothing=0.8&log=1&filter=seed0: the sidebar shows that view;
    turning log-y off takes log=1 out of the URL and leaves the rest."""
    runs = [("run", name) for name in sweep_runs()[:2]]
    view = [("metric", "val_loss"), ("smoothing", "0.8"), ("log", "1"), ("filter", "seed0")]
    page.goto(f"{server}/compare?{urlencode([*runs, *view])}")

    def controls() -> dict | None:
        shown = page.evaluate(CONTROLS_JS)
        return shown if shown["metrics"] and shown["log"] is not None and shown["filter"] else None

    assert wait_until(page, controls, timeout=60) == {
        "metrics": ["validation loss"], "smoothing": "0.8", "log": True, "filter": "seed0"}  # fmt: skip
    page.locator(".st-key-log_y label").click()
    wait_until(page, lambda: "log=1" not in page.url, timeout=30)
    assert all(f"{name}={value}" in page.url for name, value in view if name != "log")
