"""python -m metrics_core tail / summary, as real subprocesses reading real files.

The light venv: ``python -m venv --without-pip`` (no system site-packages), with ``orjson`` copied
from this environment's site-packages and ``metrics_core`` linked into its site-packages: what
``pip install -e .`` gives a training node, built in ~1 s without a network or a build backend.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from metrics_core.testing.generate import write_run
from metrics_core.write.failure_note import FAILURE_NOTE_FILENAME
from tests.support import REPO, append_bytes, append_records, base_record, interruptible, three_session_run

ESCAPE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def cli(*args: str, python: str = sys.executable, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "metrics_core", *args], capture_output=True, text=True, timeout=timeout,
                          cwd="/")  # fmt: skip


def start_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-u", "-m", "metrics_core", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd="/", preexec_fn=interruptible)  # fmt: skip


@pytest.fixture(scope="session")
def light_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv holding only orjson and metrics_core, as a training node installs them (module docstring)."""
    venv = tmp_path_factory.mktemp("light") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    here = Path(sysconfig.get_paths()["purelib"])
    shutil.copytree(here / "orjson", site / "orjson")
    for info in here.glob("orjson-*.dist-info"):
        shutil.copytree(info, site / info.name)
    (site / "metrics_core").symlink_to(REPO / "metrics_core")
    probe = "import orjson, metrics_core\ntry:\n import numpy\nexcept ImportError:\n print('light')"
    assert subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd="/").stdout == "light\n"
    return python


def test_tail_prints_one_clean_line_per_record(tmp_path: Path) -> None:
    """Every record is one newline-terminated line with step, loss, lr, skips, clip and tokens/s; no \\r."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, *(base_record(s, train_loss=1.0 / s, lr=3e-4, skipped_updates_in_window=1,
                                       clipped_fraction=0.25) for s in (10, 20)))  # fmt: skip
    append_records(path, base_record(20, event="validation", val_loss=0.9, val_tokens=512))
    append_bytes(path, b'{"schema_version":1,"torn')
    result = cli("tail", str(tmp_path / "r"))
    assert result.returncode == 0 and "\r" not in result.stdout and result.stdout.endswith("\n")
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert "Z  S1    train         step        10" in lines[0] and "loss 0.1000" in lines[0]
    assert "lr 3.00e-04" in lines[1] and "skips 1" in lines[1] and "clip 0.25" in lines[1]
    assert "tok/s 100" in lines[1]  # 1000 tokens in 10 s
    assert "val_loss 0.9000" in lines[2]
    only = cli("tail", str(tmp_path / "r"), "--event", "validation").stdout.splitlines()
    assert len(only) == 1 and "validation" in only[0]


def test_tail_n_counts_like_tail(tmp_path: Path) -> None:
    """-n N is the last N lines of the full output, -n +K starts at the K-th, and the first rate is known."""
    run = tmp_path / "r"
    written = write_run(run / "metrics.jsonl", 400)
    everything = cli("tail", str(run), "-n", "+1").stdout.splitlines()
    assert len(everything) == written
    assert cli("tail", str(run)).stdout.splitlines() == everything[-10:]
    assert cli("tail", str(run), "-n", "37").stdout.splitlines() == everything[-37:]
    assert cli("tail", str(run), "-n", "+390").stdout.splitlines() == everything[389:]
    assert cli("tail", str(run), "-n", "0").stdout == ""
    trains = cli("tail", str(run), "-n", "2", "--event", "train").stdout.splitlines()
    assert trains == [line for line in everything if " train " in line][-2:]
    assert "tok/s 2.10M" in trains[0]  # its predecessor was read, not printed


def test_tail_of_a_5_gb_file_reads_backwards(tmp_path: Path) -> None:
    """tail -n 10 of a 5 GB file (sparse: 5 GB of NULs before the records) prints its last ten records."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, base_record(1))
    with open(path, "r+b") as handle:
        handle.truncate(5 << 30)
    append_bytes(path, b"\n" + b"".join(orjson.dumps(base_record(s, train_loss=0.5)) + b"\n" for s in range(2, 30)))
    result = cli("tail", str(path.parent))
    assert result.returncode == 0 and result.stderr == ""
    assert [line.split("step")[1].split()[0] for line in result.stdout.splitlines()] == [str(s) for s in range(20, 30)]


