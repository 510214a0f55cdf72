"""The progress bar of ``export``, ``query``, ``sync``, ``summary`` and ``tail``, in real subprocesses.

stderr is a pseudo-terminal (``os.openpty``, 100 columns) where a test wants the bar, a pipe where
it wants a log: on the terminal the bar appears, moves and shows its total before it clears its
line; in a pipe stderr stays byte for byte empty; ``--quiet`` silences the terminal too; and
stdout is the same whichever stderr is.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from metrics_core.cli.terminal import bytes_text
from tests.support import BUCKET, REPO, append_records, base_record, three_session_run

# Hides tqdm from the CLI, as on a training node that has orjson alone.
WITHOUT_TQDM = "import sys; sys.modules['tqdm'] = None; from metrics_core.cli.main import main; sys.exit(main())"
PERCENT = re.compile(rb"(\d+)%")


def on_terminal(*args: str, hide_tqdm: bool = False, stdout_too: bool = False) -> tuple[bytes, bytes, int]:
    """The CLI with stderr a terminal of 100 columns and stdout a pipe (or the same terminal with
    ``stdout_too``): (what the terminal got, what the pipe got, status)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    start = [sys.executable, "-c", WITHOUT_TQDM] if hide_tqdm else [sys.executable, "-m", "metrics_core"]
    stdout = slave if stdout_too else subprocess.PIPE
    with subprocess.Popen([*start, *args], stdout=stdout, stderr=slave, cwd=REPO) as process:
        os.close(slave)
        out: list[bytes] = []
        if not stdout_too:  # read beside the terminal: a child blocked on a full pipe never closes it
            pipe = threading.Thread(target=lambda: out.append(process.stdout.read()))
            pipe.start()
        err = b""
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: the child's end of the terminal is closed
                break
            if not data:
                break
            err += data
        status = process.wait(timeout=60)
        if not stdout_too:
            pipe.join(timeout=60)
    os.close(master)
    return err, b"".join(out), status


def in_a_pipe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metrics_core", *args], capture_output=True, cwd=REPO, timeout=60)


def frames(err: bytes, label: bytes) -> list[int]:
    """The percentages the bar drew, in order (each frame starts with a carriage return and the label)."""
    return [int(PERCENT.search(frame).group(1)) for frame in err.split(b"\r") if frame.startswith(label)]


