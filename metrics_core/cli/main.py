"""``python -m metrics_core tail|summary RUN_DIR``: a run in the terminal, on a training node, through ssh or a log.

(``alerts``, ``export`` and ``query`` live in ``metrics_core.alerts.evaluator`` and ``metrics_core.sql.query``.)

Runs with the package's own dependency only (orjson): training nodes install ``metrics_core``
alone, so both commands read the file through ``metrics_core.read.run_digest`` (the record rules of
``metrics_core.read.records``, the session and replay rules of ``RunReader``), never through numpy or
pandas.  ``tests/test_cli.py`` runs them in a venv that holds nothing else.

Output contract:

* ``tail``: one plain, newline-terminated line per record, in file order (no carriage returns,
  no colours), so it reads the same live, in ``less`` and in a file.  A torn last line is never
  printed; bad lines are skipped and reported once on stderr with where they are.  ``-n N`` reads
  backwards from the end, so its cost does not grow with the file; ``-n +K`` starts at the K-th
  record, like tail(1).  ``--follow`` prints new complete records as they land and, when the file
  is cut or replaced, says so on stderr and prints the new content from its start.
* ``summary``: every line at most ``WIDTH`` columns whatever the file holds ("…" where a value is
  cut), "—" where a value is missing, never ``NaN``/``None``.
* Strings from the file go through ``text.clean``: a hostile session id cannot move the cursor
  or recolour the terminal.
* Exit status 0, also on Ctrl-C and when the reader of a pipe goes away (``| head``); 2 when the
  run does not exist.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from metrics_core.alerts.evaluator import add_command, command
from metrics_core.errors import MetricsError
from metrics_core.read.health import Finding
from metrics_core.read.records import BadLine
from metrics_core.read.run_digest import Rates, RunDigest, batches, follow_file, last_records
from metrics_core.read.run_file import metrics_path
from metrics_core.read.session_model import Session, as_datetime, number
from metrics_core.sql.query import add_commands as add_sql_commands
from metrics_core.sql.query import command as sql_command
from metrics_core.text import clean, fit, fit_middle, width

WIDTH = 100  # summary lines fit an 100-column terminal
MISSING = "—"
ID_COLUMNS = 16  # session ids, shortened in the middle: their ends tell sessions apart
CLOCK_SLACK_S = 1.0  # a record this far in the future is the writer's clock ahead of ours, not "-3 s ago"

# -- formatting ---------------------------------------------------------------------------------


def pad(text: str, columns: int, *, right: bool = False) -> str:
    """``text`` cut or padded to exactly ``columns`` terminal columns."""
    text = fit(text, columns)
    fill = " " * (columns - width(text))
    return fill + text if right else text + fill


def stamp(time_ns: int) -> str:
    """A record's time, to the second, in UTC."""
    return as_datetime(time_ns).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def value_text(value: Any, spec: str) -> str:
    """A numeric field formatted with ``spec``, or "—" when it is missing or not a number."""
    as_number = number(value)
    if as_number is None or not math.isfinite(as_number):
        return MISSING
    return format(as_number, spec)


def count_text(value: int | None, columns: int = 14) -> str:
    """An integer with thousands separators, or in k/M/G/T/P/E when that would not fit ``columns``."""
    if value is None:
        return MISSING
    text = f"{value:,}"
    if len(text) <= columns:
        return text
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return text


def rate_text(value: float | None) -> str:
    if value is None:
        return MISSING
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def bytes_text(value: int | None) -> str:
    if value is None:
        return MISSING
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value} B"


def duration_text(seconds: float | None) -> str:
    """A duration a person reads at a glance: 45 s, 4.2 min, 3.1 h, 2.5 d."""
    if seconds is None or not math.isfinite(seconds):
        return MISSING
    size = abs(seconds)
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if size >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.2g} s" if size < 10 else f"{seconds:.0f} s"


def loss_text(value: float) -> str:
    return f"{value:.4f}" if 1e-3 <= abs(value) < 1e5 else f"{value:.3e}"


# -- tail -------------------------------------------------------------------------------------


