"""``python -m metrics_core summary RUN_DIR``: a run's status, sessions, lost work and checks in the terminal.

Runs with the package's own dependency only (orjson), as ``tail`` does: it reads the file through
``metrics_core.read.run_digest`` (the session and replay rules of ``RunReader``), never through
numpy or pandas.  On a terminal, stderr shows a bar of the bytes read (``cli.progress``).

Output contract: every line at most ``WIDTH`` columns whatever the file holds ("…" where a value
is cut), "—" where a value is missing, never ``NaN``/``None``; strings from the file go through
``text.clean``.  Exit status 0; 2 when the run does not exist.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, TextIO

from metrics_core.cli.command import add_quiet, add_run_dir
from metrics_core.cli.progress import BYTES, progress_bar
from metrics_core.cli.terminal import ID_COLUMNS, bytes_text, count_text, loss_text, pad
from metrics_core.read.health import Finding
from metrics_core.read.run_digest import RunDigest
from metrics_core.read.run_file import metrics_path, named_directory
from metrics_core.read.session_model import Session
from metrics_core.text import MISSING, clean, duration, fit, fit_middle, width

if TYPE_CHECKING:
    from metrics_core.cli.command import Subcommands

NAME = "summary"
WIDTH = 100  # summary lines fit an 100-column terminal
CLOCK_SLACK_S = 1.0  # a record this far in the future is the writer's clock ahead of ours, not "-3 s ago"


def add_parser(commands: Subcommands) -> None:
    """``summary RUN_DIR [--quiet]``."""
    parser = commands.add_parser(NAME, help="status, sessions, lost work and health checks")
    add_run_dir(parser)
    add_quiet(parser)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Read the run once, with a progress bar on a terminal, and print its summary."""
    digest = RunDigest(metrics_path(args.run_dir), within=named_directory(args.run_dir))
    try:
        with progress_bar(err, NAME, unit=BYTES, quiet=args.quiet) as bar:
            digest.refresh(bar.update)
        out.write("".join(line + "\n" for line in summary_lines(digest, now=datetime.now(timezone.utc))))
    finally:
        digest.close()
    out.flush()
    return 0


# (header, columns, right-aligned): 3+16+10+10+8+8+8+11+9 columns and 8 two-space gaps = 99.
_TABLE = (
    ("", 3, False),  # S1, S2…: the session as the pages name it
    ("session id", 16, False),
    ("first step", 10, True),
    ("last step", 10, True),
    ("records", 8, True),
    ("downtime", 8, True),
    ("replayed", 8, True),
    ("end status", 11, False),
    ("discarded", 9, True),
)


def _row(cells: Sequence[str]) -> str:
    return "  ".join(pad(cell, columns, right=right) for cell, (_, columns, right) in zip(cells, _TABLE, strict=True))


def session_rows(sessions: Sequence[Session], status: str) -> list[str]:
    """The sessions table: one row per session, what it ran and what its resume cost.

    A session without ``session_end`` crashed if a later one exists; the last one has the run's
    status (as ``metrics_core.analysis.derived.session_table``).
    """
    rows = [_row([header for header, _, _ in _TABLE])]
    for s in sessions:
        ended = s.end_status or ("crashed" if s.index + 1 < len(sessions) else status) or "no session_end"
        cells = [
            s.name,
            fit_middle(clean(s.session_id), ID_COLUMNS),
            count_text(s.first_step, 10),
            count_text(s.last_step, 10),
            count_text(s.records, 8),
            duration(s.downtime_s),
            count_text(s.steps_replayed, 8),
            clean(ended),
            bytes_text(s.discarded_bytes),
        ]
        rows.append(_row(cells))
    return rows


def summary_lines(digest: RunDigest, *, now: datetime) -> list[str]:
    """What ``summary`` prints, each line at most ``WIDTH`` columns."""
    # summary and runs hold the status rules; imported here so that tail never depends on them.
    from metrics_core.read.run_status import write_failure
    from metrics_core.read.run_summary import summarise

    summary = summarise(digest, now=now)
    status = summary.status
    label = 10
    lines = [f"{'run':<{label}}{fit_middle(clean(str(digest.path)), WIDTH - label)}"]
    if digest.run_ids:
        ids = ", ".join(fit_middle(clean(run_id), 40) for run_id in list(digest.run_ids)[:2])
        extra = f" (+{len(digest.run_ids) - 2:,} more)" if len(digest.run_ids) > 2 else ""
        lines.append(f"{'run id':<{label}}{ids}{extra}")
    state = status
    failure = write_failure(digest)
    if failure is not None:
        state += f" — write failed: {clean(failure.error)}"
    last = summary.last_record_time
    if last is not None:
        age = (now - last).total_seconds()
        when = f"{duration(age)} ago" if age >= -CLOCK_SLACK_S else f"clock ahead by {duration(-age)}"
        state += f" · last record {last:%Y-%m-%d %H:%M:%S}Z ({when})"
    lines.append(f"{'status':<{label}}{state}")
    sessions = digest.sessions
    lines.append(
        f"{'records':<{label}}{summary.records:,} in {summary.sessions:,} session(s) · "
        f"{summary.bad_lines:,} bad line(s) · torn tail {bytes_text(summary.pending_bytes)}"
    )
    if sessions:
        lines += ["", *session_rows(sessions, status), ""]
        lost = digest.lost_work()
        share = MISSING if lost.superseded_share is None else f"{lost.superseded_share:.1%}"
        lines.append(
            f"{'lost work':<{label}}downtime {duration(lost.downtime_s)} · "
            f"{count_text(lost.steps_replayed)} steps and "
            f"{'≤ ' if lost.tokens_replayed_is_upper_bound else ''}"
            f"{count_text(lost.tokens_replayed)} tokens replayed"
        )
        lines.append(" " * label + f"training time superseded {share} (train windows a later session redid)")
        losses = []
        for value, name in ((summary.train_loss, "train loss"), (summary.val_loss, "val loss")):
            losses.append(
                f"{name} {MISSING}"
                if value is None
                else f"{name} {loss_text(value.value)} (step {count_text(value.step)})"
            )
        lines.append(f"{'last':<{label}}" + " · ".join(losses))
    lines += ["", "checks"]
    by_check: dict[str, list[Finding]] = {}
    for finding in digest.checks():
        by_check.setdefault(finding.check, []).append(finding)
    for check, findings in by_check.items():
        head = f"  [{findings[0].severity}] {check}: "
        lines.append(head + clean(findings[0].message))
        lines += [" " * width(head) + clean(finding.message) for finding in findings[1:6]]
        if len(findings) > 6:
            lines.append(" " * width(head) + f"… and {len(findings) - 6:,} more")
    return [fit(line, WIDTH) for line in lines]
