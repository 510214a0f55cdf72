"""The runs runs page on a cluster head's root: 1,000 runs against a root of one.

Run: python benchmarks/bench_runs_page.py [--root DIR] [--seconds 10] [--browser]
     python benchmarks/bench_runs_page.py --memory ROOT [--against OLD_STORE_PY] [--rounds 2] [--cache]

Measured side by side in one process, on ``generate_root``'s root (990 small runs, 9 of 100k
records, one live run appending a record per second) and on a root holding only the live run:

* listed: wall time of the first ``RunStore.runs_table()`` of a fresh store, which lists every run
  (those not read within the load budget as ``loading``); filled: until no row is ``loading``
  (read by the store's background loader, which first leaves the page ``loader_delay_s`` to
  draw; ``runs_table()`` polled every 50 ms as a page would);
* idle refresh: server CPU (``time.process_time``) of one ``runs_table()`` call, called every
  0.25 s for ``--seconds`` while the live run appends (so some calls see a change);
* with ``--browser``: a real ``streamlit run`` and Chromium on each root: wall time from opening
  the page until the table is drawn listing every run; then, ``--settle`` s later, with the page
  open while the live run appends once a second: the server's CPU (from /proc) and the websocket
  bytes Chromium received (``metrics_core.testing.live_server.Wire``), per append.

``--memory ROOT`` (e.g. ``generate_root.py ROOT --small 0 --big 20 --big-records 200000``): in a
fresh process per measurement, a store lists ROOT until no row reads ``loading`` (its loader reads
every run); printed: the time to list and to fill, the process's RSS and peak RSS (``/proc``), the
records its readers hold, the time of a first ``view()`` of a big run, and of an ``runs_table()``
once filled.  ``--against FILE`` measures a ``run_store.py`` saved from another commit (``git show
REV:metrics_core/dashboard/store/run_store.py > FILE``) in alternating rounds, same root, same machine.
``--cache``: each store gets a fresh cache directory (the dashboard's default has one).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_live import cpu_seconds, server_pid
from benchmarks.generate_root import LIVE, make_root, small_run
from metrics_core.dashboard.store.run_store import RunStore


class LiveWriter(threading.Thread):
    """Appends one train record per second to ``path``, stamped now."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.stop = path, threading.Event()

    def run(self) -> None:
        step = 100_000
        while not self.stop.wait(1.0):
            step += 10
            line = {"schema_version": 1, "time": datetime.now(timezone.utc).isoformat(), "run_id": "live",
                    "session_id": "s-1000000", "event": "train", "step": step, "tokens_seen": step * 1000,
                    "skipped_updates": 0, "train_loss": 1.0}  # fmt: skip
            with open(self.path, "ab") as out:
                out.write(orjson.dumps(line) + b"\n")


def store_figures(root: Path, seconds: float) -> dict[str, float]:
    store = RunStore(root)
    try:
        start = time.perf_counter()
        table = store.runs_table()
        listed = time.perf_counter() - start
        while (table["status"] == "loading").any():  # the store's loader reads them; a page polls
            time.sleep(0.05)
            table = store.runs_table()
        filled = time.perf_counter() - start
        cpu = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            before = time.process_time()
            store.runs_table()
            cpu.append(time.process_time() - before)
            time.sleep(0.25)
    finally:
        store.close()
    return {"runs": len(table), "listed_s": listed, "filled_s": filled, "idle_cpu_ms": statistics.median(cpu) * 1e3,
            "mean_cpu_ms": statistics.mean(cpu) * 1e3}  # fmt: skip


def browser_figures(root: Path, runs: int, seconds: float, settle: float) -> dict[str, float]:
    """Seconds until the table is drawn listing every run, then, ``settle`` s later (the loader
    done), per append of the live run: websocket bytes Chromium received and server CPU."""
    from metrics_core.testing.live_server import Wire, chromium, streamlit_server

    with streamlit_server(root) as url, chromium() as browser:
        pid = server_pid(url)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        wire = Wire(context, page)
        start = time.perf_counter()
        page.goto(url)
        page.wait_for_function(LISTED_JS, arg=runs, timeout=600_000)
        shown = time.perf_counter() - start
        page.wait_for_timeout(settle * 1000)  # not time.sleep: Playwright hands Wire its events only while called
        live = root / LIVE / "metrics.jsonl"
        wire.reset()
        before, wall, lines = cpu_seconds(pid), time.monotonic(), live.read_bytes().count(b"\n")
        page.wait_for_timeout(seconds * 1000)
        cpu = (cpu_seconds(pid) - before) / (time.monotonic() - wall)
        appends = max(live.read_bytes().count(b"\n") - lines, 1)
        received = wire.frames
    return {"shown_s": shown, "server_cpu_share": cpu, "bytes_per_append": received / appends,
            "cpu_ms_per_append": cpu * seconds / appends * 1e3}  # fmt: skip


# In the page: the runs table is drawn and lists ``runs`` runs: every row, or (a paged table)
# its first page and a caption counting them all.
LISTED_JS = """(runs) => {
  const grids = [...document.querySelectorAll('[data-testid=stDataFrame] [aria-rowcount]')];
  if (grids.some(g => +g.getAttribute('aria-rowcount') >= runs + 1)) return true;
  const total = runs.toLocaleString('en-US');
  return grids.length > 0 && [...document.querySelectorAll('[data-testid=stCaptionContainer]')]
    .some(c => c.textContent.includes(`of ${total} runs`));
}"""


