"""The compare page drawing 12 runs grouped against drawing one run, side by side.

Run: python benchmarks/bench_compare_groups.py [--steps 100000] [--rounds 5] [--no-browser]

A sweep of 3 peak learning rates × 4 seeds written through the project's writer
(``metrics_core.testing.sweep``, a train record every 10 steps, validation every 50), then, in
interleaved rounds:

* figures: in this process, the compare page's five default charts (``compare_chart``) of one run
  (single lines), and of the 12 runs grouped by ``peak_lr`` with a min–max band, in server CPU:
  ``first`` on new snapshots of every run (what a page pays when each run changed: a live sweep),
  ``refresh`` on the same snapshots again (finished runs: each run's points are kept per snapshot);
* browser: a real ``streamlit run`` of the dashboard and a headless Chromium, a fresh tab per load,
  from navigation until all five charts are drawn, for ``/compare?run=<one>`` and for
  ``/compare?run=<12 runs>&group=peak_lr``; every run is read once before the rounds, so a load
  measures the page, not a cold read of the files.

Medians per case, then the ratio of the 12 grouped runs to the one run (the goal: at most 2.5).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.dashboard.figures.run_charts import compare_chart
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.views.config_tables import view_config
from metrics_core.dashboard.views.groups import run_groups
from metrics_core.testing.live_server import chromium, live_charts_drawn, streamlit_server, wait_until
from metrics_core.testing.sweep import write_sweep

METRICS = ("train_loss", "val_loss", "grad_norm_avg", "lr", "tokens_per_s")  # the page's defaults
GOAL = 2.5


def figures_seconds(store: RunStore, names: list[str], group: str | None, *, fresh: bool) -> float:
    """CPU seconds to build the five charts of ``names`` (grouped by ``group`` when given); with
    ``fresh``, on a copy of each run's snapshot with nothing memoised yet."""
    views = {name: replace(store.view(name)) if fresh else store.view(name) for name in names}
    configs = {name: view_config(view).values for name, view in views.items()}
    groups = run_groups(names, configs, group) if group else None
    start = time.process_time()
    for metric in METRICS:
        compare_chart(views, metric, x="step", smoothing=0.6, log_y=False, groups=groups)
    return time.process_time() - start


def page_seconds(browser: object, url: str) -> float:
    """Wall seconds from navigating a fresh tab to ``url`` until its five charts are drawn."""
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = context.new_page()
    try:
        start = time.perf_counter()
        page.goto(url)
        wait_until(page, lambda: live_charts_drawn(page, len(METRICS)), timeout=120, interval=0.02)
        return time.perf_counter() - start
    finally:
        context.close()


def report(what: str, one: list[float], grouped: list[float]) -> None:
    first, twelve = statistics.median(one), statistics.median(grouped)
    ratio = twelve / first
    verdict = "met" if ratio <= GOAL else "NOT met"
    print(f"{what}: one run {first * 1e3:,.0f} ms, 12 runs grouped {twelve * 1e3:,.0f} ms (medians of {len(one)})")
    print(f"  ratio 12 grouped / one: {ratio:.2f} (goal <= {GOAL}: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000, help="steps per run (a train record every 10)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true", help="only the figures, in this process")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "runs"
        names = write_sweep(root, steps=args.steps)
        print(f"{len(names)} runs of {args.steps // 10:,} train records each under {root}")
        store = RunStore(root)
        try:
            figures_seconds(store, names, "peak_lr", fresh=False)  # every snapshot read, as a live server holds them
            for fresh, what in ((True, "first"), (False, "refresh")):
                one, grouped = [], []
                for _ in range(args.rounds):
                    one.append(figures_seconds(store, names[:1], None, fresh=fresh))
                    grouped.append(figures_seconds(store, names, "peak_lr", fresh=fresh))
                report(f"figures, {what} (server CPU)", one, grouped)
        finally:
            store.close()
        if args.no_browser:
            return
        single = urlencode({"run": names[0]})
        many = urlencode([*(("run", name) for name in names), ("group", "peak_lr")])
        with streamlit_server(root) as url, chromium() as browser:
            page_seconds(browser, f"{url}/compare?{many}")  # the server reads every run once
            one, grouped = [], []
            for _ in range(args.rounds):
                one.append(page_seconds(browser, f"{url}/compare?{single}"))
                grouped.append(page_seconds(browser, f"{url}/compare?{many}"))
        report("browser (navigation to five charts drawn)", one, grouped)


if __name__ == "__main__":
    main()
