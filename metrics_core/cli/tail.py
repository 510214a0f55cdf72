"""``python -m metrics_core tail RUN_DIR``: a run's records as lines, on a training node, through ssh or a log.

Runs with the package's own dependency only (orjson): training nodes install ``metrics_core``
alone, so it reads the file through ``metrics_core.read.run_digest`` (the record rules of
``metrics_core.read.records``), never through numpy or pandas.  ``tests/integration/test_cli.py`` runs it in a
venv that holds nothing else.

Output contract: one plain, newline-terminated line per record, in file order (no carriage
returns, no colours), so it reads the same live, in ``less`` and in a file.  A torn last line is
never printed; bad lines are skipped and reported once on stderr with where they are.  ``-n N``
reads backwards from the end, so its cost does not grow with the file; ``-n +K`` starts at the
K-th record, like tail(1).  ``--follow`` prints new complete records as they land and, when the
file is cut or replaced, says so on stderr and prints the new content from its start.  Strings
from the file go through ``text.clean``: a hostile session id cannot move the cursor or recolour
the terminal.  Each line names its session S1, S2… as the pages do
(``session_model.session_name``): ``-n +K`` counts them as it reads; ``-n N`` finds the sessions
before the end it reads by bisection (``read.session_order``), so its cost still does not grow with
the file.  Exit status 0, also on Ctrl-C and when the reader of a pipe goes away (``| head``); 2
when the run does not exist.  A long read before the first line (``-n +K``, a rare ``--event``) shows
a bar on stderr when it is a terminal (``cli.progress``), never in the output.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from metrics_core.cli.command import add_quiet, add_run_dir, interval_arg
from metrics_core.cli.progress import BYTES, progress_bar
from metrics_core.cli.terminal import pad, rate_text, stamp, value_text
from metrics_core.read.records import BadLine
from metrics_core.read.run_digest import batches, follow_file, last_records
from metrics_core.read.run_file import metrics_path, named_directory
from metrics_core.read.session_model import session_name
from metrics_core.read.session_order import session_order
from metrics_core.read.throughput import Rates
from metrics_core.text import MISSING, clean, fit

if TYPE_CHECKING:
    from metrics_core.cli.command import Subcommands

NAME = "tail"


def add_parser(commands: Subcommands) -> None:
    """``tail RUN_DIR [-n N|+K] [--follow] [--event E]... [--interval S] [--quiet]``."""
    parser = commands.add_parser(NAME, help="print records as lines; --follow to keep printing new ones")
    add_run_dir(parser)
    parser.add_argument(
        "-n",
        "--lines",
        type=_lines_arg,
        default=(10, False),
        metavar="N",
        help="the last N records (default 10), or +K: from the K-th record on",
    )
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing records as they arrive")
    parser.add_argument("--event", action="append", help="only this event (repeatable)")
    parser.add_argument("--interval", type=interval_arg, default=1.0, help="seconds between checks with --follow")
    add_quiet(parser)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Print the records asked for, then follow them with ``--follow``."""
    count, from_start = args.lines
    tail(
        metrics_path(args.run_dir),
        out,
        err,
        count=count,
        from_record=count if from_start else None,
        follow=args.follow,
        events=args.event,
        interval=args.interval,
        quiet=args.quiet,
        within=named_directory(args.run_dir),
    )
    out.flush()
    return 0