def test_bad_lines_are_skipped_and_reported_once(tmp_path: Path) -> None:
    """Bad lines never print; stderr says once how many, with the line numbers of the first ones."""
    path = tmp_path / "metrics.jsonl"
    append_records(path, base_record(1))
    append_bytes(path, b"garbage\n[1,2]\n")
    append_records(path, base_record(2), base_record(3))
    append_bytes(path, b'{"step": 4}\n')
    result = cli("tail", str(path), "-n", "+1")
    assert len(result.stdout.splitlines()) == 3 and result.returncode == 0
    assert result.stderr.count("\n") == 1
    assert "skipped 3 bad line(s): line 2: invalid JSON" in result.stderr
    assert "line 3: not a JSON object" in result.stderr
    assert "line 6: missing base field" in result.stderr


def test_tail_follow_prints_new_records_once_complete(tmp_path: Path) -> None:
    """--follow prints appended records; a torn line appears only when its newline lands."""
    path = tmp_path / "r" / "metrics.jsonl"
    append_records(path, base_record(10, train_loss=1.0))
    child = start_cli("tail", str(path.parent), "--follow", "--interval", "0.05")
    try:
        assert "step        10" in child.stdout.readline()
        line = orjson.dumps(base_record(20, train_loss=0.5)) + b"\n"
        append_bytes(path, line[:30])
        time.sleep(0.3)
        append_bytes(path, line[30:])
        assert select.select([child.stdout], [], [], 5)[0], "the completed record was not printed within 5 s"
        printed = child.stdout.readline()
        assert "step        20" in printed and "loss 0.5000" in printed
    finally:
        child.kill()
        child.wait()


def test_tail_follow_survives_a_cut_and_rewritten_file(tmp_path: Path) -> None:
    """A file cut and rewritten under --follow: stderr says so, the new content prints from its start."""
    path = tmp_path / "metrics.jsonl"
    append_records(path, *(base_record(s) for s in range(1, 4)))
    child = start_cli("tail", str(path), "-f", "--interval", "0.05")
    try:
        assert [child.stdout.readline() for _ in range(3)][-1].split("step")[1].split()[0] == "3"
        path.write_bytes(orjson.dumps(base_record(7, session="again")) + b"\n")
        assert "step         7" in child.stdout.readline()
        assert "shrank" in child.stderr.readline()
    finally:
        child.kill()
        child.wait()


def test_ctrl_c_and_a_closed_pipe_exit_0(tmp_path: Path) -> None:
    """Ctrl-C under --follow and `| head` both end quietly with status 0."""
    run = tmp_path / "r"
    write_run(run / "metrics.jsonl", 20_000)
    child = start_cli("tail", str(run), "-f", "--interval", "0.05")
    assert child.stdout.readline()
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=10) == 0 and "Traceback" not in child.stderr.read()
    piped = subprocess.run(f"{sys.executable} -m metrics_core tail -n +1 {run} | head -n 2; exit ${{PIPESTATUS[0]}}",
                           shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60)  # fmt: skip
    assert piped.returncode == 0 and piped.stderr == "" and len(piped.stdout.splitlines()) == 2


