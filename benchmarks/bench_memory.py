"""The dashboard server's resident memory: what a run's page costs over the import floor, and
whether a live page's memory grows with time.  A real server, a real headless Chromium.

Run: python benchmarks/bench_memory.py [--records 100000] [--appends 20] [--settle 25] [--soak 6] [--period 0.2]
                                       [--soak-history 0]

* ``floor``: the RSS of a process that imports what the server imports (streamlit, pandas,
  plotly and the dashboard's modules) and nothing else: no page can cost less.
* ``page``: one tab on a live run of ``--records`` generated records (``generate.write_run``, then a
  writer's session of its own, open before the tab as on a cluster). The server's RSS when the
  charts are drawn; then its PEAK from that moment through ``--appends`` records appended one a
  second and ``--settle`` seconds after the last (the alerter's first pass over the root is done
  by then): the kernel's high-water mark (``VmHWM``), reset when the charts drew by writing 5 to
  ``/proc/<pid>/clear_refs``, and the largest ``VmRSS`` sampled every 20 ms as a cross-check; the
  RSS at the end; each minus the floor. The high-water mark of the whole life (the run's first
  read included) is printed too.
* ``--live-cpu N`` (0: skipped): the server's CPU, as a share of one core, from the first to the
  second minute after a tab opened a live run of N records (``generate.write_run``) that logs a
  window every second meanwhile: what the page and the alerter's first work on the run cost once
  it drew.
* ``--soak M`` (0: skipped): one tab on a live run logging a window every ``--period`` seconds for
  M minutes; the RSS at minute 1 and at the end, and the growth between per record appended.
  It stops by itself after M minutes.  ``--soak-history N``: the run holds N generated records
  before the tab opens; past ``CHART_POINTS`` per chart, the points a page draws no longer grow
  with the run, and what is left is the run's own records.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from benchmarks.bench_live import cpu_seconds, server_pid
from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import REPO, chromium, live_charts_drawn, streamlit_server, wait_until

FLOOR_IMPORTS = """
import streamlit, pandas, plotly.graph_objects
import metrics_core.dashboard.settings, metrics_core.dashboard.chart_grid, metrics_core.dashboard.widgets
import metrics_core.dashboard.server.serving, metrics_core.dashboard.live.push, metrics_core.dashboard.panels
for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
        print(int(line.split()[1]) * 1024)
"""


def status_bytes(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for {pid}")


def rss(pid: int) -> int:
    """Resident bytes of process ``pid``."""
    return status_bytes(pid, "VmRSS")


class PeakSampler:
    """The largest VmRSS of ``pid`` sampled every ``period`` seconds in a thread, while in the block."""

    def __init__(self, pid: int, period: float = 0.02) -> None:
        self.pid, self.period, self.peak = pid, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.pid))
            self._stop.wait(self.period)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def import_floor() -> int:
    """The RSS of a fresh process that imports what the server imports."""
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", FLOOR_IMPORTS], capture_output=True, text=True, check=True, cwd=REPO, env=environ
    )
    return int(done.stdout.strip())


def open_run_page(browser: object, url: str, name: str, charts: int) -> object:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/run?run={name}")
    wait_until(page, lambda: live_charts_drawn(page, charts), timeout=600)
    return page


@dataclass
class PageMemory:
    """One tab on a big live run: the server's RSS at these moments, in bytes."""

    drawn: int  # when the charts are drawn
    peak: int  # VmHWM from the charts drawn through the appends and the settle
    sampled_peak: int  # the largest VmRSS sampled in that span
    end: int  # at its end
    life_peak: int  # VmHWM before the reset: the run's first read and first charts


