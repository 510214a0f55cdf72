"""Many viewers of one live run: server CPU and write -> visible latency for 1, 5 and 20 sessions.

Run: python benchmarks/bench_viewers.py [--viewers 1 5 20] [--appends 15] [--refresh 0.5] [--history 0]
                                        [--keys 0] [--baseline <git rev>]

Each viewer is a websocket session speaking Streamlit's own protocol, as a browser tab does: it
asks for ``/run?run=live``, and reruns the live fragment every time the server's ``auto_rerun``
message says to (the browser's timer) or, where the page mounts ``push``'s watch instead, as
its script does: a long poll of the URL the watch element carries, with the figure each chart
holds where the page is fed by the route (``feed``); an answer that carries the charts'
payloads is applied as they are (each chart then holds the payload's figure), any other answer
that names a newer snapshot reruns the fragment (the element's trigger).  Nothing is drawn on the client,
so the machine's cores go to the server.  A real ``MetricsWriter`` appends a record every 1.3 s, out of phase with the
refresh; a record is visible to a viewer when a message or an answer it received carries the record's step
(steps are nine-digit numbers no other text on the page holds).  Server CPU is utime + stime of
the ``streamlit run`` process from ``/proc``, as a share of one core, over the appends; "refreshes"
counts the fragment runs each viewer got per second (a server that falls behind drops them).
``--keys N``: every record also logs N numbers of the user's (``k/000`` ...), as ``bench_live.py --keys``.

``--baseline REV`` measures the same at git revision REV (its files in a temporary directory) too, interleaved
viewer count by viewer count with the tree under test, so machine noise hits both alike; the
ratios to one viewer are the figures to compare (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.bench_live import cpu_seconds, live_run, server_pid
from benchmarks.timing import percentile
from metrics_core import MetricsWriter, TrainingState
from metrics_core.testing.live_server import ACCESS_TOKEN, REPO, streamlit_app

FIRST_STEP = 10**8  # nine digits: a step's text appears in a message only where the record is drawn
WATCH_COMPONENT = "metrics_live_watch"  # live_push's element, where the page has it
CHART_COMPONENT = "metrics_live_chart"  # live_chart's element: its payload's seq is the figure the chart holds
OWNER = {"Authorization": f"Bearer {ACCESS_TOKEN}"}  # the token the server asks for
_LONG_POLLS = ThreadPoolExecutor(64)  # one waiting request per viewer


def _get(url: str) -> bytes:
    request = urllib.request.Request(url, headers=OWNER)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.read()


async def _viewer(url: str, seen: dict[int, float], refreshes: list[int], stop: asyncio.Event) -> None:
    """One tab's session: open the run page, rerun the fragment as the server's auto_rerun says,
    note when each watched step first arrives."""
    from streamlit.components.v2.bidi_component.main import _make_trigger_id
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ClientState_pb2 import ClientState
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from streamlit.proto.WidgetStates_pb2 import WidgetState, WidgetStates
    from websockets.asyncio.client import connect

    async with connect(f"ws://{url.split('://', 1)[1]}/_stcore/stream", subprotocols=["streamlit"],
                       max_size=None, additional_headers=OWNER) as ws:  # fmt: skip
        await ws.send(BackMsg(rerun_script=ClientState(query_string="run=live", page_name="run")).SerializeToString())
        page_hash, timers = "", []

        async def rerun_every(interval: float, fragment: str) -> None:
            while not stop.is_set():
                await asyncio.sleep(interval)
                state = ClientState(query_string="run=live", page_script_hash=page_hash, fragment_id=fragment,
                                    is_auto_rerun=True)  # fmt: skip
                await ws.send(BackMsg(rerun_script=state).SerializeToString())

        watch: dict = {}  # the watch element's url, id, fragment and retry period, as last drawn
        held: dict[str, int] = {}  # chart element key -> the figure it holds

        async def rerun(serial: int, current: str) -> None:
            """The watch element's trigger: rerun the fragment, saying what each chart holds; wait as
            the script does, until the rerun mounts the next URL, at most STALL_MS."""
            payload = json.dumps([{"event": "changed", "value": {"serial": serial, "held": held}}])
            trigger = WidgetState(id=_make_trigger_id(watch["id"], "events"), json_trigger_value=payload)
            state = ClientState(query_string="run=live", page_script_hash=page_hash, fragment_id=watch["fragment"],
                                widget_states=WidgetStates(widgets=[trigger]))  # fmt: skip
            await ws.send(BackMsg(rerun_script=state).SerializeToString())
            for _ in range(600):
                if watch["url"] != current or stop.is_set():
                    break
                await asyncio.sleep(0.05)

        async def follow() -> None:
            """What live_watch.js does: long-poll the drawn snapshot's URL (with what each chart holds,
            where the page is fed); apply the charts' payloads, or rerun the fragment when newer."""
            loop = asyncio.get_running_loop()
            seen_serial, current = 0, None
            while not stop.is_set():
                if watch["url"] != current:
                    current = watch["url"]
                    seen_serial = int(parse_qs(urlsplit(current).query)["seen"][0])
                query = parse_qs(urlsplit(current).query) | {"seen": [str(seen_serial)]}
                fed = "sig" in query
                if fed:
                    query["held"] = [json.dumps(held)]
                asked = f"{urlsplit(current).path}?{urlencode(query, doseq=True)}"
                try:
                    body = await loop.run_in_executor(_LONG_POLLS, _get, url + asked)
                except OSError:
                    body = b""
                answer = json.loads(body) if body else {}
                if watch["url"] != current:
                    continue  # a rerun drew a newer snapshot meanwhile
                now = time.time() * 1000
                fresh = answer.get("serial", 0) > seen_serial
                if fresh and fed and "charts" in answer:
                    packed = [step for payload in answer["charts"].values() for step in _packed_steps(payload)]
                    for step in [*_steps_in(body), *packed]:
                        seen.setdefault(step, now)
                    held.update({key: payload["seq"] for key, payload in answer["charts"].items()})
                    seen_serial = answer["serial"]
                    details_due = time.monotonic() - watch["drawn_at"] > watch["details_s"]
                    if answer.get("details") != watch["details"] and details_due:
                        await rerun(answer["serial"], current)
                elif fresh:
                    await rerun(answer["serial"], current)
                elif not answer:
                    await asyncio.sleep(watch["retry"])

        try:
            while not stop.is_set():
                try:
                    frame = await asyncio.wait_for(ws.recv(), timeout=0.5)
                except TimeoutError:
                    continue
                now = time.time() * 1000
                message = ForwardMsg()
                message.ParseFromString(frame)
                kind = message.WhichOneof("type")
                if message.metadata.active_script_hash:
                    page_hash = message.metadata.active_script_hash
                if kind == "auto_rerun" and not timers:
                    timers.append(asyncio.create_task(rerun_every(message.auto_rerun.interval,
                                                                  message.auto_rerun.fragment_id)))  # fmt: skip
                elif kind == "script_finished":
                    refreshes[0] += 1
                elif kind == "delta" and message.delta.new_element.bidi_component.component_name.endswith(
                    WATCH_COMPONENT
                ):
                    element = message.delta.new_element.bidi_component
                    data = json.loads(element.json)
                    if data["url"] != watch.get("url"):
                        watch["drawn_at"] = time.monotonic()
                    watch.update(url=data["url"], id=element.id, fragment=message.delta.fragment_id,
                                 retry=data["retry_ms"] / 1000, details=data.get("details"),
                                 details_s=data.get("details_ms", 0) / 1000)  # fmt: skip
                    if not timers:
                        timers.append(asyncio.create_task(follow()))
                elif kind == "delta" and message.delta.new_element.bidi_component.component_name.endswith(
                    CHART_COMPONENT
                ):
                    data = json.loads(message.delta.new_element.bidi_component.json)
                    if "key" in data:
                        held[data["key"]] = data["seq"]
                    for step in [*_steps_in(frame), *_packed_steps(data)]:
                        seen.setdefault(step, now)
                elif kind == "delta" and b"1000" in frame:
                    for step in _steps_in(frame):
                        seen.setdefault(step, now)
        finally:
            for timer in timers:
                timer.cancel()


