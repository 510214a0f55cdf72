"""Files that are not regular files, met by real processes: the terminal tools refuse them in one
line, and workers forked from a writer are refused and lose nothing."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metrics_core import RunContext
from metrics_core.errors import MetricsError
from metrics_core.write.writer import MetricsWriter, TrainingState
from tests.support import small_run
from tests.support.reading import KINDS, special, written


def cli(*args: str, unprivileged: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "metrics_core", *args], capture_output=True, text=True,
                          timeout=60, cwd="/", preexec_fn=_drop_file_override if unprivileged else None)  # fmt: skip


def _drop_file_override() -> None:
    """In the child before exec: as root, give up the capabilities that read any file (as a user
    without them would be), so that a mode-000 file is unreadable to it too."""
    if os.geteuid() == 0:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                os._exit(99)


@pytest.mark.parametrize("command", ["tail", "summary"])
@pytest.mark.parametrize("kind", [*KINDS, "unreadable"])
def test_the_terminal_tools_refuse_a_special_or_unreadable_file_in_one_line(
    tmp_path: Path, command: str, kind: str
) -> None:
    """tail and summary exit 2 with one stderr line naming the file and why: no traceback, no wait."""
    path = tmp_path / "run" / "metrics.jsonl"
    if kind == "unreadable":
        small_run(path)
        path.chmod(0)
    else:
        special(path, kind)
    result = cli(command, str(tmp_path / "run"), unprivileged=kind == "unreadable")
    if result.returncode == 99:
        pytest.skip("this root process may not drop its capabilities: a mode-000 file stays readable to it")
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.startswith(f"error: {path}: ") and result.stderr.count("\n") == 1, result.stderr
    assert ("Permission denied" if kind == "unreadable" else KINDS[kind]) in result.stderr


_INHERITED: MetricsWriter | None = None  # the parent's open writer, as a forked pool worker inherits it


def _log_from_worker(step: int) -> str:
    """In a forked pool worker: write through the inherited writer; say what happened."""
    try:
        _INHERITED.write("train", TrainingState(step=step), train_loss=9.0, worker=os.getpid())
    except MetricsError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "written"


def test_multiprocessing_workers_forked_from_a_writer_are_refused_and_lose_nothing(run: RunContext) -> None:
    """A fork-started pool logging through the inherited writer: each worker is refused, no record is lost."""
    global _INHERITED
    acknowledged = []
    with MetricsWriter(run) as writer:
        writer.write("train", TrainingState(step=1), train_loss=1.0)
        acknowledged.append((1, 1.0))
        _INHERITED = writer
        try:
            with multiprocessing.get_context("fork").Pool(2) as pool:
                answers = pool.map(_log_from_worker, range(10, 30))
        finally:
            _INHERITED = None
        for step in range(2, 12):
            writer.write("train", TrainingState(step=step), train_loss=1.0)
            acknowledged.append((step, 1.0))
    acknowledged += [(step, 9.0) for step, answer in zip(range(10, 30), answers, strict=True) if answer == "written"]
    assert sorted(written(writer.path)) == sorted(acknowledged)
    assert all(answer.startswith("WriterForkedError: ") for answer in answers), answers
