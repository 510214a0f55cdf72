"""Live latency, server CPU and bytes per update: a real server, a real headless Chromium, a real writer.

Run: python benchmarks/bench_live.py [--appends 25] [--records 1000000] [--refresh 1 0.25] [--big 0] [--floor 20]
                                     [--history 1000] [--keys 200]

Latency is measured write -> visible: Python stamps the wall clock right after MetricsWriter.write
returns; the page stamps the wall clock (same machine, same clock) the first time the loss chart's
last point is that record's step, checking every 10 ms.  Appends come every 1.3 s, out of phase
with the refresh, so the figure includes the wait for the next refresh.  Over the same appends:
the server process's CPU (utime + stime from /proc, as a share of one core) and the bytes the
page received on its websocket (Playwright's frame events), per append.  Each refresh period
given runs side by side in one invocation; ``--big N`` adds the same measurement on a live run
that already holds N records (``generate.write_run``), next to one of 100 records, twice: right
after its page drew, while the server still does its first work on the run (the alerter's first
pass over it), and again once the server settled (``settle``: the steady cost per append); ``--keys N``
the same on a run whose records log N more keys (N charts the page may draw; it draws the
defaults and ``chart_specs.MAX_LOGGED_CHARTS`` of them), next to one that logs none.  ``--history N``
gives the runs of each refresh period N records in three sessions first (``bench_rivals.py``'s
1k-record run: every append then redraws three sessions' traces), not 10 of one session.

``--soak S`` measures the same for S seconds on a live run of ``--big`` records (1M when not given)
whose columnar cache the server keeps in a directory of the benchmark's, once the server settled:
the spread of write -> visible (p99 against the median) across the cache saves that fall inside,
each counted as the cache file changes.  The dashboard saves a growing run's cache every 5 minutes,
so ten minutes hold two saves.

``--floor S`` measures, over S seconds with nothing appended, what a live tab costs when nothing
changes, next to what Streamlit itself costs: the same refresh of a fragment with nothing in it
(the floor no page can go below), and of the run page on an idle 100-record run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import percentile
from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.dashboard.figures.run_charts import run_charts
from metrics_core.dashboard.store.run_store import RunStore
from metrics_core.dashboard.views.chart_specs import ChartOptions
from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import chromium, streamlit_app, streamlit_server

WATCH_JS = """() => {
  window.__seen = {};
  setInterval(() => {
    const graphs = [...document.querySelectorAll('.js-plotly-plot')];
    const graph = graphs.find(g => g.layout && g.layout.title.text === 'Loss');
    if (!graph) return;
    for (const trace of graph.data) {
      if (!trace.name.startsWith('train') || !trace.x || !trace.x.length) continue;
      const last = trace.x[trace.x.length - 1];
      if (last === null) continue;  // a legend entry's one null point, drawn nowhere
      if (!(last in window.__seen)) window.__seen[last] = Date.now();
    }
  }, 10);
}"""


def server_pid(url: str) -> int:
    """The pid of the ``streamlit run`` serving ``url`` (found by its --server.port argument)."""
    port = url.rsplit(":", 1)[1]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"streamlit" in b" ".join(args) and port.encode() in args and b"--server.port" in args:
                return int(entry)
    raise RuntimeError(f"no streamlit process serving {url}")


EMPTY_FRAGMENT_APP = """
import sys
import streamlit as st

@st.fragment(run_every=float(sys.argv[1]))
def nothing() -> None:
    pass

nothing()
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def live_run(root: Path, history: int) -> RunContext:
    """The run ``live`` under ``root``, holding ``history`` generated records (three sessions) first."""
    run = RunContext(root / "live", "live", "s1")
    if history:
        write_run(run.directory / "metrics.jsonl", history)
    return run


