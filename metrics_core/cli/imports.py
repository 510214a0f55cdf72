"""``python -m metrics_core import tensorboard LOGDIR ROOT [--follow]`` and ``import csv FILE ROOT
--run NAME``: other tools' logs as runs of a root.

The imports are ``metrics_core.imports``'s (``tensorboard_import``, ``csv_import``); this command
reads its options, runs one, and prints its report: what was imported, what was skipped (said
once), where a file is damaged.  ``--follow`` keeps importing until SIGTERM or Ctrl-C, which end
it cleanly: what was read is written, each run's last session ended, its lock released.  Exit
status 0 when done, 1 when a file was damaged or a run refused new data, 2 when refused (one line
on stderr).  TensorBoard is imported only here, when a TensorBoard import runs (the
``tensorboard`` extra).
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from metrics_core.cli.command import interval_arg
from metrics_core.text import clean

if TYPE_CHECKING:
    from metrics_core.cli.command import Subcommands

NAME = "import"
FOLLOW_INTERVAL_S = 1.0


def add_parser(commands: Subcommands) -> None:
    """``import tensorboard LOGDIR ROOT [--follow] [--interval S]`` | ``import csv FILE ROOT --run NAME``."""
    parser = commands.add_parser(NAME, help="TensorBoard logs or a CSV table as runs of a root")
    sources = parser.add_subparsers(dest="source", required=True)
    tensorboard = sources.add_parser(
        "tensorboard", help="every directory of event files under LOGDIR as a run; each event file a session"
    )
    tensorboard.add_argument("logdir", type=Path, help="a TensorBoard logdir")
    tensorboard.add_argument("root", type=Path, help="the runs root to import into (runs keep their logdir paths)")
    tensorboard.add_argument(
        "--follow", action="store_true", help="keep importing as TensorBoard writes, until SIGTERM or Ctrl-C"
    )
    tensorboard.add_argument(
        "--interval",
        type=interval_arg,
        default=FOLLOW_INTERVAL_S,
        help=f"with --follow, seconds between looks at the logdir (default {FOLLOW_INTERVAL_S:g})",
    )
    table = sources.add_parser("csv", help="a CSV table (a step column, numeric columns) as one run")
    table.add_argument("file", type=Path, help="the CSV file")
    table.add_argument("root", type=Path, help="the runs root to import into")
    table.add_argument("--run", required=True, help="the run's name under ROOT")


@contextmanager
def stop_on_sigterm() -> Iterator[threading.Event]:
    """An event set by SIGTERM while the block runs (the previous handler restored after)."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the import ``args.source`` names (module docstring)."""
    if args.source == "csv":
        from metrics_core.imports.csv_import import import_csv

        report = import_csv(args.file, args.root, run=args.run)
    else:
        from metrics_core.imports.tensorboard_import import import_logdir

        if not args.logdir.is_dir():
            err.write(f"error: {clean(str(args.logdir))} is not a directory\n")
            return 2
        with stop_on_sigterm() as stop:
            try:
                report = import_logdir(args.logdir, args.root, follow=args.follow, interval=args.interval, stop=stop)
            except KeyboardInterrupt:
                stop.set()
                raise
    out.write("".join(clean(line) + "\n" for line in report.lines()))
    return 1 if report.problems else 0
