"""Side by side with TensorBoard and trackio on the same 1k-record run.

Run: python benchmarks/bench_rivals.py [--rounds 3] [--seconds 31] [--rivals-python /tmp/rivals/bin/python]
                                      [--before]

The rivals live in their own virtualenv, never in this project's requirements:

    python3 -m venv /tmp/rivals && /tmp/rivals/bin/pip install 'tensorboard==2.21.*' 'trackio==0.43.*'

Each round, for each tool in turn (the order rotates per round, so machine noise hits all alike):
fresh data in a fresh directory (``generate.write_run``: ~1k records in three sessions; the rivals
get the same steps and values — train loss, val loss, LR, grad norm avg/max, clipped fraction —
logged by their own client in a child process of the rivals' Python), a fresh server on a free
loopback port, a fresh headless Chromium (cold cache), then:

* ready: seconds from the server's start (its process spawned) to its first HTTP answer, the page
  navigated to just after.
* first chart: seconds from navigation to the first chart actually drawn, polled every 20 ms.
  "Drawn" per tool: ours a plotly ``.main-svg`` that is shown (plotly adds it when it plots: the
  live chart in Streamlit's page; ``bench_first_chart.py`` times its steps); trackio a
  vega-embed ``canvas.marks`` (vega-embed creates it rendering a spec that carries the data);
  TensorBoard a scalar card's ``line-chart`` canvas whose x axis reaches past step 1 (an empty
  chart's domain is [0, 1]).
* first load bytes: every HTTP response's encodedDataLength plus every websocket frame received,
  from navigation until 3 s after the first chart (``metrics_core.testing.live_server.Wire``).
* server CPU and RSS: with that tab open, a writer appends one record per second for
  ``--seconds``; CPU is utime+stime of the server's process tree (children included, exited ones
  too) over that wall time; RSS is the tree's resident set at the end.

Each tool polls at its fastest: ours at ``--refresh`` (0.5 s, the default) and again at 1 s,
trackio's page every 1 s (hard-coded for a local server), TensorBoard's server every 1 s
(``--reload_interval 1``) while its page reloads every 30 s (it refuses a shorter period).
A rival that cannot be installed or started is skipped with the reason; the others still run.

``--before`` adds "ours ... before": the same app.py served as plain Streamlit serves it
(``METRICS_SERVE_PLAIN=1``: no gzip of Streamlit's static files, no preload hint, no warm imports;
websocket compression off), in the same rounds, for a before/after of app.py's serving layer.
First-load bytes count websocket frames as decoded payload (CDP reports nothing else), so the
websocket compression's saving does not show in that column.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_live import server_pid
from metrics_core import MetricsWriter, RunContext, TrainingState
from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import CHART_SHOWN_JS, Wire, chromium, free_port, streamlit_server, wait_for_http

RUN = "bench"
RECORDS = 1000
VALUES = ("train_loss", "val_loss", "lr", "grad_norm_avg", "grad_norm_max", "clipped_fraction")
SETTLE_S = 3.0

DRAWN_JS = {
    "ours": CHART_SHOWN_JS,
    "trackio": "!!document.querySelector('.plot-container .vega-embed canvas.marks')",
    "tensorboard": """[...document.querySelectorAll('line-chart')].some(chart =>
        chart.querySelector('.series-view canvas') && [...chart.querySelectorAll('.x-axis text')]
            .some(tick => parseFloat(tick.textContent.replace(/,/g, '')) > 1))""",
}

# Run by the rivals' Python: log the run's values with the rival's own client, print "ready" once
# they are on disk, then log one more record (step + 10) per "append" line on stdin until EOF.
RIVAL_WRITER = r"""
import sqlite3, sys, time
import orjson
tool, source, target = sys.argv[1:4]
names = sys.argv[4].split(",")
if tool == "tensorboard":
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    writer = EventFileWriter(target)
    def log(values, step):
        summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
    def flush(count):
        writer.flush()
else:
    import trackio
    trackio.init(project="bench", name="bench")
    log = lambda values, step: trackio.log(values, step=step)
    def flush(count):  # trackio sends batches from a thread every 0.5 s: wait until all are in SQLite
        while True:
            try:
                with sqlite3.connect(f"file:{target}?mode=ro", uri=True) as db:
                    if db.execute("select count(*) from metrics").fetchone()[0] >= count:
                        return
            except sqlite3.Error:  # not created yet
                pass
            time.sleep(0.1)
logged, step = 0, 0
for line in open(source, "rb"):
    record = orjson.loads(line)
    values = {k: float(record[k]) for k in names if k in record}
    if values:
        log(values, record["step"])
        logged, step = logged + 1, record["step"]
flush(logged)
print("ready", flush=True)
for line in sys.stdin:
    step += 10
    log({"train_loss": 2.0 + 1.0 / step, "lr": 3e-4, "grad_norm_avg": 0.8, "grad_norm_max": 1.4,
         "clipped_fraction": 0.1}, step)
    logged += 1
    flush(logged)
if tool == "trackio":
    trackio.finish()