def settle(pid: int, *, share: float = 0.10, window: float = 5.0, limit: float = 900.0) -> float:
    """Seconds until the server's CPU over ``window`` seconds fell below ``share`` of a core (its
    first work on a big run done: the alerter's first pass over it, a cache save), at most ``limit``.
    The alerter reads at ``alerting.READ_SHARE``; on a loaded machine it gets less, so ``share`` is
    well under it."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        cpu = cpu_seconds(pid)
        time.sleep(window)
        if (cpu_seconds(pid) - cpu) / window < share:
            break
    return time.monotonic() - start


def cache_files(directory: Path) -> set[tuple[str, int]]:
    """The columnar cache files in ``directory``, each with its modification time: a save changes it."""
    return {(path.name, path.stat().st_mtime_ns) for path in directory.glob("*.mcc")}


def live(
    appends: int,
    *,
    refresh: float,
    history: int = 0,
    keys: int = 0,
    settled: bool = False,
    only_settled: bool = False,
) -> dict[str, object]:
    """Write -> visible delays, server CPU share, websocket bytes and cache saves per append on a live
    run whose records carry ``keys`` logged numbers besides the writer's own (each a chart the page
    may draw).  ``settled``: the same again once the server is idle (``settle``), under
    ``"settled"``; ``only_settled``: only that measurement (a soak across cache saves)."""
    logged = lambda step: {f"k/{n:03}": float(step % 97 + n) for n in range(keys)}  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        root, cache = Path(tmp) / "runs", Path(tmp) / "cache"
        run = live_run(root, history)
        state = TrainingState()
        received: list[int] = []
        server = streamlit_server(root, "--cache-dir", str(cache), refresh=refresh)
        with server as url, chromium() as browser, MetricsWriter(run) as writer:
            first = 10**8 if history else 10
            for step in range(first, first + 100, 10):
                state.step = step
                writer.write("train", state, train_loss=1.0 / step, **logged(step))
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("websocket", lambda ws: ws.on("framereceived", lambda frame: received.append(len(frame))))
            page.goto(f"{url}/run?run=live")
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 6", timeout=600_000)
            page.evaluate(WATCH_JS)
            time.sleep(5)
            pid = server_pid(url)

            def measure(offset: int) -> dict[str, object]:
                written: dict[int, float] = {}
                received.clear()
                saves, files = 0, cache_files(cache)
                cpu, wall = cpu_seconds(pid), time.monotonic()
                for number in range(offset, offset + appends):
                    state.step = first + 1000 + 10 * number
                    writer.write("train", state, train_loss=0.5, **logged(state.step))
                    written[state.step] = time.time() * 1000
                    time.sleep(1.3)
                    now = cache_files(cache)
                    saves, files = saves + len(now - files), now
                time.sleep(3)
                cpu_share = (cpu_seconds(pid) - cpu) / (time.monotonic() - wall)
                seen = {int(float(k)): v for k, v in page.evaluate("window.__seen").items()}
                missing = [step for step in written if step not in seen]
                delays = sorted(seen[step] - written[step] for step in written if step in seen)
                return {
                    "delays": delays,
                    "missing": len(missing),
                    "cpu": cpu_share,
                    "bytes": sum(received) / appends,
                    "saves": saves,
                }

            if only_settled:
                waited = settle(pid)
                return {**measure(0), "waited": waited}
            found = measure(0)
            if settled:
                waited = settle(pid)
                found["settled"] = {**measure(appends), "waited": waited}
    return found


def idle_cpu(seconds: float, *, refresh: float) -> dict[str, float]:
    """Server CPU share with one tab open and nothing appended: an empty fragment, then the run page."""
    shares = {}
    with tempfile.TemporaryDirectory() as tmp, chromium() as browser:
        root = Path(tmp)
        app = root / "empty_fragment.py"
        app.write_text(EMPTY_FRAGMENT_APP)
        run = RunContext(root / "runs" / "idle", "idle", "s1")
        with MetricsWriter(run) as writer:
            state = TrainingState()
            for step in range(10, 1010, 10):
                state.step = step
                writer.write("train", state, train_loss=1.0 / step)
        pages = {
            "empty fragment": (lambda: streamlit_app(app, str(refresh)), ""),
            "run page, idle 100-record run": (
                lambda: streamlit_server(root / "runs", refresh=refresh),
                "/run?run=idle",
            ),
        }
        for label, (server, path) in pages.items():
            with server() as url:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(url + path)
                if path:
                    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 6", timeout=60_000)
                time.sleep(5)
                pid = server_pid(url)
                cpu, wall = cpu_seconds(pid), time.monotonic()
                time.sleep(seconds)
                shares[label] = (cpu_seconds(pid) - cpu) / (time.monotonic() - wall)
                page.close()
    return shares


def summary(delays: list[float]) -> str:
    if not delays:
        return "no append became visible"
    return (
        f"median {statistics.median(delays):.0f} ms, p95 {percentile(delays, 0.95):.0f} ms, "
        f"p99 {percentile(delays, 0.99):.0f} ms, max {delays[-1]:.0f} ms"
    )


def missing_text(found: dict[str, object]) -> str:
    return f" ({found['missing']} never seen)" if found["missing"] else ""


def figure_bytes(records: int) -> tuple[int, int, int]:
    from metrics_core.dashboard.figures.figure_dicts import (
        figure_json,  # the tree under test may predate it (--records 0)
    )

    with tempfile.TemporaryDirectory() as tmp:
        count = write_run(Path(tmp) / "big" / "metrics.jsonl", records)
        store = RunStore(Path(tmp))
        try:
            figures = run_charts(store.view("big"), ChartOptions(smoothing=0.6))
        finally:
            store.close()
        sizes = [len(figure_json(figure)) for figure in figures.values()]
    return count, max(sizes), sum(sizes)


def soak(seconds: float, *, records: int, refresh: float) -> None:
    """Write -> visible over ``seconds`` of appends to a live ``records``-record run once the server
    settled, with the cache saves that fell inside (see the module docstring)."""
    appends = round(seconds / 1.3)
    found = live(appends, refresh=refresh, history=records, only_settled=True)
    delays = found["delays"]
    print(
        f"{records}-record run, {appends} appends over {seconds:.0f} s at refresh {refresh:g} s, "
        f"{found['saves']} cache saves inside (server settled {found['waited']:.0f} s first): "
        f"write -> visible {summary(delays)}{missing_text(found)}"
    )
    if delays:
        ratio = percentile(delays, 0.99) / statistics.median(delays)
        print(f"p99 / median: {ratio:.2f}x (goal <= 2x); server CPU {found['cpu']:.1%} of a core")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--appends", type=int, default=25, help="appends per live measurement (0: none)")
    parser.add_argument("--records", type=int, default=1_000_000, help="figure size of a run this long (0: skip)")
    parser.add_argument("--refresh", type=float, nargs="+", default=[1.0, 0.25])
    parser.add_argument("--big", type=int, default=0, help="also a live run of this many records (e.g. 1000000)")
    parser.add_argument("--floor", type=float, default=0, help="seconds of idle CPU: empty fragment vs run page")
    parser.add_argument("--history", type=int, default=0, help="records the runs of each refresh period start with")
    parser.add_argument("--keys", type=int, default=0, help="also a live run logging this many keys (e.g. 200)")
    parser.add_argument("--soak", type=float, default=0, help="seconds of appends to a --big run, cache saves in")
    args = parser.parse_args()
    if args.soak:
        soak(args.soak, records=args.big or 1_000_000, refresh=args.refresh[-1])
    if args.floor:
        for refresh in args.refresh:
            shares = idle_cpu(args.floor, refresh=refresh)
            print(f"idle, refresh {refresh:g} s: " + "; ".join(f"{label} {share:.2%} of a core"
                                                           for label, share in shares.items()))  # fmt: skip
    if not args.appends:
        return
    results = {f"refresh {refresh:g} s": live(args.appends, refresh=refresh, history=args.history)
               for refresh in args.refresh}  # fmt: skip
    if args.big:
        results["100-record run"] = live(args.appends, refresh=args.refresh[-1])
        results[f"{args.big}-record run"] = big = live(args.appends, refresh=args.refresh[-1], history=args.big,
                                                      settled=True)  # fmt: skip
        results[f"{args.big}-record run, settled"] = big["settled"]
    if args.keys:
        results["no logged keys"] = live(args.appends, refresh=args.refresh[-1])
        results[f"{args.keys} logged keys"] = live(args.appends, refresh=args.refresh[-1], keys=args.keys)
    for label, found in results.items():
        print(f"{label:>22}: write -> visible over {args.appends} appends: {summary(found['delays'])}"
              f"{missing_text(found)}; server CPU "
              f"{found['cpu']:.1%} of a core; {found['bytes'] / 1e3:.1f} KB received per append")  # fmt: skip
    if args.big:
        small = results["100-record run"]
        print(f"{args.big}-record run settled {results[f'{args.big}-record run, settled']['waited']:.0f} s after the "
              f"first appends (server CPU under 10% of a core over 5 s)")  # fmt: skip
        for when in ("", ", settled"):
            big = results[f"{args.big}-record run{when}"]
            if small["delays"] and big["delays"]:
                ratio = statistics.median(big["delays"]) / statistics.median(small["delays"])
                print(f"ratio {args.big}-record{when} / 100-record run: write -> visible median {ratio:.2f}x "
                      f"(goal <= 1.5x), server CPU {big['cpu']:.1%} (goal <= 10%)")  # fmt: skip
    if args.keys:
        plain, many = results["no logged keys"], results[f"{args.keys} logged keys"]
        print(f"{args.keys} logged keys: server CPU {many['cpu']:.1%} of a core against {plain['cpu']:.1%} without "
              f"(goal: a live tab <= 5%)")  # fmt: skip
    if args.records:
        count, largest, total = figure_bytes(args.records)
        print(f"figure JSON for a {count}-record run: largest chart {largest / 1e3:.0f} KB, "
              f"all six {total / 1e3:.0f} KB (goal <= 200 KB per chart; 1M raw points ~16.8 MB)")  # fmt: skip


if __name__ == "__main__":
    main()
