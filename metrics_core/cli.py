"""``python -m metrics_core tail|summary RUN_DIR``: a run in the terminal, through ssh or a log file.

Every record is one plain, newline-terminated line (no carriage returns, no colours), so the
output reads the same live, in ``less`` and in a file.  Both commands use ``RunReader``: torn
tails are not printed until complete and bad lines are skipped, exactly as in the dashboard.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

import pandas as pd

from metrics_core.analysis import lost_work, session_table, tokens_per_second
from metrics_core.diagnostics import diagnose_reader
from metrics_core.errors import MetricsError
from metrics_core.reader import RunReader
from metrics_core.runs import run_status


def _number(value: Any, spec: str) -> str:
    return "–" if value is None or pd.isna(value) else format(value, spec)


def _rate(value: Any) -> str:
    if value is None or pd.isna(value):
        return "–"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{unit}"
    return f"{value:.0f}"


def _describe(event: str, row: pd.Series) -> str:
    get = row.get
    if event == "train":
        skips, clip = get("skipped_updates_in_window"), get("clipped_fraction")
        return (f"loss {_number(get('train_loss'), '.4f')}  lr {_number(get('lr'), '.2e')}  "
                f"skips {_number(skips, '.0f')}  clip {_number(clip, '.2f')}  "
                f"tok/s {_rate(get('tokens_per_s'))}")  # fmt: skip
    if event == "validation":
        return f"val_loss {_number(get('val_loss'), '.4f')}  val_tokens {_number(get('val_tokens'), ',.0f')}"
    if event == "session_start":
        return (f"discarded {_number(get('discarded_bytes'), '.0f')} B  "
                f"resumed from {_number(get('resumed_from_step'), '.0f')}")  # fmt: skip
    if event == "session_end":
        error = get("error")
        return f"status {get('status')}" + (f"  ({error})" if isinstance(error, str) else "")
    if event == "checkpoint":
        return f"path {get('path')}" if isinstance(get("path"), str) else ""
    return ""


def new_lines(reader: RunReader, printed: dict[str, int], events: Sequence[str] | None = None) -> list[str]:
    """Lines for the records not printed yet (``printed`` counts per event, updated), in time order.

    The reader keeps records per event; equal times (a coarse clock) fall back to step, then to the
    order in which the events first appeared in the file.
    """
    numbers = {session.session_id: session.index + 1 for session in reader.sessions}
    rows: list[tuple[pd.Timestamp, int, int, int, str]] = []
    for rank, event in enumerate(reader.events):
        if events and event not in events:
            continue
        frame = reader.frame(event)
        if event == "train":
            frame = frame.assign(tokens_per_s=tokens_per_second(frame))
        start, printed[event] = printed.get(event, 0), len(frame)
        for position, row in frame.iloc[start:].iterrows():
            stamp = row["time"].strftime("%Y-%m-%d %H:%M:%S")
            text = (f"{stamp}Z  S{numbers[row['session_id']]}  {event:<13} step {row['step']:>9}  "
                    f"{_describe(event, row)}").rstrip()  # fmt: skip
            rows.append((row["time"], row["step"], rank, position, text))
    return [row[-1] for row in sorted(rows, key=lambda row: row[:4])]


def tail(reader: RunReader, out: TextIO, *, follow: bool, events: Sequence[str] | None, interval: float) -> None:
    printed: dict[str, int] = {}
    reader.refresh()
    while True:
        for line in new_lines(reader, printed, events):
            out.write(line + "\n")
        out.flush()
        if not follow:
            return
        time.sleep(interval)
        reader.refresh()


def summary(reader: RunReader, out: TextIO) -> None:
    reader.refresh()
    status = run_status(reader, now=datetime.now(timezone.utc))
    train = reader.frame("train")
    out.write(f"{reader.path}: {status}, {len(reader.sessions)} session(s), {reader.records} records\n\n")
    table = session_table(reader.sessions, train, status)
    out.write(table.to_string(index=False) + "\n\n")
    lost = lost_work(reader.sessions, train, reader.superseded("train"))
    share = "–" if lost.superseded_share is None else f"{lost.superseded_share:.1%}"
    out.write(f"lost work: downtime {lost.downtime_s:,.0f} s, {lost.steps_replayed:,} steps and "
              f"{lost.tokens_replayed:,} tokens replayed, {share} of training time superseded\n\n")  # fmt: skip
    for finding in diagnose_reader(reader):
        out.write(f"[{finding.severity}] {finding.check}: {finding.message}\n")


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="python -m metrics_core", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    tail_cmd = commands.add_parser("tail", help="print records as lines; --follow to keep printing new ones")
    tail_cmd.add_argument("run_dir")
    tail_cmd.add_argument("--follow", "-f", action="store_true")
    tail_cmd.add_argument("--event", action="append", help="only this event (repeatable)")
    tail_cmd.add_argument("--interval", type=float, default=1.0, help="seconds between checks with --follow")
    summary_cmd = commands.add_parser("summary", help="sessions table, lost work, status and diagnostics")
    summary_cmd.add_argument("run_dir")
    args = parser.parse_args(argv)
    try:
        reader = RunReader(args.run_dir)
        if args.command == "tail":
            tail(reader, out, follow=args.follow, events=args.event, interval=args.interval)
        else:
            summary(reader, out)
    except MetricsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, BrokenPipeError):
        return 0
    return 0