"""


@dataclass
class Figures:
    """One tool, one round."""

    ready_s: float
    first_chart_s: float
    first_load_bytes: int
    cpu_share: float
    rss_bytes: int


# -- a server's process tree from /proc ------------------------------------------------------------


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (TensorBoard starts a data server child, Streamlit none)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        found.append(current := todo.pop())
        todo.extend(children.get(current, []))
    return found


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of the tree, with what exited children left in their parents' cutime + cstime."""
    total = 0
    for member in tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(field) for field in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def tree_rss(pid: int) -> int:
    total = 0
    for member in tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total


# -- each tool's data, writer and server -------------------------------------------------------------


PLAIN_STREAMLIT = {"METRICS_SERVE_PLAIN": "1", "STREAMLIT_SERVER_ENABLE_WEBSOCKET_COMPRESSION": "false"}


@contextmanager
def environ(changes: dict[str, str]) -> Iterator[None]:
    """``changes`` in os.environ (which the server inherits) for the block, then as they were."""
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Ours:
    """Our dashboard at one refresh period; ``serve`` yields (page URL, server pid, append one record)
    and leaves in ``ready_s`` how long its server took to answer.  ``plain``: served as plain
    Streamlit serves it (app.py without its serving layer)."""

    def __init__(self, refresh: float, *, plain: bool = False) -> None:
        self.name = f"ours {refresh:g} s" + (", plain serving" if plain else "")
        self.refresh, self.drawn_js, self.env = refresh, DRAWN_JS["ours"], PLAIN_STREAMLIT if plain else {}

    @contextmanager
    def serve(self, directory: Path) -> Iterator[tuple[str, int, Callable[[], None]]]:
        path = directory / RUN / "metrics.jsonl"
        write_run(path, RECORDS)
        last = orjson.loads(path.read_bytes().splitlines()[-1])
        state = TrainingState(step=last["step"], tokens_seen=last["tokens_seen"])
        with MetricsWriter(RunContext(path.parent, RUN, "live")) as writer:

            def append() -> None:
                state.step += 10
                writer.write("train", state, train_loss=2.0 + 1.0 / state.step, lr=3e-4, grad_norm_avg=0.8,
                             grad_norm_max=1.4, clipped_fraction=0.1)  # fmt: skip

            append()  # the live session has started before the page opens, as on a real cluster
            started = time.monotonic()
            with environ(self.env), streamlit_server(directory, refresh=self.refresh) as url:
                self.ready_s = time.monotonic() - started
                yield f"{url}/run?run={RUN}", server_pid(url), append