def _steps_in(frame: bytes) -> list[int]:
    """The nine-digit steps from ``FIRST_STEP`` on that ``frame`` holds as text."""
    found, start = [], 0
    prefix = str(FIRST_STEP)[:3].encode()
    while (at := frame.find(prefix, start)) >= 0:
        digits = frame[at : at + 9]
        start = at + 1
        if digits.isdigit() and not frame[at + 9 : at + 10].isdigit() and not frame[at - 1 : at].isdigit():
            found.append(int(digits))
    return found


def _packed_steps(payload: dict) -> list[int]:
    """The steps from ``FIRST_STEP`` on that a whole figure's x arrays hold: plotly.py's packing
    (base64 of the array's bytes, ``figure_dicts.typed_array``) hides them from ``_steps_in``."""
    if payload.get("op") != "full":
        return []
    steps = []
    for trace in json.loads(payload["figure"])["data"]:
        x = trace.get("x")
        if isinstance(x, dict) and x.get("dtype") in _DTYPES:
            values = np.frombuffer(base64.b64decode(x["bdata"]), dtype=_DTYPES[x["dtype"]])
            steps.extend(int(v) for v in values if v >= FIRST_STEP and float(v).is_integer())
        elif isinstance(x, list):
            steps.extend(int(v) for v in x if isinstance(v, (int, float)) and v >= FIRST_STEP)
    return steps


_DTYPES = {"i4": np.int32, "u4": np.uint32, "f8": np.float64, "f4": np.float32}


def logged(step: int, keys: int) -> dict[str, float]:
    """``keys`` numbers of the user's for the record of ``step``."""
    return {f"k/{n:03}": float(step % 97 + n) for n in range(keys)}