def rss_kb() -> tuple[int, int]:
    """This process's resident and peak resident memory, in KB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def memory_child(root: Path, store_file: Path | None, cache: bool) -> dict[str, float]:
    """One fresh store (``store_file``'s ``RunStore`` or today's) filling ``root``: times and memory."""
    module = None
    if store_file is not None:
        spec = importlib.util.spec_from_file_location("metrics_core.dashboard._bench_store", store_file)
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(module)
    from metrics_core.dashboard.store import run_store as store_module
    from metrics_core.read.column_cache import CachePolicy

    run_store = (module or store_module).RunStore
    cache_dir = Path(tempfile.mkdtemp(prefix="metrics_bench_cache_")) if cache else None
    store = run_store(root, cache=CachePolicy(cache_dir) if cache_dir else None)
    try:
        start = time.perf_counter()
        table = store.runs_table()
        listed = time.perf_counter() - start
        while (table["status"] == "loading").any():
            time.sleep(0.05)
            table = store.runs_table()
        filled = time.perf_counter() - start
        while store.loader.busy:  # it may still be releasing the last run it read
            time.sleep(0.01)
        rss, peak = rss_kb()
        held = (store.held_records() if hasattr(store, "held_records")
                else sum(entry.reader.records for entry in store._entries.values()))  # fmt: skip
        before = time.process_time()
        store.runs_table()
        idle_ms = (time.process_time() - before) * 1e3
        big = table.sort_values("last step", ascending=False)["run"].iloc[0]
        start = time.perf_counter()
        store.view(big)
        view_s = time.perf_counter() - start
        rss_viewed, _ = rss_kb()
    finally:
        store.close()
        if cache_dir is not None:
            shutil.rmtree(cache_dir)
    return {"runs": len(table), "records": int(table["last step"].count()), "listed_s": listed, "filled_s": filled,
            "rss_mb": rss / 1024, "peak_mb": peak / 1024, "held_records": held, "idle_overview_ms": idle_ms,
            "first_view_s": view_s, "rss_viewed_mb": rss_viewed / 1024}  # fmt: skip


def memory_rounds(root: Path, against: Path | None, rounds: int, cache: bool) -> None:
    """Alternating fresh processes: today's store and (``against``) another commit's."""
    variants = {"this": None, **({"against": against} if against else {})}
    for number in range(rounds):
        for label, store_file in variants.items():
            command = [sys.executable, __file__, "--memory-child", str(root)]
            command += ["--against", str(store_file)] if store_file else []
            command += ["--cache"] if cache else []
            found = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            print(f"round {number + 1}, {label:>7} store: {found['runs']} runs listed in "
                  f"{found['listed_s'] * 1e3:.0f} ms, filled in {found['filled_s']:.1f} s; "
                  f"RSS {found['rss_mb']:.0f} MB (peak {found['peak_mb']:.0f} MB), "
                  f"{found['held_records']:,} records held; runs page() {found['idle_overview_ms']:.1f} ms CPU; "
                  f"first view of a big run {found['first_view_s']:.2f} s, then RSS {found['rss_viewed_mb']:.0f} MB",
                  flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory", type=Path, help="measure the memory of listing this root (see the docstring)")
    parser.add_argument("--memory-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--against", type=Path, help="with --memory: another commit's store.py, measured alternately")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache", action="store_true", help="with --memory: stores keep a (fresh) columnar cache")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "metrics_bench_root1000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--browser", action="store_true")
    parser.add_argument("--settle", type=float, default=15.0, help="s after the first draw before the live "
                        "appends are measured (the loader reads every run meanwhile)")  # fmt: skip
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, args.against, args.cache)))
        return
    if args.memory:
        memory_rounds(args.memory, args.against, args.rounds, args.cache)
        return
    big = make_root(args.root)
    one = Path(tempfile.mkdtemp(prefix="metrics_bench_root1_"))
    small_run(one / LIVE / "metrics.jsonl", 10**6)
    writers = [LiveWriter(big / LIVE / "metrics.jsonl"), LiveWriter(one / LIVE / "metrics.jsonl")]
    for writer in writers:
        writer.start()
    try:
        results = {"1 run": store_figures(one, args.seconds), "1,000 runs": store_figures(big, args.seconds)}
        for label, found in results.items():
            print(f"store, {label:>10}: {found['runs']} listed in {found['listed_s'] * 1e3:.0f} ms, all rows read in "
                  f"{found['filled_s']:.2f} s; runs page() every 0.25 s: median {found['idle_cpu_ms']:.2f} ms CPU, "
                  f"mean {found['mean_cpu_ms']:.2f} ms")  # fmt: skip
        one_run, many = results["1 run"], results["1,000 runs"]
        print(f"ratio 1,000 runs / 1 run: listed {many['listed_s'] / one_run['listed_s']:.1f}x, "
              f"idle runs page() CPU {many['idle_cpu_ms'] / max(one_run['idle_cpu_ms'], 1e-3):.0f}x "
              f"(goals: listed within 2x of a 1-run root in the browser; idle refresh < 50 ms)")  # fmt: skip
        if args.browser:
            pages = {"1 run": browser_figures(one, 1, args.seconds, args.settle),
                     "1,000 runs": browser_figures(big, 1000, args.seconds, args.settle)}  # fmt: skip
            for label, found in pages.items():
                print(
                    f"browser, {label:>10}: table with every run drawn {found['shown_s']:.1f} s after opening "
                    f"the page (cold server); page open, the live run appending: server CPU "
                    f"{found['server_cpu_share']:.1%} of a core, per append {found['cpu_ms_per_append']:.1f} ms CPU "
                    f"and {found['bytes_per_append'] / 1e3:.1f} KB of websocket frames"
                )
            print(f"ratio 1,000 runs / 1 run: shown {pages['1,000 runs']['shown_s'] / pages['1 run']['shown_s']:.2f}x "
                  f"(goal <= 2x)")  # fmt: skip
    finally:
        for writer in writers:
            writer.stop.set()


if __name__ == "__main__":
    main()