def assert_moved_to_the_total(err: bytes, label: bytes) -> None:
    """The bar started short of its total, showed the total last, then cleared its line."""
    shown = frames(err, label)
    assert len(shown) >= 2 and shown[0] < 100 and shown[-1] == 100, err[:500]
    assert err.endswith(b"\r") and not err.rstrip(b"\r").split(b"\r")[-1].strip(), "the line is cleared at the end"


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 24 MB in 120 records of 200 kB: three read blocks for summary, hundreds for tail going back."""
    path = tmp_path_factory.mktemp("big") / "run" / "metrics.jsonl"
    append_records(path, *(base_record(step, note="x" * 200_000) for step in range(120)))
    return path.parent


@pytest.mark.parametrize("hide_tqdm", [False, True], ids=["tqdm", "without-tqdm"])
def test_summary_on_a_terminal_draws_a_bar_to_the_total_and_prints_the_same_summary(
    big_run: Path, hide_tqdm: bool
) -> None:
    """summary of a big run with stderr a terminal: tqdm's bar, or the built-in line where tqdm is
    missing, moves to 100 %; stdout is what it is with stderr a pipe."""
    err, out, status = on_terminal("summary", str(big_run), hide_tqdm=hide_tqdm)
    assert status == 0
    assert_moved_to_the_total(err, b"summary")
    if hide_tqdm:
        assert b"[####################] 22.9 MB/22.9 MB" in err and b"MB/s" in err
    else:
        assert b"22.9M/22.9M" in err and b"B/s]" in err
    assert out == in_a_pipe("summary", str(big_run)).stdout


def test_summary_and_tail_in_a_pipe_print_nothing_extra(big_run: Path) -> None:
    """With stderr a pipe (cron, CI), stderr is byte for byte empty and stdout as with --quiet."""
    for args in (("summary", str(big_run)), ("tail", str(big_run), "-n", "+100"), ("tail", str(big_run), "-n", "3")):
        done = in_a_pipe(*args)
        assert done.returncode == 0 and done.stderr == b"", args
        assert done.stdout == in_a_pipe(*args, "--quiet").stdout != b""


def test_quiet_silences_the_bar_on_a_terminal(big_run: Path) -> None:
    """--quiet: stderr a terminal, and nothing on it."""
    for args in (("summary", str(big_run)), ("tail", str(big_run), "-n", "+1")):
        err, out, status = on_terminal(*args, "--quiet")
        assert status == 0 and err == b"" and out, args


def test_tail_reading_forward_or_back_for_a_rare_event_draws_the_bar(big_run: Path, tmp_path: Path) -> None:
    """tail -n +K reads the whole file forward, tail --event of an absent event reads it all backwards:
    both show the bar to the total, and print exactly what they print in a pipe; tail -n 3 of a
    run of short records reads one block back and draws nothing."""
    for args in (("-n", "+110"), ("-n", "2", "--event", "session_end")):
        err, out, status = on_terminal("tail", str(big_run), *args)
        assert status == 0
        assert_moved_to_the_total(err, b"tail")
        assert out == in_a_pipe("tail", str(big_run), *args).stdout
    append_records(tmp_path / "metrics.jsonl", *(base_record(step) for step in range(5000)))
    err, out, status = on_terminal("tail", str(tmp_path), "-n", "3")
    assert status == 0 and err == b"" and out.count(b"\n") == 3


@pytest.mark.parametrize("hide_tqdm", [False, True], ids=["tqdm", "without-tqdm"])
def test_tail_takes_the_bar_off_the_line_before_each_record_line_on_a_shared_terminal(
    big_run: Path, hide_tqdm: bool
) -> None:
    """stdout and stderr one terminal: each record line starts on a line of its own, whole, after
    whatever cleared the bar (a carriage return); the bar still ends at its total."""
    shown, _, status = on_terminal("tail", str(big_run), "-n", "+60", hide_tqdm=hide_tqdm, stdout_too=True)
    assert status == 0
    *lines, last = shown.split(b"\r\n")  # the terminal turns each newline into CR LF
    assert [line.rsplit(b"\r", 1)[-1] for line in lines] == in_a_pipe(
        "tail", str(big_run), "-n", "+60"
    ).stdout.splitlines()
    assert frames(last, b"tail")[-1] == 100 and not last.rsplit(b"\r", 2)[-2].strip()


def test_export_and_query_draw_a_bar_of_bytes(tmp_path: Path) -> None:
    """export of a root of four runs on a terminal: a bar of their files' bytes to the total; in a
    pipe, nothing on stderr; query over the root shows the same bar while it exports."""
    root = tmp_path / "runs"
    for name in "abcd":
        three_session_run(root / name / "metrics.jsonl")
    size = sum(path.stat().st_size for path in root.glob("*/metrics.jsonl"))
    err, out, status = on_terminal(
        "export", str(root), str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c1"), hide_tqdm=True
    )
    assert status == 0 and out == b"exported 4 run(s), 0 unchanged, 0 removed\n"
    assert_moved_to_the_total(err, b"export")
    assert f"{bytes_text(size)}/{bytes_text(size)}".encode() in err, err
    piped = in_a_pipe("export", str(root), str(tmp_path / "out2"), "--cache-dir", str(tmp_path / "c2"))
    assert piped.returncode == 0 and piped.stderr == b"" and piped.stdout == out
    sql = "SELECT count(*) AS n FROM runs"
    err, out, status = on_terminal("query", str(root), sql, "--format", "csv", "--cache-dir", str(tmp_path / "c3"))
    assert status == 0 and out == b"n\n4\n"
    assert_moved_to_the_total(err, b"export")
    quiet = on_terminal("query", str(root), sql, "--quiet", "--cache-dir", str(tmp_path / "c4"))
    assert quiet[0] == b"" and quiet[2] == 0


@pytest.mark.parametrize("hide_tqdm", [False, True], ids=["tqdm", "without-tqdm"])
def test_export_of_one_big_run_draws_a_bar_of_its_bytes(big_run: Path, tmp_path: Path, hide_tqdm: bool) -> None:
    """export of a root holding one 24 MB run: the bar counts the run's bytes, shown moving to
    that total (a bar of runs would go from 0/1 to 1/1 with nothing between)."""
    err, out, status = on_terminal("export", str(big_run.parent), str(tmp_path / "out"), hide_tqdm=hide_tqdm)
    assert status == 0 and out == b"exported 1 run(s), 0 unchanged, 0 removed\n", err
    assert_moved_to_the_total(err, b"export")
    assert (b"22.9 MB/22.9 MB" if hide_tqdm else b"22.9M/22.9M") in err, err


def test_sync_of_a_backlog_draws_a_bar_of_bytes(big_run: Path, bucket: object) -> None:
    """sync of a 24 MB backlog on a terminal: a bar of bytes to the total, then the part's line on
    stdout; with stderr a pipe, stderr stays empty."""
    err, out, status = on_terminal("sync", str(big_run), f"s3://{BUCKET}/progress/run")
    assert status == 0 and out.startswith(b"uploaded s3://"), err
    assert_moved_to_the_total(err, b"sync")
    piped = in_a_pipe("sync", str(big_run), f"s3://{BUCKET}/progress/again")
    assert piped.returncode == 0 and piped.stderr == b"" and piped.stdout.startswith(b"uploaded s3://")