def _lines_arg(text: str) -> tuple[int, bool]:
    """``-n``: "N" (the last N records) or "+K" (from the K-th record on), as tail(1)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of records like 10 or +10, got {text!r}") from None
    return (max(value, 1), True) if text.startswith("+") else (abs(value), False)


def describe(record: Mapping[str, Any], rate: float | None) -> str:
    """The values of one record, after its base fields, as "name value" pairs."""
    event, get = record["event"], record.get
    if event == "train":
        return (
            f"loss {value_text(get('train_loss'), '.4f')}  lr {value_text(get('lr'), '.2e')}  "
            f"skips {value_text(get('skipped_updates_in_window'), '.0f')}  "
            f"clip {value_text(get('clipped_fraction'), '.2f')}  tok/s {rate_text(rate)}"
        )
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


SESSION_COLUMNS = 4  # S1…S999 and a space; a run of more sessions shifts its lines by a column
_BASE_KEYS = frozenset(
    ("schema_version", "time", "run_id", "session_id", "event", "step", "tokens_seen", "skipped_updates")
)


def _any_text(value: Any) -> str:
    if isinstance(value, str):
        return fit(clean(value), 40)
    if isinstance(value, dict):
        return "{…}"
    if isinstance(value, list):
        return "[…]"
    return MISSING if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def record_line(record: Mapping[str, Any], rate: float | None, session: str) -> str:
    """One record as one plain line: time, session (its name: S1, S2…), event, step, then its values."""
    session = pad(session, SESSION_COLUMNS)
    event = pad(clean(record["event"]), 13)
    return f"{stamp(record['time'])}  {session}  {event} step {record['step']:>9}  {describe(record, rate)}".rstrip()


def skipped_note(skipped: Sequence[BadLine]) -> str:
    """One stderr line: how many bad lines were skipped, where the first few are and why."""
    first = "; ".join(f"{s.where}: {fit(clean(s.reason), 60)}" for s in skipped[:3])
    more = f"; and {len(skipped) - 3:,} more" if len(skipped) > 3 else ""
    return f"tail: skipped {len(skipped):,} bad line(s): {first}{more}"


class _Printer:
    """Writes record lines in file order, computing each train record's tokens/s and numbering the
    sessions on the way (from ``sessions``, the ids of those before the records fed, in order);
    ``before_line`` is called before each line (it takes a progress bar off a shared terminal)."""

    def __init__(
        self,
        out: TextIO,
        keep: Callable[[Mapping[str, Any]], bool],
        before_line: Callable[[], None] = lambda: None,
        sessions: Sequence[str] = (),
    ) -> None:
        self.out, self.keep, self.rates, self.before_line = out, keep, Rates(), before_line
        self.sessions = {session: index for index, session in enumerate(sessions)}

    def feed(self, record: Mapping[str, Any], *, show: bool = True) -> None:
        rate = self.rates(record) if record["event"] == "train" else None
        index = self.sessions.setdefault(record["session_id"], len(self.sessions))
        if show and self.keep(record):
            self.before_line()
            self.out.write(record_line(record, rate, session_name(index)) + "\n")


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
    quiet: bool = False,
    within: Path | None = None,
) -> None:
    """Print the last ``count`` records (or those from the ``from_record``-th on), then follow.

    On a terminal, unless ``quiet``, stderr shows a bar of the bytes read until then
    (``cli.progress``), taken off the line before each record line when stdout is that terminal too.
    ``within``: the directory the file must lie inside (``run_file.open_regular``): the one named.
    """
    wanted = frozenset(events or ())
    keep = (lambda record: record["event"] in wanted) if wanted else (lambda record: True)
    printer = _Printer(out, keep)
    if from_record is not None:
        follower = follow_file(path, within=within)
        skipped: list[BadLine] = []
        seen = 0
        with progress_bar(err, NAME, unit=BYTES, quiet=quiet) as bar:
            if out.isatty():
                printer.before_line = bar.clear  # does nothing once the bar is closed
            for batch in batches(follower, bar.update):
                for record in batch.records:
                    seen += keep(record)
                    printer.feed(record, show=seen >= from_record)
                skipped += batch.skipped
    else:
        with progress_bar(err, NAME, unit=BYTES, quiet=quiet) as bar:
            found = last_records(path, count, keep=keep, progress=bar.update, within=within)
        # The sessions before those read (a few probes), to name them as the pages do.
        printer = _Printer(out, keep, sessions=session_order(path, end=found.end, within=within))
        for record in found.context:
            printer.feed(record, show=False)
        for record in found.records:
            printer.feed(record)
        skipped = found.skipped
        follower = follow_file(path, offset=found.end, line=found.end_line, within=within)
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
