"""``python -m metrics_core export ROOT OUT``: every run of a root as Parquet, one file per run, incrementally.

The export is ``metrics_core.sql.export``'s (``export_root``); this command reads its options and
prints the export's report; on a terminal, stderr shows a bar of the runs' bytes read
(``cli.progress``), which one big run moves too.  Exit status 0 when done, 1 when some run could
not be exported, 2 when refused or failed (one line on stderr).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TextIO

from metrics_core.cli.command import add_cache_dir, add_quiet, cache_home
from metrics_core.cli.progress import BYTES, progress_bar
from metrics_core.text import clean

if TYPE_CHECKING:
    from metrics_core.cli.command import Subcommands

NAME = "export"


def add_parser(commands: Subcommands) -> None:
    """``export ROOT OUT [--cache-dir DIR] [--quiet]``."""
    parser = commands.add_parser(NAME, help="every run's records as Parquet, one file per run, incrementally")
    parser.add_argument("root", help="the runs root: a directory, or s3://bucket/prefix, gs://… or az://container/…")
    parser.add_argument("out", help="the export directory: a local directory, or a bucket prefix (s3://, gs://, az://)")
    add_cache_dir(parser)
    add_quiet(parser)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Bring the export in ``args.out`` up to date with the runs of ``args.root``."""
    from metrics_core.read.column_cache import CachePolicy  # pyarrow: only here
    from metrics_core.sql.export import export_root
    from metrics_core.sql.query import check_cache_outside

    home = cache_home(args)
    check_cache_outside(args.root, home)
    with progress_bar(err, NAME, unit=BYTES, quiet=args.quiet) as bar:
        report = export_root(args.root, args.out, cache=CachePolicy(home), progress=bar.update)
    out.write("".join(clean(line) + "\n" for line in report.lines()))
    return 1 if report.failed else 0
