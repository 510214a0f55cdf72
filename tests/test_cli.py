"""python -m metrics_core tail / summary, as real subprocesses reading real files."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests.conftest import append_bytes, append_records, base_record, spawn_python
from tests.test_reader import three_session_run


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metrics_core", *args], capture_output=True, text=True, timeout=60)


def test_tail_prints_one_clean_line_per_record(tmp_path: Path) -> None:
    """Every record is one newline-terminated line with step, loss, lr, skips, clip and tokens/s; no \\r."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s, lr=3e-4, skipped_updates_in_window=1,
                                       clipped_fraction=0.25) for s in (10, 20)))  # fmt: skip
    append_records(path, base_record(20, event="validation", val_loss=0.9, val_tokens=512))
    append_bytes(path, b'{"schema_version":1,"torn')
    result = cli("tail", str(tmp_path / "r"))
    assert result.returncode == 0 and "\r" not in result.stdout and result.stdout.endswith("\n")
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert "S1  train" in lines[0] and "step        10" in lines[0] and "loss 0.1000" in lines[0]
    assert "lr 3.00e-04" in lines[1] and "skips 1" in lines[1] and "clip 0.25" in lines[1]
    assert "tok/s 100" in lines[1]  # 1000 tokens in 10 s
    assert "val_loss 0.9000" in lines[2]
    only = cli("tail", str(tmp_path / "r"), "--event", "validation").stdout.splitlines()
    assert len(only) == 1 and "validation" in only[0]


def test_tail_follow_prints_new_records_once_complete(tmp_path: Path) -> None:
    """--follow prints appended records; a torn line appears only when its newline lands."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, base_record(10, train_loss=1.0))
    child = spawn_python("from metrics_core.cli import main; import sys; sys.exit(main())", "tail", str(path.parent),
                         "--follow", "--interval", "0.1")  # fmt: skip
    try:
        assert "step        10" in child.stdout.readline()
        line = orjson.dumps(base_record(20, train_loss=0.5)) + b"\n"
        append_bytes(path, line[:30])
        time.sleep(0.5)
        append_bytes(path, line[30:])
        started = time.monotonic()
        printed = child.stdout.readline()
        assert "step        20" in printed and "loss 0.5000" in printed
        assert time.monotonic() - started < 5
    finally:
        child.terminate()
        child.wait()


def test_summary_prints_sessions_status_and_health(tmp_path: Path) -> None:
    """summary: status line, one table row per session, lost work and the diagnostics."""
    three_session_run(tmp_path / "r" / "metrics.jsonl")
    result = cli("summary", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert ": crashed, 3 session(s)" in out
    assert "70 steps and 7,000 tokens replayed" in out
    assert out.count("crashed") >= 3 and "[ok] all" in out


def test_missing_run_is_a_clear_error_with_status_2(tmp_path: Path) -> None:
    """A wrong path names the problem on stderr and exits 2."""
    result = cli("summary", str(tmp_path / "nope"))
    assert result.returncode == 2 and "no such run directory" in result.stderr
