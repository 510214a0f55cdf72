"""``python -m metrics_core serve ...``: the live dashboard, exactly as ``metrics-dashboard ...``.

The server is ``metrics_core.dashboard.launch``'s; its options are the dashboard's
(``dashboard.settings``), which import the dashboard's dependencies, so they are parsed when the
command runs (``command.pass_through``), by the parser of ``metrics-dashboard`` itself: both
commands take the same options and say the same errors.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO

from metrics_core.cli.command import pass_through

if TYPE_CHECKING:
    from metrics_core.cli.command import Subcommands

NAME = "serve"


def add_parser(commands: Subcommands) -> None:
    """``serve ...``, its arguments parsed by ``metrics-dashboard``'s parser."""
    pass_through(commands, NAME, help="the live dashboard, as metrics-dashboard (needs metrics-core[app])")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Serve until the server stops; an option refused is ``SystemExit`` with argparse's message."""
    from metrics_core.dashboard.launch import main  # Streamlit: only here

    main(args.argv)
    return 0
