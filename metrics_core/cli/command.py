"""What a subcommand of ``python -m metrics_core`` is, and the arguments several of them share.

Every command is a module of this package with the same three names (``Command``): ``NAME``,
``add_parser``, which adds its subparser to the command line, and ``run``, which calls its layer
(``read``, ``alerts``, ``buckets``, ``sql``, ``dashboard``) with the parsed arguments and returns
the exit status.  A new command is a new module and one entry in ``main.COMMANDS``.

Building the command line imports every command module, also for ``tail`` on a training node that
has ``orjson`` alone: a command module imports its layer at the top only when that layer needs
nothing more (``read``, ``alerts``); otherwise inside ``run``.  A command whose options are defined
by an optional dependency (``sync``: pyarrow; ``serve``: the dashboard's settings) takes its
arguments unparsed (``pass_through``) and parses them when it runs.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]

PROG = "python -m metrics_core"


class Command(Protocol):
    """A command module (module docstring)."""

    NAME: str

    def add_parser(self, commands: Subcommands) -> None:
        """Add the command's subparser, named ``NAME``, with its help and arguments."""

    def run(self, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
        """Run the command; the exit status.  ``MetricsError``, Ctrl-C and a closed pipe are
        ``main``'s to report."""


def interval_arg(text: str) -> float:
    """A command's ``--interval``: a positive, finite number of seconds."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def add_run_dir(parser: argparse.ArgumentParser) -> None:
    """The ``run_dir`` positional of the commands that read one run."""
    parser.add_argument("run_dir", help="a run directory, or its metrics.jsonl")


def add_cache_dir(parser: argparse.ArgumentParser) -> None:
    """``--cache-dir``, for the commands that parse whole roots (``export``, ``query``)."""
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where parsed runs (and a root's export, for query) are cached: default "
        "$METRICS_CACHE_DIR, else $XDG_CACHE_HOME/metrics_core or ~/.cache/metrics_core",
    )


def cache_home(args: argparse.Namespace) -> Path:
    """The cache directory: ``--cache-dir``, else this environment's default."""
    from metrics_core.read.column_cache import default_directory

    return Path(args.cache_dir if args.cache_dir is not None else default_directory(os.environ))


def pass_through(commands: Subcommands, name: str, *, help: str) -> None:
    """A subparser that takes every argument after ``name`` unparsed, as ``args.argv`` (options
    and ``--help`` included), for a command that parses them itself when it runs."""
    # No prefix characters: this parser sees no option, so each argument, "--help" too, is a
    # positional, and REMAINDER keeps them all in order ("--" included).
    parser = commands.add_parser(name, add_help=False, prefix_chars="\0", help=help)
    parser.add_argument("argv", nargs=argparse.REMAINDER)


def add_quiet(parser: argparse.ArgumentParser) -> None:
    """``--quiet``, for the commands that draw a progress bar on a terminal (``cli.progress``)."""
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar, even on a terminal")