class Rival:
    """TensorBoard or trackio, run by the rivals' own Python; ``serve`` as ``Ours.serve``."""

    def __init__(self, name: str, python: str, version: str) -> None:
        self.name, self.python, self.version, self.drawn_js = name, python, version, DRAWN_JS[name]

    @contextmanager
    def serve(self, directory: Path) -> Iterator[tuple[str, int, Callable[[], None]]]:
        source = directory / "ours.jsonl"
        write_run(source, RECORDS)
        port = free_port()
        env = {**os.environ, "TRACKIO_DIR": str(directory / "trackio")}
        if self.name == "tensorboard":
            target, url = directory / "tb" / RUN, f"http://127.0.0.1:{port}/"
            command = [self.python, "-m", "tensorboard.main", "--logdir", str(directory / "tb"), "--host", "127.0.0.1",
                       "--port", str(port), "--reload_interval", "1"]  # fmt: skip
        else:
            target, url = directory / "trackio" / "bench.db", f"http://127.0.0.1:{port}/?project=bench"
            command = [self.python, "-c", "import sys, trackio; trackio.show(project='bench', open_browser=False, "
                       "block_thread=True, server_port=int(sys.argv[1]))", str(port)]  # fmt: skip
        writer = subprocess.Popen(
            [self.python, "-c", RIVAL_WRITER, self.name, str(source), str(target), ",".join(VALUES)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
        server = None
        with tempfile.TemporaryFile() as log:
            try:
                if "ready\n" not in iter(writer.stdout.readline, ""):  # the client may print first
                    raise RuntimeError(f"{self.name}'s writer failed (exit code {writer.wait()})")
                started = time.monotonic()
                server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)  # fmt: skip
                wait_for_http(url, server, log, what=self.name)
                self.ready_s = time.monotonic() - started

                def append() -> None:
                    writer.stdin.write("append\n")
                    writer.stdin.flush()

                yield url, server.pid, append
            finally:
                writer.stdin.close()
                writer.wait(timeout=30)
                if server is not None:
                    os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and its children only
                    try:
                        server.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        os.killpg(server.pid, signal.SIGKILL)
                        server.wait()


Tool = Ours | Rival


def rival_version(python: str, module: str) -> tuple[str | None, str]:
    """The rival's version, or None and why it cannot run here."""
    if not Path(python).exists():
        return None, f"no Python at {python} (see this module's docstring to install the rivals)"
    found = subprocess.run([python, "-c", f"import {module}; print({module}.__version__)"], capture_output=True,
                           text=True)  # fmt: skip
    if found.returncode:
        return None, f"cannot import {module} in {python}: {found.stderr.strip().splitlines()[-1:]}"
    return found.stdout.strip(), ""


# -- one measurement ---------------------------------------------------------------------------------


def measure(tool: Tool, seconds: float) -> tuple[Figures, str]:
    """The tool's figures, and what weighed most in its first load."""
    with tempfile.TemporaryDirectory() as tmp, tool.serve(Path(tmp)) as (url, pid, append), chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        wire = Wire(context, page)
        start = time.monotonic()
        page.goto(url, wait_until="commit")
        while not page.evaluate(tool.drawn_js):
            if time.monotonic() - start > 180:
                raise RuntimeError(f"{tool.name}: no chart drawn within 180 s")
            page.wait_for_timeout(20)
        first_chart = time.monotonic() - start
        page.wait_for_timeout(SETTLE_S * 1000)
        first_load = wire.total
        weights = heaviest(wire)
        cpu, wall = tree_cpu_seconds(pid), time.monotonic()
        appends = 0
        while time.monotonic() - wall < seconds:
            append()
            appends += 1
            page.wait_for_timeout(max(0.0, wall + appends - time.monotonic()) * 1000)
        cpu_share = (tree_cpu_seconds(pid) - cpu) / (time.monotonic() - wall)
        rss = tree_rss(pid)
        context.close()
    return Figures(tool.ready_s, first_chart, first_load, cpu_share, rss), weights


def heaviest(wire: Wire, count: int = 3) -> str:
    """The ``count`` largest HTTP responses by file name, and the websocket's share."""
    sizes = sorted(((n, urlsplit(url).path[-40:]) for url, n in wire.http.items()), reverse=True)
    return (
        ", ".join(f"{name} {n / 1e3:.0f} KB" for n, name in sizes[:count]) + f", websocket {wire.frames / 1e3:.0f} KB"
    )


def load() -> str:
    return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3]) + f" on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--seconds", type=float, default=31, help="live window per tool (covers one TensorBoard page reload)"
    )
    parser.add_argument("--refresh", type=float, default=0.5, help="our refresh; 1 s is measured too")
    parser.add_argument("--rivals-python", default="/tmp/rivals/bin/python")
    parser.add_argument("--before", action="store_true", help="also ours served as plain Streamlit serves it")
    args = parser.parse_args()
    tools: list[Tool] = [Ours(args.refresh), Ours(1.0)] + ([Ours(args.refresh, plain=True)] if args.before else [])
    for name in ("tensorboard", "trackio"):
        version, why = rival_version(args.rivals_python, name)
        if version is None:
            print(f"skipping {name}: {why}")
        else:
            print(f"{name} {version} ({args.rivals_python})")
            tools.append(Rival(name, args.rivals_python, version))
    print(f"start: {load()}")
    results: dict[str, list[Figures]] = {tool.name: [] for tool in tools}
    for number in range(args.rounds):
        order = tools[number % len(tools) :] + tools[: number % len(tools)]
        for tool in order:
            try:
                found, weights = measure(tool, args.seconds)
            except Exception as exc:  # a rival failing is a finding to print, not a crash
                print(f"round {number + 1}: {tool.name} failed: {exc}")
                continue
            results[tool.name].append(found)
            print(f"round {number + 1}: {tool.name:>17}: ready {found.ready_s:.2f} s, first chart "
                  f"{found.first_chart_s:.2f} s, first load "
                  f"{found.first_load_bytes / 1e6:.2f} MB, CPU {found.cpu_share:.1%}, "
                  f"RSS {found.rss_bytes / 1e6:.0f} MB  ({load()})\n{'':>27}heaviest: {weights}")  # fmt: skip
    print(f"end: {load()}")
    report(results, tools)


def report(results: dict[str, list[Figures]], tools: list[Tool]) -> None:
    """Medians per tool, and ours (default refresh) over each rival: < 1 is better for us."""
    medians = {
        name: Figures(*(statistics.median(getattr(f, field) for f in found) for field in Figures.__dataclass_fields__))
        for name, found in results.items()
        if found
    }
    print(f"\nmedians over {max(map(len, results.values()))} rounds")
    print(f"{'tool':>17} | ready | first chart | first load | CPU per live tab | RSS")
    for name, m in medians.items():
        print(f"{name:>17} | {m.ready_s:3.2f} s | {m.first_chart_s:9.2f} s | {m.first_load_bytes / 1e6:7.2f} MB"
              f" | {m.cpu_share:14.1%} | {m.rss_bytes / 1e6:.0f} MB")  # fmt: skip
    ours = medians.get(tools[0].name)
    if ours is None:
        return
    for rival in (name for name in medians if not name.startswith("ours") or name.endswith(" before")):
        theirs = medians[rival]
        ratios = {field: ratio(getattr(ours, field), getattr(theirs, field)) for field in Figures.__dataclass_fields__}
        print(f"{tools[0].name} / {rival}: ready {ratios['ready_s']}, first chart {ratios['first_chart_s']}, "
              f"first load {ratios['first_load_bytes']}, CPU {ratios['cpu_share']}, "
              f"RSS {ratios['rss_bytes']}")  # fmt: skip


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "inf (theirs measured 0)"


if __name__ == "__main__":
    main()