def describe(record: Mapping[str, Any], rate: float | None) -> str:
    """The values of one record, after its base fields, as "name value" pairs."""
    event, get = record["event"], record.get
    if event == "train":
        return (f"loss {value_text(get('train_loss'), '.4f')}  lr {value_text(get('lr'), '.2e')}  "
                f"skips {value_text(get('skipped_updates_in_window'), '.0f')}  "
                f"clip {value_text(get('clipped_fraction'), '.2f')}  tok/s {rate_text(rate)}")  # fmt: skip
    if event == "validation":
        return f"val_loss {value_text(get('val_loss'), '.4f')}  val_tokens {value_text(get('val_tokens'), ',.0f')}"
    if event == "session_start":
        discarded = value_text(get("discarded_bytes"), ".0f")
        unit = "" if discarded == MISSING else " B"
        return f"discarded {discarded}{unit}  resumed from {value_text(get('resumed_from_step'), '.0f')}"
    if event == "session_end":
        status, error = get("status"), get("error")
        text = f"status {fit(clean(status), 20) if isinstance(status, str) else MISSING}"
        return text + (f"  ({fit(clean(error), 200)})" if isinstance(error, str) else "")
    if event == "checkpoint":
        path = get("path")
        return f"path {fit(clean(path), 200)}" if isinstance(path, str) else ""
    # Unknown events and config: their own fields, cut so that one record stays one readable line.
    extra = [key for key in record if key not in _BASE_KEYS]
    return fit("  ".join(f"{clean(key)} {_any_text(record[key])}" for key in extra), 200)


_BASE_KEYS = frozenset(("schema_version", "time", "run_id", "session_id", "event", "step", "tokens_seen",
                        "skipped_updates"))  # fmt: skip


def _any_text(value: Any) -> str:
    if isinstance(value, str):
        return fit(clean(value), 40)
    if isinstance(value, dict):
        return "{…}"
    if isinstance(value, list):
        return "[…]"
    return MISSING if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def record_line(record: Mapping[str, Any], rate: float | None) -> str:
    """One record as one plain line: time, session, event, step, then its values."""
    session = pad(fit_middle(clean(record["session_id"]), ID_COLUMNS), ID_COLUMNS)
    event = pad(clean(record["event"]), 13)
    return f"{stamp(record['time'])}  {session}  {event} step {record['step']:>9}  {describe(record, rate)}".rstrip()


def skipped_note(skipped: Sequence[BadLine]) -> str:
    """One stderr line: how many bad lines were skipped, where the first few are and why."""
    first = "; ".join(f"{s.where}: {fit(clean(s.reason), 60)}" for s in skipped[:3])
    more = f"; and {len(skipped) - 3:,} more" if len(skipped) > 3 else ""
    return f"tail: skipped {len(skipped):,} bad line(s): {first}{more}"


class _Printer:
    """Writes record lines in file order, computing each train record's tokens/s on the way."""

    def __init__(self, out: TextIO, keep: Callable[[Mapping[str, Any]], bool]) -> None:
        self.out, self.keep, self.rates = out, keep, Rates()

    def feed(self, record: Mapping[str, Any], *, show: bool = True) -> None:
        rate = self.rates(record) if record["event"] == "train" else None
        if show and self.keep(record):
            self.out.write(record_line(record, rate) + "\n")


def tail(
    path: Path,
    out: TextIO,
    err: TextIO,
    *,
    count: int = 10,
    from_record: int | None = None,
    follow: bool = False,
    events: Sequence[str] | None = None,
    interval: float = 1.0,
) -> None:
    """Print the last ``count`` records (or those from the ``from_record``-th on), then follow."""
    wanted = frozenset(events or ())
    keep = (lambda record: record["event"] in wanted) if wanted else (lambda record: True)
    printer = _Printer(out, keep)
    if from_record is not None:
        follower = follow_file(path)
        skipped: list[BadLine] = []
        seen = 0
        for batch in batches(follower):
            for record in batch.records:
                seen += keep(record)
                printer.feed(record, show=seen >= from_record)
            skipped += batch.skipped
    else:
        found = last_records(path, count, keep=keep)
        for record in found.context:
            printer.feed(record, show=False)
        for record in found.records:
            printer.feed(record)
        skipped = found.skipped
        follower = follow_file(path, offset=found.end, line=found.end_line)
    out.flush()
    if skipped:
        err.write(skipped_note(skipped) + "\n")
    while follow:
        time.sleep(interval)
        skipped = []
        for batch in batches(follower):
            if batch.reset is not None:
                err.write(f"tail: {clean(str(path))}: {batch.reset}; printing it again from its start\n")
                printer = _Printer(out, keep)
            for record in batch.records:
                printer.feed(record)
            skipped += batch.skipped
        out.flush()
        if skipped:
            err.write(skipped_note(skipped) + "\n")
    follower.close()


# -- summary ----------------------------------------------------------------------------------

