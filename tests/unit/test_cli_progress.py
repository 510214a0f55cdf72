"""The progress bar's text and when it draws (``metrics_core.cli.progress``), on an in-memory terminal
with a clock the test moves; the real terminal is ``tests/integration/test_cli_progress.py``'s."""

from __future__ import annotations

import io
from pathlib import Path

from metrics_core.cli.progress import BYTES, MIN_INTERVAL_S, _LineBar, progress_bar, progress_line
from metrics_core.read.line_follower import READ_CHUNK
from metrics_core.read.run_digest import RunDigest
from metrics_core.text import width
from tests.support import append_records, base_record


class Terminal(io.StringIO):
    """What the bar wrote, from a stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_says_how_far_how_fast_and_how_long_is_left() -> None:
    """Bytes in binary units, runs counted, the rate a second and the time left."""
    line = progress_line("summary", 300 << 20, 1200 << 20, rate=100 << 20, unit=BYTES, columns=99)
    assert line == "summary  25% [#####---------------] 300 MB/1.17 GB 100 MB/s 9 s left"
    assert progress_line("export", 3, 12, rate=None, unit="run", columns=99) == (
        "export  25% [#####---------------] 3/12 runs"
    )
    assert progress_line("export", 3, 12, rate=0.5, unit="run", columns=99).endswith("3/12 runs 0.5 runs/s 18 s left")


def test_a_line_fits_the_terminal_and_survives_a_zero_total() -> None:
    """Cut to the columns given; a total of 0 is done, not a division by zero."""
    assert width(progress_line("summary", 1, 10**12, rate=3.0, unit=BYTES, columns=30)) <= 30
    assert progress_line("sync", 0, 0, rate=None, unit=BYTES, columns=99).startswith("sync 100% [####")


def test_the_built_in_bar_redraws_at_most_every_interval_and_ends_at_its_total() -> None:
    """Updates within MIN_INTERVAL_S of a redraw write nothing; close draws the total, then blanks the line."""
    terminal, clock = Terminal(), Clock()
    bar = _LineBar(terminal, "summary", BYTES, clock=clock)
    bar.update(0, 1000)
    drawn = terminal.getvalue()
    assert drawn.startswith("\rsummary   0% [")
    for done in range(1, 500):
        bar.update(done, 1000)
    assert terminal.getvalue() == drawn, "no redraw within the interval"
    clock.now += 1.5 * MIN_INTERVAL_S
    bar.update(500, 1000)
    assert terminal.getvalue().count("\r") == 2 and " 50% [" in terminal.getvalue()
    bar.update(1000, 1000)
    bar.close()
    frames = terminal.getvalue().split("\r")
    assert "100% [####################] 1000 B/1000 B" in frames[-3] and frames[-2].strip() == "" == frames[-1]


def test_no_bar_for_work_already_done_and_a_new_bar_after_close() -> None:
    """A first figure at its total draws nothing; after close, the next pass (sync) starts a bar of its own."""
    terminal = Terminal()
    bar = _LineBar(terminal, "sync", BYTES, clock=Clock())
    bar.update(500, 500)
    bar.close()
    assert terminal.getvalue() == ""
    bar.update(500, 800)
    assert terminal.getvalue().startswith("\rsync  62% [")


def test_no_terminal_or_quiet_draws_nothing(tmp_path: Path) -> None:
    """progress_bar on a stream that is no terminal, or with quiet, writes nothing for a whole read."""
    path = tmp_path / "metrics.jsonl"
    append_records(path, *(base_record(step) for step in range(100)))
    for stream, quiet in ((io.StringIO(), False), (Terminal(), True)):
        digest = RunDigest(path)
        with progress_bar(stream, "summary", unit=BYTES, quiet=quiet) as bar:
            bar.update(0, 100)
            digest.refresh(bar.update)
        digest.close()
        assert stream.getvalue() == "" and digest.records == 100


def test_the_readers_report_offsets_up_to_the_file_size(tmp_path: Path) -> None:
    """RunDigest.refresh reports (offset, size) after each block, ending at the file's complete lines."""
    path = tmp_path / "metrics.jsonl"
    append_records(path, *(base_record(step) for step in range(50)))
    seen: list[tuple[int, int]] = []
    digest = RunDigest(path)
    digest.refresh(lambda done, total: seen.append((done, total)))
    digest.close()
    size = path.stat().st_size
    assert seen == [(size, size)]


def test_export_of_one_big_run_reports_the_bytes_of_its_file_as_they_are_parsed(tmp_path: Path) -> None:
    """export_root over a root of one run of two read blocks (``line_follower.READ_CHUNK``):
    ``progress(bytes, total)`` moves through that run's file block by block, not from 0 straight
    to the end; an export that finds the run unchanged counts it whole at once."""
    from metrics_core.sql.export import export_root

    path = tmp_path / "runs" / "big" / "metrics.jsonl"
    append_records(path, *(base_record(step, note="x" * 200_000) for step in range(55)))
    size = path.stat().st_size
    assert READ_CHUNK < size < 2 * READ_CHUNK
    for expected_moves in (1, 0):
        seen: list[tuple[int, int]] = []
        export_root(tmp_path / "runs", tmp_path / "out", progress=lambda *figures, seen=seen: seen.append(figures))
        done = [figure for figure, _ in seen]
        assert {total for _, total in seen} == {size} and done == sorted(done) and done[0] == 0 and done[-1] == size
        assert len({figure for figure in done if 0 < figure < size}) >= expected_moves, seen
        assert expected_moves or seen == [(0, size), (size, size)]
