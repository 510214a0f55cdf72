"""``python -m metrics_core COMMAND ...``: the command line, one module of ``metrics_core.cli`` per command.

``COMMANDS`` lists them (each a ``command.Command``).  ``main`` parses the command line, runs the
command, and ends every command the same way: a ``MetricsError`` is one line on stderr and exit
status 2; Ctrl-C, and a reader of the pipe that went away (``| head``), end it quietly with 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from metrics_core.cli import alerts, export, imports, query, serve, summary, sync, tail
from metrics_core.cli.command import PROG, Command
from metrics_core.errors import MetricsError
from metrics_core.text import clean

COMMANDS: tuple[Command, ...] = (tail, summary, alerts, sync, export, query, serve, imports)
DESCRIPTION = (
    "``python -m metrics_core tail|summary RUN_DIR``: a run in the terminal, on a training node, through ssh or a log."
)


def parser() -> argparse.ArgumentParser:
    """The command line: a subcommand per module of ``COMMANDS``."""
    top = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    commands = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return top


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run one command; return its exit status (module docstring)."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    command = next(command for command in COMMANDS if args.command == command.NAME)
    try:
        return command.run(args, out, err)
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