# (header, columns, right-aligned): 3+16+10+10+8+8+8+11+9 columns and 8 two-space gaps = 99.
_TABLE = (("#", 3, True), ("session", 16, False), ("first step", 10, True), ("last step", 10, True),
          ("records", 8, True), ("downtime", 8, True), ("replayed", 8, True), ("end status", 11, False),
          ("discarded", 9, True))  # fmt: skip


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
        rows.append(_row([
            str(s.index + 1), fit_middle(clean(s.session_id), ID_COLUMNS), count_text(s.first_step, 10),
            count_text(s.last_step, 10), count_text(s.records, 8), duration_text(s.downtime_s),
            count_text(s.steps_replayed, 8), clean(ended), bytes_text(s.discarded_bytes),
        ]))  # fmt: skip
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
        when = f"{duration_text(age)} ago" if age >= -CLOCK_SLACK_S else f"clock ahead by {duration_text(-age)}"
        state += f" · last record {last:%Y-%m-%d %H:%M:%S}Z ({when})"
    lines.append(f"{'status':<{label}}{state}")
    sessions = digest.sessions
    lines.append(f"{'records':<{label}}{summary.records:,} in {summary.sessions:,} session(s) · "
                 f"{summary.bad_lines:,} bad line(s) · torn tail {bytes_text(summary.pending_bytes)}")  # fmt: skip
    if sessions:
        lines += ["", *session_rows(sessions, status), ""]
        lost = digest.lost_work()
        share = MISSING if lost.superseded_share is None else f"{lost.superseded_share:.1%}"
        lines.append(f"{'lost work':<{label}}downtime {duration_text(lost.downtime_s)} · "
                     f"{count_text(lost.steps_replayed)} steps and "
                     f"{'≤ ' if lost.tokens_replayed_is_upper_bound else ''}"
                     f"{count_text(lost.tokens_replayed)} tokens replayed")  # fmt: skip
        lines.append(" " * label + f"training time superseded {share} (train windows a later session redid)")
        losses = []
        for value, name in ((summary.train_loss, "train loss"), (summary.val_loss, "val loss")):
            losses.append(f"{name} {MISSING}" if value is None else
                          f"{name} {loss_text(value.value)} (step {count_text(value.step)})")  # fmt: skip
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


# -- command line -----------------------------------------------------------------------------


def _lines_arg(text: str) -> tuple[int, bool]:
    """``-n``: "N" (the last N records) or "+K" (from the K-th record on), as tail(1)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of records like 10 or +10, got {text!r}") from None
    return (max(value, 1), True) if text.startswith("+") else (abs(value), False)


def interval_arg(text: str) -> float:
    """A command's ``--interval``: a positive, finite number of seconds."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m metrics_core", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    tail_cmd = commands.add_parser("tail", help="print records as lines; --follow to keep printing new ones")
    tail_cmd.add_argument("run_dir", help="a run directory, or its metrics.jsonl")
    tail_cmd.add_argument("-n", "--lines", type=_lines_arg, default=(10, False), metavar="N",
                          help="the last N records (default 10), or +K: from the K-th record on")  # fmt: skip
    tail_cmd.add_argument("--follow", "-f", action="store_true", help="keep printing records as they arrive")
    tail_cmd.add_argument("--event", action="append", help="only this event (repeatable)")
    tail_cmd.add_argument("--interval", type=interval_arg, default=1.0, help="seconds between checks with --follow")
    summary_cmd = commands.add_parser("summary", help="status, sessions, lost work and health checks")
    summary_cmd.add_argument("run_dir", help="a run directory, or its metrics.jsonl")
    add_command(commands)
    commands.add_parser("sync", add_help=False, help="upload a run's complete lines to a bucket as they are written, "
                        "each byte once (needs metrics-core[s3])")  # fmt: skip
    add_sql_commands(commands)
    commands.add_parser(
        "serve", add_help=False, help="the live dashboard, as metrics-dashboard (needs metrics-core[app])"
    )
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run one command; return the exit status (see the module docstring)."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # imports Streamlit: only here, never for tail or summary
        from metrics_core.dashboard.launch import main as serve

        serve(argv[1:])
        return 0
    if argv[:1] == ["sync"]:  # imports pyarrow's S3 client: only here
        try:
            from metrics_core.buckets.sync import main as sync
        except ImportError as exc:
            err.write(f"error: sync needs pyarrow: pip install 'metrics-core[s3]' ({exc})\n")
            return 2
        return sync(argv[1:], out, err)
    args = _parser().parse_args(argv)
    if args.command == "alerts":
        return command(args, out, err)
    if args.command in ("export", "query"):
        return sql_command(args, out, err)
    try:
        path = metrics_path(args.run_dir)
        if args.command == "tail":
            count, from_start = args.lines
            tail(path, out, err, count=count, from_record=count if from_start else None, follow=args.follow,
                 events=args.event, interval=args.interval)  # fmt: skip
        else:
            digest = RunDigest(path)
            try:
                digest.refresh()
                out.write("".join(line + "\n" for line in summary_lines(digest, now=datetime.now(timezone.utc))))
            finally:
                digest.close()
        out.flush()
    except MetricsError as exc:
        err.write(f"error: {clean(str(exc))}\n")
        return 2
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        if out is sys.stdout:
            # The interpreter flushes stdout again at exit, which would fail and print a traceback.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0