def test_summary_prints_sessions_status_and_health(tmp_path: Path) -> None:
    """summary: status, one row per session (S1… as the pages name them), lost work, last losses, the checks."""
    three_session_run(tmp_path / "r" / "metrics.jsonl")
    result = cli("summary", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "status    crashed" in out and "36 in 3 session(s)" in out
    rows = [line for line in out.splitlines() if re.match(r"S[123]   s[123] ", line)]
    assert [row.split()[1:5] for row in rows] == [["s1", "0", "100", "13"], ["s2", "60", "150", "12"],
                                                 ["s3", "120", "200", "11"]]  # fmt: skip
    assert [row.split()[-3:] for row in rows] == [["crashed", "0", "B"], ["crashed", "17", "B"], ["crashed", "17", "B"]]
    assert "70 steps and 7,000 tokens replayed" in out
    assert "train loss 0.0500 (step 200) · val loss 0.1000 (step 200)" in out
    assert "[ok] bad lines: none" in out and "[ok] missing loss" in out


def test_summary_says_a_record_from_the_future_is_a_clock_ahead_not_a_negative_age(tmp_path: Path) -> None:
    """A writer whose clock runs an hour ahead: "clock ahead by 1 h", never "-1 h ago"; the
    dashboard's age column says "clock ahead" too."""
    from metrics_core.dashboard.display_text import age_text

    ahead = datetime.now(timezone.utc).timestamp() + 3600
    when = datetime.fromtimestamp(ahead, timezone.utc).isoformat(timespec="microseconds")
    append_records(tmp_path / "r" / "metrics.jsonl", base_record(10, train_loss=1.0, time=when))
    result = cli("summary", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    assert re.search(r"\(clock ahead by (\d+(\.\d+)? min|1 h)\)", result.stdout), result.stdout
    assert " ago)" not in result.stdout
    assert age_text(-3600.0) == "clock ahead" and age_text(-0.5) == "0 s ago" and age_text(61.0) == "1 min ago"


def test_summary_findings_and_the_write_failure_note(tmp_path: Path) -> None:
    """Bad lines, torn tail, window accounting and missing loss are reported; a failure note makes it failed."""
    path = tmp_path / "metrics.jsonl"
    window = {"attempted_updates": 10, "updates": 9}
    append_records(path, base_record(10, **window, skipped_updates_in_window=1, train_loss=1.0),
                   base_record(20, **window, skipped_updates_in_window=0, train_loss=None))  # fmt: skip
    append_bytes(path, b"oops\n")
    end = path.stat().st_size
    append_bytes(path, b'{"torn')
    note = {"session_id": "s1", "time": "2026-11-29T10:00:21+00:00", "error": "No space left on device (ENOSPC)",
            "end": end, "size": end + 6}  # fmt: skip
    (tmp_path / FAILURE_NOTE_FILENAME).write_text(json.dumps(note))
    out = cli("summary", str(path)).stdout
    assert "status    failed — write failed: No space left on device (ENOSPC)" in out
    assert "[warning] bad lines: 1 line(s) skipped" in out and "line 3: invalid JSON" in out
    assert "[info] torn tail: 6 byte(s)" in out
    assert "[error] window accounting: session s1, steps 20–20: 1 window(s)" in out
    assert "[warning] missing loss: session s1, steps 20–20: 1 window(s) with no train_loss" in out


def test_summary_of_hostile_strings_fits_100_columns(tmp_path: Path) -> None:
    """Long and hostile session ids, statuses and paths: ≤ 100 columns, no escapes, no NaN/None/<NA>."""
    run = tmp_path / ("very-long-run-directory-name-" * 6) / "r"
    evil = "\x1b[2J\x1b[31mred\u202e" + "x" * 300 + "日本語" * 40
    append_records(run / "metrics.jsonl", base_record(0, event="session_start", session=evil, discarded_bytes=None),
                   {**base_record(session=evil, train_loss="NaN", tokens="lots"), "step": 2**63 - 1},
                   base_record(5, event="session_end", session=evil + "2", status=evil))  # fmt: skip
    result = cli("summary", str(run))
    assert result.returncode == 0, result.stderr
    for line in result.stdout.splitlines():
        assert sum(2 if "\u3000" <= c <= "\u9fff" else 1 for c in line) <= 100, line
        assert not ESCAPE.search(line), repr(line)
    assert not re.search(r"\bNaN\b|<NA>|\bNone\b|\bnan\b", result.stdout)
    assert "—" in result.stdout and "…" in result.stdout
    tailed = cli("tail", str(run)).stdout
    assert not ESCAPE.search(tailed.replace("\n", "")) and len(tailed.splitlines()) == 3


def test_missing_run_is_a_clear_error_with_status_2(tmp_path: Path) -> None:
    """A wrong path names the problem on stderr and exits 2."""
    result = cli("summary", str(tmp_path / "nope"))
    assert result.returncode == 2 and "no such run directory" in result.stderr


def test_tail_runs_where_only_orjson_is_installed(tmp_path: Path, light_python: str) -> None:
    """In a venv with orjson and metrics_core only, tail answers (no ModuleNotFoundError)."""
    three_session_run(tmp_path / "r" / "metrics.jsonl")
    result = cli("tail", str(tmp_path / "r"), "-n", "3", python=light_python)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3 and "step       200" in result.stdout


def test_summary_runs_where_only_orjson_is_installed(tmp_path: Path, light_python: str) -> None:
    """In a venv with orjson and metrics_core only, summary answers with the same numbers."""
    three_session_run(tmp_path / "r" / "metrics.jsonl")
    result = cli("summary", str(tmp_path / "r"), python=light_python)
    assert result.returncode == 0, result.stderr
    assert "status    crashed" in result.stdout and "70 steps and 7,000 tokens replayed" in result.stdout


def test_sync_where_pyarrow_is_missing_says_what_to_install(tmp_path: Path, light_python: str) -> None:
    """On a training node without pyarrow, sync names the extra to install in one line, exit 2."""
    three_session_run(tmp_path / "r" / "metrics.jsonl")
    result = cli("sync", str(tmp_path / "r"), "s3://bucket/r", python=light_python)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: sync needs pyarrow: pip install 'metrics-core[s3]' (No module named")
    assert len(result.stderr.splitlines()) == 1


def test_serve_and_sync_parse_their_own_options(tmp_path: Path) -> None:
    """serve hands every argument to metrics-dashboard's parser and sync to its own: their errors name them."""
    served = cli("serve", "--runs", str(tmp_path), "--bogus")
    assert served.returncode == 2 and "metrics-dashboard: error: unrecognized arguments: --bogus" in served.stderr
    synced = cli("sync", str(tmp_path), "s3://bucket/r", "--interval", "-1")
    assert synced.returncode == 2 and synced.stdout == ""
    assert "python -m metrics_core sync: error: argument --interval: expected a positive number" in synced.stderr


def _modules_after(command: str, run: Path) -> list[str]:
    """Heavy top-level modules loaded by a fresh interpreter after running one command's main()."""
    code = (
        "import io, json, sys\nfrom metrics_core.cli.main import main\n"
        f"main([{command!r}, {str(run)!r}], out=io.StringIO())\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'pandas', 'pyarrow'})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(done.stdout)


def test_tail_loads_no_numpy_or_pandas(tmp_path: Path) -> None:
    """Where numpy and pandas are installed, tail still does not import them."""
    three_session_run(tmp_path / "metrics.jsonl")
    assert _modules_after("tail", tmp_path) == []


def test_summary_loads_no_numpy_or_pandas(tmp_path: Path) -> None:
    """Where numpy and pandas are installed, summary still does not import them."""
    three_session_run(tmp_path / "metrics.jsonl")
    assert _modules_after("summary", tmp_path) == []


def test_summary_status_probes_the_writer_lock(tmp_path: Path) -> None:
    """A silent run whose writer still holds the lock is stalled; the same run without it is crashed."""
    directory = tmp_path / "r"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom metrics_core import MetricsWriter, RunContext, TrainingState\n"
        f"with MetricsWriter(RunContext({str(directory)!r}, 'r', 's1')) as w:\n"
        "    w.write('train', TrainingState(step=1)); print('ready', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    try:
        assert holder.stdout.readline() == "ready\n"
        append_records(directory / "metrics.jsonl", base_record(2, session="s1"))  # an old record: silent
        assert "status    stalled" in cli("summary", str(directory)).stdout
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert "status    crashed" in cli("summary", str(directory)).stdout
    assert datetime.now(timezone.utc).year >= 2026 and os.path.exists(directory / "metrics.jsonl")
