"""A big run's chart CSVs from the server's route: one alone, then several at once.

Run: python benchmarks/bench_csv.py [--records 2000000] [--at-once 6]

A real ``streamlit run app.py`` on a run of ``--records`` records (``generate.write_run``; the one
``bench_cold_open.py`` opens, when it is there) answers ``/api/csv`` for its charts over HTTP,
read whole by the client.  First the run is read and one chart's CSV fetched alone; then
``--at-once`` charts' CSVs are asked for at the same moment.  Printed: when each answer was
complete, and the server's resident memory at its peak above where it was before the fetches
(sampled every 0.1 s), for the one alone and the several at once, and their ratio: the route
writes at most ``downloads.CSV_ANSWERS_MAX`` CSVs at once, each sent a piece at a time, so the
ratio stays near that number however many are asked for.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics_core.testing.generate import write_run
from metrics_core.testing.live_server import ACCESS_TOKEN, streamlit_server

RUN = "big"
CHARTS = ("loss", "lr", "clipped", "grad_norm", "skipped", "throughput")


def fetch(url: str, chart: str, start: float, answers: list[tuple[str, int, int, float]]) -> None:
    """GET one chart's CSV, read to the end; note (chart, status, bytes, seconds since ``start``)."""
    request = urllib.request.Request(
        f"{url}/api/csv?run={RUN}&chart={chart}&history=effective&only=",
        headers={"Authorization": f"Bearer {ACCESS_TOKEN}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=900) as response:
            size = 0
            while chunk := response.read(1 << 20):
                size += len(chunk)
            answers.append((chart, response.status, size, time.monotonic() - start))
    except urllib.error.HTTPError as refused:
        answers.append((chart, refused.code, 0, time.monotonic() - start))


def peak_while(process: psutil.Process, charts: tuple[str, ...], url: str) -> tuple[int, list]:
    """The server's peak RSS while ``charts``' CSVs are fetched at once, and the answers."""
    answers: list[tuple[str, int, int, float]] = []
    start = time.monotonic()
    threads = [threading.Thread(target=fetch, args=(url, chart, start, answers)) for chart in charts]
    for thread in threads:
        thread.start()
    peak = process.memory_info().rss
    while any(thread.is_alive() for thread in threads):
        peak = max(peak, process.memory_info().rss)
        time.sleep(0.1)
    return peak, sorted(answers, key=lambda answer: answer[3])


def server_process() -> psutil.Process:
    """The ``streamlit run`` this benchmark started (the newest one)."""
    found = [
        process
        for process in psutil.process_iter(["cmdline", "create_time"])
        if "streamlit" in " ".join(process.info["cmdline"] or ()) and "run" in (process.info["cmdline"] or ())
    ]
    return max(found, key=lambda process: process.info["create_time"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "metrics_bench_cold")
    parser.add_argument("--at-once", type=int, default=len(CHARTS))
    args = parser.parse_args()
    root = args.dir / str(args.records)
    if not (root / RUN / "metrics.jsonl").exists():
        write_run(root / RUN / "metrics.jsonl", args.records)
    with tempfile.TemporaryDirectory() as cache, streamlit_server(root, "--cache-dir", cache) as url:
        process = server_process()
        read: list = []
        fetch(url, "lr", time.monotonic(), read)  # the read of the run, and its snapshot
        base = process.memory_info().rss
        alone_peak, alone = peak_while(process, ("loss",), url)
        many = tuple(CHARTS[number % len(CHARTS)] for number in range(args.at_once))
        many_peak, answers = peak_while(process, many, url)
    gib = 1 << 30
    print(f"the server at {base / gib:.2f} GiB before the fetches")
    one = alone[0]
    print(f"one CSV alone: {one[2] / 1e6:.0f} MB in {one[3]:.1f} s; peak +{(alone_peak - base) / gib:.2f} GiB")
    print(
        f"{len(many)} at once: complete at {', '.join(f'{answer[3]:.1f}' for answer in answers)} s "
        f"(statuses {sorted({answer[1] for answer in answers})}); peak +{(many_peak - base) / gib:.2f} GiB"
    )
    ratio = (many_peak - base) / max(alone_peak - base, 1)
    print(f"peak above the start, {len(many)} at once ÷ one alone: {ratio:.2f}x")


if __name__ == "__main__":
    main()
