"""Plain helpers shared by the tests: record and run builders, hostile lines, the reader snapshot.

Fixtures live in the ``conftest.py`` of the tier that uses them (shared ones in ``tests/conftest.py``)
and are used by name; helpers live here and are imported (``from tests.support import small_run``),
so that no test module imports another.  What benchmarks use as well lives in ``metrics_core/testing/`` (servers
and Chromium, buckets and their emulators, hand-crafted and generated runs), imported from there.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from metrics_core.testing.buckets import BUCKET, CountingProxy, bucket_run, put_object
from metrics_core.testing.records import base_record, line

if TYPE_CHECKING:
    from pyarrow import fs as pafs
    from streamlit.testing.v1 import AppTest

    from metrics_core.read.run_digest import RunDigest
    from metrics_core.read.run_reader import RunReader

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "app.py")
# The browser tier's window: a laptop's, tall enough that a run page's first charts are in view.
DESKTOP = {"width": 1400, "height": 1100}


# -- records and files ---------------------------------------------------------------------------


T = TypeVar("T")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coroutine)`` in a thread of its own: Playwright's sync API keeps an event loop
    running in the thread of any browser test, and a test may run after one in the same process."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def read_records(path: Path) -> list[dict]:
    """Parse every complete line of a metrics file (fails the test on any bad line)."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "file must end on a record boundary"
    return [orjson.loads(line) for line in data.splitlines()]


def read_run(path: Path) -> RunReader:
    """A reader of the run at ``path`` (its directory or its metrics file) that has read every complete line."""
    from metrics_core.read.run_reader import RunReader

    reader = RunReader(path)
    reader.refresh()
    return reader


def readme_python(containing: str) -> str:
    """The README's one fenced Python block that contains ``containing``, as written (a snippet
    test runs the documented code itself, so README and test cannot drift apart)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]
    (block,) = [block for block in blocks if containing in block]
    return block


def spawn_python(code: str, *args: str) -> subprocess.Popen:
    """Start a real Python child process running ``code`` with line-buffered pipes."""
    return subprocess.Popen(
        [sys.executable, "-u", "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def interruptible() -> None:
    """``preexec_fn`` of a child a test stops with SIGINT: restores SIGINT's default first.  A shell
    that starts the suite in the background without job control (``(pytest &)``) leaves SIGINT
    ignored, every child inherits that, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def without_permission_override() -> list[str]:
    """A command prefix under which a process is refused what file modes refuse.  Root reads a
    chmod 000 directory anyway (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), and the tests run as root:
    ``setpriv`` drops both from the bounding set, so the process keeps uid 0 (and root's own files,
    the interpreter under /root among them) but not the override.  Anyone else needs no prefix."""
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []


