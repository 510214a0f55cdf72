"""Special files under a real `streamlit run` in a real headless Chromium: the page stays usable.

A FIFO where a run's cache file belongs (``--cache-dir``), and runs whose ``metrics.jsonl`` is a
FIFO or a directory: the runs table lists every run, the special ones as errors naming their file
relative to the runs root, a run whose cache path is a FIFO is drawn, and SIGTERM still stops the
server (a thread waiting on a FIFO forever would keep the process alive).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote

from metrics_core.read.column_cache import CachePolicy
from metrics_core.read.run_file import LocalFile
from metrics_core.testing.live_server import ACCESS_TOKEN, free_port, wait_for_http, wait_until
from tests.support import DESKTOP, REPO, small_run

SPECIAL = {"piped": "a FIFO (named pipe)", "folder/deep": "a directory"}
NORMAL = ("alpha", "beta")


def make_root(root: Path, cache: Path) -> None:
    """Two normal runs, each with a FIFO at its cache path, and the ``SPECIAL`` runs."""
    for name in NORMAL:
        path = root / name / "metrics.jsonl"
        small_run(path)
        file = LocalFile(path)
        file.open()
        fifo = CachePolicy(cache).path_for(file.cache_key())
        file.close()
        fifo.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(fifo)
    os.mkfifo(_parent(root / "piped" / "metrics.jsonl"))
    _parent(root / "folder" / "deep" / "metrics.jsonl").mkdir()


def _parent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def table_rows(page: object) -> dict[str, dict[str, str]]:
    """The runs table by run name, once every normal run is read and every special run failed."""
    headers = "[...document.querySelectorAll('[data-testid=stDataFrame] thead th')].map(h => h.textContent)"
    cells = ("() => [...document.querySelectorAll('[data-testid=stDataFrame] tbody tr')]"
             ".map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent))")  # fmt: skip

    def rows() -> dict[str, dict[str, str]] | None:
        columns = page.evaluate(headers)
        table = {row[0].removeprefix("run?run="): dict(zip(columns, row, strict=True))
                 for row in page.evaluate(cells) if len(row) == len(columns)}  # fmt: skip
        settled = sorted(map(unquote, table)) == sorted([*NORMAL, *SPECIAL]) and not any(
            "loading" in row["status"] for row in table.values()
        )
        return {unquote(name): row for name, row in table.items()} if settled else None

    return wait_until(page, rows, timeout=60)


def test_special_files_leave_the_page_responsive_and_sigterm_stops_the_server(browser: object, tmp_path: Path) -> None:
    """Error rows name <run>/metrics.jsonl; a run whose cache path is a FIFO is drawn; SIGTERM ends the server."""
    root, cache = tmp_path / "runs", tmp_path / "cache"
    make_root(root, cache)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(REPO / "app.py"), "--server.port", str(port),
             "--server.headless", "true", "--browser.gatherUsageStats", "false", "--",
             "--runs", str(root), "--refresh", "1", "--cache-dir", str(cache)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO), "METRICS_TOKEN": ACCESS_TOKEN},
        )  # fmt: skip
        context = browser.new_context(viewport=DESKTOP)
        try:
            wait_for_http(f"{url}/_stcore/health", server, log, what="the dashboard")
            page = context.new_page()
            page.goto(f"{url}/")
            rows = table_rows(page)
            for name in NORMAL:
                assert rows[name]["status"].endswith("crashed") and rows[name]["last step"] == "500", rows[name]
            for name, kind in SPECIAL.items():
                assert rows[name]["status"].endswith("error"), rows[name]
                assert rows[name]["error"] == f"{name}/metrics.jsonl: is {kind}, not a regular file", rows[name]
            assert "Traceback" not in page.evaluate("document.body.innerText")
            page.goto(f"{url}/run?run=alpha")
            wait_until(page, lambda: page.locator(".js-plotly-plot .main-svg").count() > 0, timeout=60)
            page.goto(f"{url}/run?run=piped")
            error = "piped/metrics.jsonl: is a FIFO (named pipe), not a regular file"
            wait_until(page, lambda: error in page.evaluate("document.body.innerText"), timeout=60)
            text = page.evaluate("document.body.innerText")
            assert "Traceback" not in text and str(root / "piped") not in text  # named relative to the root
            context.close()
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log.seek(0)
                raise AssertionError(
                    f"SIGTERM did not stop the server:\n{log.read().decode(errors='replace')}"
                ) from None
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
