"""The dashboard on a runs root in a bucket, in a real headless Chromium against a real
`streamlit run ... -- --runs s3://runs/exp` reading conftest's moto server the AWS way (the
``AWS_*`` variables): the runs are listed, a run page draws its charts and shows the points of a
longer copy uploaded over its object, and a run whose object is deleted turns into a one-line
error on a page that stays up; a run that ``sync --follow`` uploads as parts shows its new points."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from pyarrow import fs as pafs

from metrics_core.testing.live_server import GRAPH_JS, RUN_ROWS_JS, live_charts_drawn, streamlit_server, wait_until
from tests.support import BUCKET, DESKTOP, append_records, base_record, bucket_run, line, put_object


def loss_steps(page: object) -> list[float]:
    """The steps the run page's loss chart draws for its train line."""
    graph = page.evaluate(GRAPH_JS, "Loss")
    if graph is None:
        return []
    lines = [t for t in graph["traces"] if t["name"].startswith("train") and "smoothed" not in t["name"]]
    return [x for t in lines for x in t["x"] if x is not None]  # a legend entry's one point is null


def test_a_bucket_root_is_listed_its_run_follows_uploads_and_a_deleted_object_is_one_line(
    browser: object, bucket: pafs.S3FileSystem
) -> None:
    """Three runs under the prefix (one live): all listed on ``/``; the live run's page draws its
    loss, then the step of a record in a longer copy uploaded over the object; the object deleted,
    the page says the run is gone in one error line, under its title and navigation."""
    live = bucket_run(live=True)
    put_object(bucket, "exp/a/metrics.jsonl", bucket_run(live=False))
    put_object(bucket, "exp/b/c/metrics.jsonl", bucket_run(live=False))
    put_object(bucket, "exp/live/metrics.jsonl", live)
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        with streamlit_server(f"s3://{BUCKET}/exp", "--list-interval", "2") as url:
            page.goto(url + "/")
            names = {"run?run=a", "run?run=b/c", "run?run=live"}
            wait_until(page, lambda: set(page.evaluate(RUN_ROWS_JS)["names"]) == names, timeout=60)

            page.goto(url + "/run?run=live")
            wait_until(page, lambda: live_charts_drawn(page) and loss_steps(page), timeout=60)
            assert max(loss_steps(page)) == 50
            record = base_record(60, train_loss=0.1, time=datetime.now(timezone.utc).isoformat())
            put_object(bucket, "exp/live/metrics.jsonl", live + line(record))  # as `aws s3 cp` replaces it
            wait_until(page, lambda: max(loss_steps(page), default=0) == 60, timeout=30)

            bucket.delete_file(f"{BUCKET}/exp/live/metrics.jsonl")
            alert = page.locator("[data-testid=stAlert]", has_text="Cannot show run 'live' right now")
            wait_until(page, lambda: alert.count() == 1, timeout=30)
            text = alert.inner_text()
            assert "no run there" in text and "\n" not in text.strip(), text
            assert page.get_by_role("heading", name="live").count() == 1  # the page is still up
            assert page.get_by_role("link", name="Runs").count() >= 1
    finally:
        context.close()


def test_a_run_appended_through_sync_follow_shows_its_new_points(
    browser: object, bucket: pafs.S3FileSystem, tmp_path: Path
) -> None:
    """A live run written locally and uploaded by ``python -m metrics_core sync --follow`` (parts,
    one a second): its page draws the uploaded steps, then a record appended to the local file."""
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_bytes(bucket_run(live=True))
    sync = subprocess.Popen(
        [sys.executable, "-m", "metrics_core", "sync", str(run_dir), f"s3://{BUCKET}/exp/live", "--follow",
         "--interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy(),
    )  # fmt: skip
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        with streamlit_server(f"s3://{BUCKET}/exp", "--list-interval", "2") as url:
            page.goto(url + "/run?run=live")
            wait_until(page, lambda: live_charts_drawn(page) and max(loss_steps(page), default=0) == 50, timeout=60)
            now = datetime.now(timezone.utc).isoformat()
            append_records(run_dir / "metrics.jsonl", base_record(60, train_loss=0.1, time=now))
            wait_until(page, lambda: max(loss_steps(page), default=0) == 60, timeout=30)
    finally:
        context.close()
        sync.send_signal(signal.SIGTERM)
        assert sync.wait(timeout=30) == 0, sync.stderr.read().decode()