def append_bytes(path: Path, data: bytes) -> None:
    """Append raw bytes, as a (possibly misbehaving) trainer would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as out:
        out.write(data)


def append_records(path: Path, *records: dict) -> None:
    append_bytes(path, b"".join(orjson.dumps(r) + b"\n" for r in records))


def snapshot(reader: RunReader) -> dict[str, Any]:
    """Everything a page or the CLI can ask of a reader, as plain comparable values (never raises)."""
    frames = {}
    for event in reader.events:
        frame = reader.frame(event)
        frames[event] = {
            name: (
                str(column.dtype),
                [None if isinstance(v, float) and math.isnan(v) else v for v in column.astype(object).tolist()],
            )
            for name, column in frame.items()
        }
        frames[event]["time"] = ("ns", frame["time"].astype("int64").tolist())
        frames[event]["__superseded"] = ("bool", reader.superseded(event).tolist())
        frames[event]["__effective"] = ("int", len(reader.effective(event)))
    return {
        "records": reader.records,
        "bad": [(bad.line, bad.reason) for bad in reader.bad_line_samples],
        "bad_lines": reader.bad_lines,
        "frames": frames,
        "sessions": reader.sessions,
        "pending": reader.pending_bytes,
        "versions": reader.schema_versions,
    }


def same_story(remote: RunReader | RunDigest, local: RunReader | RunDigest) -> None:
    """Refresh both readers and check they tell the same story of a run: records, sessions, lost work."""
    assert remote.refresh() == local.refresh()
    assert remote.sessions == local.sessions
    assert remote.lost_work() == local.lost_work()
    assert remote.records == local.records
    assert remote.pending_bytes == local.pending_bytes


def upload(filesystem: pafs.FileSystem, key: str, data: bytes) -> None:
    """Replace the whole object at ``key`` of the test bucket, as ``aws s3 cp`` does."""
    with filesystem.open_output_stream(f"{BUCKET}/{key}") as out:
        out.write(data)


# -- runs ----------------------------------------------------------------------------------------


def small_run(path: Path) -> None:
    """One session of 50 train records, a window every 10 steps to step 500, the loss falling as 5/step."""
    append_records(path, *(base_record(s, train_loss=5.0 / s) for s in range(10, 501, 10)))


def three_session_run(path: Path) -> None:
    """s1: steps 0..100, crash; s2 resumes at 60 (..150); s3 resumes at 120 (..200). Windows every 10."""
    for session, start, end, resumed in (("s1", 0, 100, None), ("s2", 60, 150, 60), ("s3", 120, 200, 120)):
        records = [
            base_record(
                start,
                event="session_start",
                session=session,
                discarded_bytes=0 if resumed is None else 17,
                resumed_from_step=resumed,
            )
        ]
        for step in range(start + 10, end + 1, 10):
            records.append(base_record(step, session=session, train_loss=10.0 / step, tokens=1000))
            if step % 50 == 0:
                records.append(base_record(step, event="validation", session=session, val_loss=20.0 / step))
        append_records(path, *records)


def rank_window(step: int, *, session: str = "s1", slowest: int = 3, lockstep: bool = True, **values: object) -> dict:
    """A train record as DistributedWindow writes it on a 4-rank job: rank 0.10 s, the slowest 0.10–0.16 s."""
    fields = {"train_loss": 1.0 / step, "world_size": 4, "slowest_rank": slowest, "rank_step_time_min_s": 0.1,
              "rank_step_time_max_s": 0.1 + 0.01 * (step // 10 % 7), "rank_tokens_per_s_min": 900.0,
              "rank_tokens_per_s_max": 1000.0, "ranks_in_lockstep": lockstep}  # fmt: skip
    return base_record(step, session=session, **{**fields, **values})


def distributed_run(path: Path) -> None:
    """Two sessions of a 4-rank job (S2 resumes at 60); the window at step 50 had ranks out of lockstep."""
    append_records(path, *(rank_window(s, lockstep=s != 50) for s in range(10, 101, 10)))
    append_records(path, base_record(60, event="session_start", session="s2"))
    append_records(path, *(rank_window(s, session="s2", slowest=1) for s in range(70, 151, 10)))


def eight_sessions(path: Path) -> None:
    """Eight sessions, each resumed 20 steps after the previous one started; the last runs to step 2000."""
    for index in range(8):
        start = index * 20
        append_records(path, base_record(start, event="session_start", session=f"s{index}"))
        end = start + 20 if index < 7 else 2000
        append_records(path, *(base_record(s, session=f"s{index}", train_loss=2.0 + 8.0 / s, tokens=100,
                                           lr=2.5e-4, clipped_fraction=0.1, grad_norm_avg=1.0)
                               for s in range(start + 1, end + 1)))  # fmt: skip


def cold_root(root: Path, *, small: int, big: int, big_records: int) -> None:
    """``small`` runs of 50 records (``small000``…) and ``big`` runs of ``big_records`` (``big0``…, ~250 B
    each: read by the store's loader, last) whose last records are an hour newer, so they lead the table
    once the loader peeked at their tails."""
    for number in range(small):
        append_records(root / f"small{number:03d}" / "metrics.jsonl",
                       *(base_record(s, train_loss=1.0 / s) for s in range(10, 510, 10)))  # fmt: skip
    newest = "2026-11-29T11:00:00.000000+00:00"
    lines = b"".join(orjson.dumps(base_record(s, session="big", train_loss=1.0, time=newest)) + b"\n"
                     for s in range(1, big_records + 1))  # fmt: skip
    for number in range(big):
        (root / f"big{number}").mkdir()
        (root / f"big{number}" / "metrics.jsonl").write_bytes(lines)


# -- hostile lines: each class the adversarial review found --------------------------------------

HOSTILE = {
    "step 2^63": line(base_record(5) | {"step": 1 << 63}),
    "tokens_seen 2^63": line(base_record(5) | {"tokens_seen": 1 << 63}),
    "skipped_updates 2^64-1": line(base_record(5) | {"skipped_updates": (1 << 64) - 1}),
    "schema_version 2^63": line(base_record(5) | {"schema_version": 1 << 63}),
    "step -2^63-1": line(base_record(5) | {"step": -(1 << 63) - 1}),
    "step 1e400": line(base_record(5))[:-1].replace(b'"step":5', b'"step":1e400') + b"\n",
    "year 1500": line(base_record(5) | {"time": "1500-01-01T00:00:00+00:00"}),
    "year 2263": line(base_record(5) | {"time": "2263-01-01T00:00:00+00:00"}),
    "year 2300": line(base_record(5) | {"time": "2300-06-01T00:00:00+00:00"}),
    "year 9999": line(base_record(5) | {"time": "9999-12-31T23:59:59.999999+00:00"}),
    "hour 24 in the writer's shape": line(base_record(5) | {"time": "2026-11-29T24:00:00.000000+00:00"}),
    "second 60 in the writer's shape": line(base_record(5) | {"time": "2026-11-29T10:00:60.000000+00:00"}),
    "Arabic-Indic digit, writer's shape": line(base_record(5) | {"time": "2026-11-29T10:00:0\u0665.000000+00:00"}),
    "year 1 at +14:00": line(base_record(5) | {"time": "0001-01-01T00:00:00+14:00"}),
    "NaN literal": line(base_record(5, train_loss=1.0)).replace(b'"train_loss":1.0', b'"train_loss":NaN'),
    "Infinity literal": line(base_record(5, train_loss=1.0)).replace(b'"train_loss":1.0', b'"train_loss":Infinity'),
    "invalid UTF-8": line(base_record(5, note="ab")).replace(b'"ab"', b'"a\xff\xfeb"'),
    "lone surrogate": line(base_record(5, note="ab")).replace(b'"ab"', b'"\\ud800"'),
    "repeated event": line(base_record(5))[:-2] + b',"event":"validation"}\n',
    "repeated step, escaped": line(base_record(5))[:-2] + b',"\\u0073tep":6}\n',
    "10k-deep nesting": line(base_record(5))[:-2] + b',"x":' + b"[" * 10_000 + b"]" * 10_000 + b"}\n",
    "50k fields": line({**base_record(5), **{f"k{i}": i for i in range(50_000)}}),
    "2 MB line": line(base_record(5, note="x" * (2 << 20))),
    "not an object": b"[1, 2, 3]\n",
    # Two objects on one line and a blank line: as many rows as lines, yet not one record per line.
    "two records on one line, then a blank line": line(base_record(5))[:-1] + line(base_record(5)) + b"\n",
    "2k-deep object nesting": line(base_record(5))[:-2] + b',"x":' + b'{"a":' * 2_000 + b"1" + b"}" * 2_000 + b"}\n",
    "random bytes": bytes(range(256)).replace(b"\n", b"") + b"\n",
}


def three_bucket_runs(filesystem: pafs.FileSystem, scheme: str, path: Path) -> bytes:
    """Under ``exp/`` of the test bucket: a finished run ``done``, a live one ``live`` and
    ``synced``, the three-session run written to ``path`` and uploaded by ``sync``; the live run's bytes."""
    from metrics_core.buckets.addresses import parse_bucket_url
    from metrics_core.buckets.sync import RunSync

    put_object(filesystem, "exp/done/metrics.jsonl", bucket_run(live=False))
    data = bucket_run(live=True)
    put_object(filesystem, "exp/live/metrics.jsonl", data)
    three_session_run(path)
    RunSync(parse_bucket_url(f"{scheme}://{BUCKET}/exp/synced"), filesystem).step(path)
    return data


def follow_bucket_runs(
    filesystem: pafs.FileSystem,
    scheme: str,
    path: Path,
    data: bytes,
    *,
    look: Callable[[Callable[[], int], bool], int] = lambda refresh, grown: refresh(),
) -> None:
    """The runs ``three_bucket_runs`` uploaded, through ``open_root`` of ``scheme://runs/exp``: listed,
    the synced run read as the local file, the live run read on from its old size when a longer copy
    is uploaded and read again from its start when another run is.  ``look(refresh, grown)`` makes
    each refresh of the live run at the refreshes between uploads (a test counts its requests there)."""
    from metrics_core.read.run_reader import RunReader
    from metrics_core.roots.bucket_root import BucketRoot
    from metrics_core.roots.runs_root import open_root

    root = open_root(f"{scheme}://{BUCKET}/exp")
    assert isinstance(root, BucketRoot) and root.location == f"{scheme}://{BUCKET}/exp"
    assert [run.name for run in root.discover().runs] == ["done", "live", "synced"]
    local = RunReader(path)
    local.refresh()
    synced = root.reader(root.resolve("synced"), cache=None)
    assert synced.refresh() == local.records and snapshot(synced) == snapshot(local)
    live = root.reader(root.resolve("live"), cache=None)
    assert live.refresh() == 5
    for grown in (False, True, False):
        if grown:
            now = datetime.now(timezone.utc).isoformat()
            put_object(filesystem, "exp/live/metrics.jsonl", data + line(base_record(60, train_loss=0.1, time=now)))
        assert look(live.refresh, grown) == int(grown)
    assert live.records == 6 and not live.resets
    put_object(filesystem, "exp/live/metrics.jsonl", data.replace(b'"s1"', b'"s2"'))
    assert live.refresh() == 5 and live.resets == 1 and {s.session_id for s in live.sessions} == {"s2"}


def live_uploads(path: Path) -> list[bytes | None]:
    """What a live run's writer adds between refreshes: nothing, records, half a line, its rest."""
    now = datetime.now(timezone.utc).isoformat()
    torn = line(base_record(80, train_loss=0.2, time=now))
    return [None, line(base_record(60, train_loss=0.3, time=now)), None,
            line(base_record(70, train_loss=0.25, time=now)) + torn[:-9], None, torn[-9:], None]  # fmt: skip


def follow_live_run(
    bucket: pafs.FileSystem, proxy: CountingProxy, path: Path, scheme: str, *, parts: bool,
    requests: Callable[[bool], dict],
) -> None:  # fmt: skip
    """A live run written to ``path`` and uploaded as it grows (``live_uploads``): whole over its
    object (as ``aws s3 cp`` does), or as parts (``sync``; the torn half of a line stays local).
    A root's reader of it (``scheme://runs/exp/live``, made after the test pointed the clients at
    ``proxy``) is refreshed at each step: the same story as the local reader, no restart,
    and requests of the run alone, ``requests(grown)`` of each kind."""
    from metrics_core.buckets.addresses import parse_bucket_url
    from metrics_core.buckets.sync import RunSync
    from metrics_core.read.run_reader import RunReader
    from metrics_core.roots.bucket_root import BucketRoot

    sync = RunSync(parse_bucket_url(f"{scheme}://{BUCKET}/exp/live"), bucket)  # straight to the server, not counted

    def upload() -> None:
        if parts:
            sync.step(path)
        else:
            put_object(bucket, "exp/live/metrics.jsonl", path.read_bytes())

    path.write_bytes(bucket_run(live=True))
    upload()
    root = BucketRoot(f"{scheme}://{BUCKET}/exp")
    remote, local = root.reader(root.resolve("live"), cache=None), RunReader(path)
    assert remote.refresh() == local.refresh() == 5
    for added in live_uploads(path):
        if added is not None:
            append_bytes(path, added)
            upload()
        proxy.reset()
        assert remote.refresh() == local.refresh()
        assert proxy.counts == requests(added is not None and (not parts or b"\n" in added)), proxy.keys
        assert all(kind == "list" or key.removeprefix(f"{BUCKET}/").startswith("exp/live/") for kind, key in proxy.keys)
        pending = 0 if parts else local.pending_bytes  # parts hold complete lines only
        assert (remote.records, remote.pending_bytes, remote.resets) == (local.records, pending, 0)
    assert snapshot(remote) == snapshot(local) and remote.records == 8


# -- threads and pages ---------------------------------------------------------------------------


class Receiver:
    """A webhook receiver on 127.0.0.1: records every POST; answers ``codes`` in turn, then 200."""

    def __init__(self, port: int = 0, codes: tuple[int, ...] = ()) -> None:
        self.posts: list[dict] = []
        self.codes = list(codes)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                code = receiver.codes.pop(0) if receiver.codes else 200
                if code == 200:
                    receiver.posts.append(orjson.loads(body))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def by_run(self) -> Counter:
        return Counter(post["run"] for post in self.posts)


@contextmanager
def in_background(work: Callable[[threading.Event], None]) -> Iterator[None]:
    """``work(stop)`` on a thread while the block runs; then ``stop`` is set and the thread joined."""
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def open_page(page: str, **query: str | list[str]) -> AppTest:
    """The app with ``query`` in its URL, switched to ``pages/<page>.py`` (the runs page is the default)."""
    from streamlit.testing.v1 import AppTest  # here, not at the top: most tests never start the app

    app = AppTest.from_file(APP, default_timeout=30)
    for key, value in query.items():
        app.query_params[key] = value
    app.run()
    if page != "runs":
        app.switch_page(f"pages/{page}.py").run()
    return app


def all_read(app: AppTest) -> AppTest:
    """``app`` (the runs page) rerun until the store's loader has read every run of the root."""
    deadline = time.monotonic() + 30
    while any("loading" in str(status) for status in app.dataframe[0].value["status"]):
        assert time.monotonic() < deadline, "the runs are still being read"
        time.sleep(0.2)
        app.run()
    assert not app.exception
    return app


def popovers(app: AppTest, label: str) -> list[object]:
    """The page's popovers (buttons that open a panel) whose label starts with ``label``."""
    return [block for block in app.get("popover") if block.proto.popover.label.startswith(label)]
