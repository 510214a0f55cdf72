"""Ten thousand runs, a lab's root after a year: what a server pays for them, against a root of one.

Run: python benchmarks/bench_many_runs.py [--runs 1 2500 5000 10000] [--idle 30] [--dir DIR]

Each root holds that many small finished runs (``generate_root.small_run``: 100 train records and a
``session_end``), written once under ``--dir`` and reused.  Each is measured in a fresh process
holding what a dashboard server holds: the store (``RunStore``, with a columnar cache in a fresh
directory, as ``metrics-dashboard`` has one) and its alerter (``ServerAlerter``, default rules,
reading through the store), the root watched with inotify.  Printed side by side:

* listed: wall time of the first ``runs_table()``, what the runs page draws first (the runs not
  read within the page's budget listed as ``loading``);
* filled: wall time until no row reads ``loading`` and the alerter's first pass ended, and the
  process's CPU time until then (every thread: the store's loader, the alerter);
* RSS then (``/proc/self/status``);
* idle: with nothing changing, ``runs_table()`` once a second (an open runs page's fragment) for
  ``--idle`` seconds while the alerter runs its passes: the process's CPU as a share of one core;
* restart: the same again in a fresh process on the cache directory the first one left (its
  columnar cache and its kept summaries, ``kept_summaries``), as a restarted server.

``--browser ROUNDS``: then, a real ``streamlit run`` per root (a fresh cache: a first start) and Chromium, in
alternating rounds: seconds from opening the runs page until its table lists every run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generate_root import small_run


def make_root(root: Path, runs: int) -> Path:
    """``root`` holding ``runs`` small finished runs, ten teams of them (kept once whole)."""
    done = root / ".complete"
    if done.exists() and done.read_text() == str(runs):
        return root
    for number in range(runs):
        small_run(root / f"team{number % 10}" / f"sweep-{number:05d}" / "metrics.jsonl", 10 * number + 1)
    done.write_text(str(runs))
    return root


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(root: Path, idle_s: float, cache: Path) -> dict[str, float]:
    """One server's store and alerter on ``root``: see the module docstring."""
    from metrics_core.alerts.rules import AlertConfig
    from metrics_core.dashboard.alerting import ServerAlerter
    from metrics_core.dashboard.store.run_store import RunStore
    from metrics_core.dashboard.store.store_settings import StoreSettings
    from metrics_core.read.column_cache import CachePolicy

    cpu0, wall0 = time.process_time(), time.perf_counter()
    store = RunStore(root, StoreSettings(cache=CachePolicy(cache)))
    alerter = ServerAlerter(store, AlertConfig(), webhook=None)
    try:
        table = store.runs_table()
        listed = time.perf_counter() - wall0
        while (table["status"] == "loading").any() or not alerter.ready:
            time.sleep(0.25)
            table = store.runs_table()
        filled, filled_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        time.sleep(1.0)  # the last release and cache save
        rss = rss_mb()
        cpu, wall = time.process_time(), time.perf_counter()
        while time.perf_counter() - wall < idle_s:
            store.runs_table()
            time.sleep(1.0)
        idle = (time.process_time() - cpu) / (time.perf_counter() - wall)
    finally:
        alerter.close()
        store.close()
    return {"runs": len(table), "listed_s": listed, "filled_s": filled, "filled_cpu_s": filled_cpu,
            "rss_mb": rss, "idle_share": idle, "mode": store.source.mode}  # fmt: skip


def browser_rounds(roots: dict[int, Path], rounds: int) -> None:
    """The runs page of each root drawn in a fresh server, roots alternating: see the module docstring."""
    from benchmarks.bench_runs_page import LISTED_JS
    from metrics_core.testing.live_server import chromium, streamlit_server

    shown: dict[int, list[float]] = {runs: [] for runs in roots}
    with chromium() as browser:
        for _ in range(rounds):
            for runs, root in roots.items():
                with streamlit_server(root, "--cache-dir", tempfile.mkdtemp(prefix="metrics_bench_cache_")) as url:
                    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                    start = time.perf_counter()
                    page.goto(url)
                    page.wait_for_function(LISTED_JS, arg=runs, timeout=600_000)
                    shown[runs].append(time.perf_counter() - start)
                    page.close()
    for runs, times in shown.items():
        print(f"browser, {runs:>6} runs: the runs page lists them {min(times):.2f} s after opening it "
              f"(best of {rounds})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 2500, 5000, 10000])
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measured per root")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "metrics_bench_many_runs")
    parser.add_argument("--browser", type=int, default=0, metavar="ROUNDS", help="also the runs page in Chromium")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.idle, args.cache)))
        return
    found: dict[tuple[int, str], dict] = {}
    roots: dict[int, Path] = {}
    for runs in args.runs:
        root = roots[runs] = make_root(args.dir / f"runs{runs}", runs)
        cache = tempfile.mkdtemp(prefix="metrics_bench_cache_")
        command = [sys.executable, __file__, "--child", str(root), "--idle", str(args.idle), "--cache", cache]
        for start in ("first", "restart"):
            figures = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            found[runs, start] = figures
            print(f"{runs:>6} runs ({figures['mode']}, {start:>7}): listed in {figures['listed_s'] * 1e3:6.0f} ms, "
                  f"filled in {figures['filled_s']:6.1f} s using {figures['filled_cpu_s']:6.1f} s CPU; RSS "
                  f"{figures['rss_mb']:5.0f} MB; idle {figures['idle_share']:6.2%} of a core", flush=True)  # fmt: skip
    for (runs, start), figures in found.items():
        one = found.get((1, start))
        if runs != 1 and one is not None:
            idle = figures["idle_share"] - one["idle_share"]
            print(f"{runs:>6} runs against 1 ({start:>7}): listed {figures['listed_s'] / one['listed_s']:.1f}x, RSS "
                  f"+{figures['rss_mb'] - one['rss_mb']:.0f} MB, idle +{idle:.2%} of a core, "
                  f"filling {figures['filled_cpu_s'] / runs * 1e3:.2f} ms CPU per run")  # fmt: skip

    if args.browser:
        browser_rounds(roots, args.browser)


if __name__ == "__main__":
    main()