async def _measure(
    url: str,
    viewers: int,
    appends: int,
    writer: MetricsWriter,
    state: TrainingState,
    profile: tuple[str, Path] | None,
    keys: int = 0,
) -> dict:
    stop = asyncio.Event()
    seen: list[dict[int, float]] = [{} for _ in range(viewers)]
    refreshes = [[0] for _ in range(viewers)]
    tasks = [asyncio.create_task(_viewer(url, seen[n], refreshes[n], stop)) for n in range(viewers)]
    await asyncio.sleep(8 + viewers * 0.5)  # every session's first full run
    pid = server_pid(url)
    written: dict[int, float] = {}
    counted = [count[0] for count in refreshes]
    if profile is not None:  # py-spy's collapsed stacks of the server over the appends
        spy, out = profile
        subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(round(1.3 * appends + 3)),
                          "--format", "raw", "--nonblocking", "--output", str(out)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)  # fmt: skip
    cpu, wall = cpu_seconds(pid), time.monotonic()
    for number in range(appends):
        state.step = FIRST_STEP + 1000 + 10 * number
        writer.write("train", state, train_loss=0.5, **logged(state.step, keys))
        written[state.step] = time.time() * 1000
        await asyncio.sleep(1.3)
    await asyncio.sleep(3)
    elapsed = time.monotonic() - wall
    cpu_share = (cpu_seconds(pid) - cpu) / elapsed
    rate = statistics.mean((count[0] - before) / elapsed for count, before in zip(refreshes, counted, strict=True))
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    # A record a viewer never got counts as later than any it got: the median and p95 are over all.
    delays = sorted(view[step] - at if step in view else float("inf") for view in seen for step, at in written.items())
    missing = sum(step not in view for view in seen for step in written)
    return {"cpu": cpu_share, "delays": delays, "missing": missing, "refreshes": rate}


def measure(
    repo: Path,
    viewers: int,
    *,
    appends: int,
    refresh: float,
    history: int,
    keys: int = 0,
    profile: tuple[str, Path] | None = None,
) -> dict:
    """``viewers`` sessions on one live run served from the tree ``repo``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = live_run(root, history)
        state = TrainingState()
        app = (repo / "app.py", "--runs", str(root), "--refresh", str(refresh))
        with streamlit_app(*app, repo=repo) as url, MetricsWriter(run) as writer:
            for step in range(FIRST_STEP, FIRST_STEP + 100, 10):
                state.step = step
                writer.write("train", state, train_loss=1.0 / (step - FIRST_STEP + 10), **logged(step, keys))
            return asyncio.run(_measure(url, viewers, appends, writer, state, profile, keys))


@contextmanager
def tree_of(rev: str) -> Iterator[Path]:
    """The files of git revision ``rev`` in a temporary directory (``git archive``: no worktree to clean up)."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


def ms(delay: float) -> str:
    return "never (not within the run)" if delay == float("inf") else f"{delay:.0f} ms"


def report(label: str, results: dict[int, dict]) -> None:
    one = results[min(results)]
    for viewers, found in results.items():
        delays = found["delays"]
        latency = f"median {ms(percentile(delays, 0.5))}, p95 {ms(percentile(delays, 0.95))}"
        ratios = ""
        if viewers != min(results):
            slower = percentile(delays, 0.5) / percentile(one["delays"], 0.5)
            ratios = (f"; ÷ {min(results)} viewer: CPU {found['cpu'] / one['cpu']:.2f}×, latency median "
                      f"{slower:.2f}×")  # fmt: skip
        missing = f" ({found['missing']} never seen)" if found["missing"] else ""
        print(f"{label:>9} {viewers:>3} viewer(s): server CPU {found['cpu']:.1%} of a core; write -> visible "
              f"{latency}{missing}; {found['refreshes']:.2f} refreshes/s per viewer{ratios}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--appends", type=int, default=15)
    parser.add_argument("--refresh", type=float, default=0.5)
    parser.add_argument("--history", type=int, default=0, help="records the run holds before the appends")
    parser.add_argument("--keys", type=int, default=0, help="numbers of the user's each record logs besides")
    parser.add_argument("--baseline", help="git revision to measure side by side (e.g. main)")
    parser.add_argument("--py-spy", help="path of py-spy: write the server's stacks to viewers-<label>-<n>.txt")
    args = parser.parse_args()
    with tree_of(args.baseline) if args.baseline else nullcontext() as baseline:
        trees = {"this tree": REPO} | ({args.baseline: baseline} if baseline else {})
        results: dict[str, dict[int, dict]] = {label: {} for label in trees}
        for viewers in args.viewers:
            for label, repo in trees.items():
                out = Path(f"viewers-{label.replace(' ', '_')}-{viewers}.txt")
                profile = (args.py_spy, out) if args.py_spy else None
                results[label][viewers] = measure(repo, viewers, appends=args.appends, refresh=args.refresh,
                                                  history=args.history, keys=args.keys, profile=profile)  # fmt: skip
                report(label, {viewers: results[label][viewers]})  # as it comes: a long run shows progress
    print("side by side:")
    for label, found in results.items():
        report(label, found)


if __name__ == "__main__":
    main()