def page_rss(records: int, appends: int, settle: float) -> PageMemory:
    """The server's memory with one tab on a live run of ``records`` records, from the charts drawn
    through ``appends`` records appended one a second and ``settle`` seconds after the last."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        run = RunContext(root / "big", "big", "live")
        write_run(run.directory / "metrics.jsonl", records)
        state = TrainingState(step=10**8)
        cache = ("--cache-dir", str(Path(tmp) / "cache"))
        with MetricsWriter(run) as writer, streamlit_server(root, *cache, refresh=0.5) as url:
            writer.write("train", state, train_loss=2.0, grad_norm_avg=0.8)
            with chromium() as browser:
                open_run_page(browser, url, "big", 4)
                pid = server_pid(url)
                drawn, life_peak = rss(pid), status_bytes(pid, "VmHWM")
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS from here on
                with PeakSampler(pid) as sampler:
                    start = time.monotonic()
                    for number in range(1, appends + 1):
                        state.step += 10
                        writer.write("train", state, train_loss=2.0 + 1.0 / number, grad_norm_avg=0.8)
                        time.sleep(max(0.0, start + number - time.monotonic()))
                    time.sleep(settle)
                    end = rss(pid)
                return PageMemory(drawn, status_bytes(pid, "VmHWM"), sampler.peak, end, life_peak)


def soak(minutes: float, period: float, history: int = 0) -> tuple[int, int, int]:
    """(RSS at minute 1, RSS at the end, records appended between) with one tab on a live run that
    holds ``history`` generated records (``generate.write_run``) before it, else 10 of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        run = RunContext(root / "live", "live", "s1")
        if history:
            write_run(run.directory / "metrics.jsonl", history)
        state = TrainingState(step=10**8 if history else 0)
        cache = ("--cache-dir", str(Path(tmp) / "cache"))
        with MetricsWriter(run) as writer, streamlit_server(root, *cache, refresh=0.5) as url:
            for _ in range(10):
                state.step += 1
                writer.write("train", state, train_loss=1.0 / state.step, grad_norm_avg=0.5)
            with chromium() as browser:
                open_run_page(browser, url, "live", 1)
                pid = server_pid(url)
                start = time.monotonic()
                first: tuple[int, int] | None = None
                while (elapsed := time.monotonic() - start) < minutes * 60:
                    state.step += 1
                    writer.write(
                        "train", state, train_loss=1.0 / state.step + 0.01 * (state.step % 7), grad_norm_avg=0.5
                    )
                    if first is None and elapsed >= 60:
                        first = (rss(pid), state.step)
                    time.sleep(period)
                assert first is not None, "the soak must last more than a minute"
                return first[0], rss(pid), state.step - first[1]


def live_cpu(records: int) -> float:
    """The server's CPU share from minute 1 to minute 2 after a tab opened a live run of ``records``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        run = RunContext(root / "live", "live", "s9")
        write_run(run.directory / "metrics.jsonl", records)
        state = TrainingState(step=10**8)
        cache = ("--cache-dir", str(Path(tmp) / "cache"))
        with MetricsWriter(run) as writer, streamlit_server(root, *cache) as url, chromium() as browser:
            open_run_page(browser, url, "live", 4)
            pid, opened = server_pid(url), time.monotonic()
            cpu = None
            while (elapsed := time.monotonic() - opened) < 120:
                state.step += 10
                writer.write("train", state, train_loss=2.0)
                if cpu is None and elapsed >= 60:
                    cpu, start = cpu_seconds(pid), time.monotonic()
                time.sleep(1.0)
            return (cpu_seconds(pid) - cpu) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--appends", type=int, default=20, help="records appended, one a second, after the charts drew")
    parser.add_argument("--settle", type=float, default=25.0, help="seconds after the last append")
    parser.add_argument("--live-cpu", type=int, default=0, help="records of a live run whose CPU is measured")
    parser.add_argument("--soak", type=float, default=0.0, help="minutes of a live page (0: no soak)")
    parser.add_argument("--period", type=float, default=0.2, help="seconds between two records of the soak")
    parser.add_argument("--soak-history", type=int, default=0, help="records the soak's run holds before its tab opens")
    args = parser.parse_args()
    mb = 1e6
    floor = import_floor()
    print(f"import floor: {floor / mb:.0f} MB")
    if args.records:
        page = page_rss(args.records, args.appends, args.settle)
        print(
            f"page on a live {args.records:,}-record run: {page.drawn / mb:.0f} MB when drawn; peak from then "
            f"through {args.appends} appends and {args.settle:g} s: {page.peak / mb:.0f} MB = floor + "
            f"{(page.peak - floor) / mb:.0f} MB (goal <= floor + 80 MB; sampled every 20 ms: "
            f"{page.sampled_peak / mb:.0f} MB); {page.end / mb:.0f} MB at the end = floor + "
            f"{(page.end - floor) / mb:.0f} MB; peak before the charts drew (first read): {page.life_peak / mb:.0f} MB"
        )
    if args.live_cpu:
        share = live_cpu(args.live_cpu)
        print(
            f"live {args.live_cpu:,}-record run, a window a second: server CPU {share:.1%} of a core from minute 1 "
            "to minute 2 after its page opened (goal <= 10%)"
        )
    if args.soak:
        before, after, appended = soak(args.soak, args.period, args.soak_history)
        print(
            f"soak, {args.soak:g} min, a record every {args.period:g} s after {args.soak_history:,} records: "
            f"{before / mb:.0f} MB at minute 1, "
            f"{after / mb:.0f} MB at the end: +{(after - before) / mb:.1f} MB over {appended:,} records "
            f"({(after - before) / max(appended, 1) / 1e3:.2f} KB per record; goal <= 5 MB)"
        )


if __name__ == "__main__":
    main()
