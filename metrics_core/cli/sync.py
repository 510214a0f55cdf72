"""``python -m metrics_core sync RUN_DIR s3://bucket/prefix/RUN``: a run's file into a bucket as it grows.

The uploads, their checks and the following are ``metrics_core.buckets.sync``'s (``RunSync``,
``upload``); this command reads its options and prints a line per part uploaded; on a terminal,
stderr shows a bar of a pass's bytes while its parts go up (``cli.progress``).  It needs
pyarrow (the ``s3`` extra), and its options name figures of the bucket layer, so they are parsed
when it runs (``command.pass_through``): without pyarrow, ``sync`` says what to install in one line.
Exit status 0 when done (or stopped by a signal), 2 on an error, said in one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from metrics_core.cli.command import PROG, add_quiet, add_run_dir, interval_arg, pass_through
from metrics_core.cli.progress import BYTES, progress_bar
from metrics_core.text import clean

if TYPE_CHECKING:
    from metrics_core.buckets.sync import Pass
    from metrics_core.cli.command import Subcommands

NAME = "sync"


def add_parser(commands: Subcommands) -> None:
    """``sync ...``, its arguments parsed by ``run``."""
    pass_through(
        commands,
        NAME,
        help="upload a run's complete lines to a bucket as they are written, each byte once (needs metrics-core[s3])",
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Upload the run's complete lines once, or follow it with ``--follow``."""
    try:  # pyarrow's S3 client: only here
        from metrics_core.buckets import sync
        from metrics_core.buckets.addresses import bucket_filesystem, parse_bucket_url
    except ImportError as exc:
        err.write(f"error: sync needs pyarrow: pip install 'metrics-core[s3]' ({exc})\n")
        return 2
    options = _parser().parse_args(args.argv)

    def on_pass(done: Pass) -> None:
        bar.close()  # the pass's bar ends before its lines; the next pass starts its own
        out.write("".join(f"uploaded {clean(where.url)} ({size:,} bytes)\n" for where, size in done.uploaded))
        out.flush()

    def on_wait(path: Path) -> None:
        err.write(f"sync: waiting for {clean(str(path))} to appear\n")
        err.flush()

    destination = parse_bucket_url(options.destination)
    run_sync = sync.RunSync(destination, bucket_filesystem(destination))
    run_sync.resume()
    with progress_bar(err, NAME, unit=BYTES, quiet=options.quiet) as bar:
        sync.upload(
            run_sync,
            options.run_dir,
            follow=options.follow,
            interval=options.interval,
            on_pass=on_pass,
            on_wait=on_wait,
            progress=bar.update,
        )
    return 0


def _parser() -> argparse.ArgumentParser:
    """The options of ``sync``, which name figures of the bucket layer (imported by ``run`` first)."""
    from metrics_core.buckets.bucket_files import PARTS_DIRNAME
    from metrics_core.buckets.sync import INTERVAL_S, MAX_PART_BYTES

    parser = argparse.ArgumentParser(
        prog=f"{PROG} {NAME}",
        description=(
            "Upload a run's complete lines to a bucket as they are written, each byte once, as parts "
            "that the dashboard and RunReader read as one file."
        ),
    )
    add_run_dir(parser)
    parser.add_argument(
        "destination",
        metavar="s3://BUCKET/PREFIX/RUN (or gs://, az://CONTAINER/…)",
        help=f"the run's place in the bucket: parts go to RUN/{PARTS_DIRNAME}/",
    )
    parser.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help=(
            "keep uploading as the run grows, until its session is over and everything is uploaded, "
            "or Ctrl-C / SIGTERM (both upload what is complete first); waits for a file not there yet"
        ),
    )
    parser.add_argument(
        "--interval",
        type=interval_arg,
        default=INTERVAL_S,
        metavar="S",
        help=(
            f"with --follow, seconds between passes (default {INTERVAL_S:g}). Each pass uploads the lines "
            "completed since the last as one part (parts of at most "
            f"{MAX_PART_BYTES >> 20} MiB for a backlog), so a run makes at most 86,400/S parts a day "
            f"({86400 / INTERVAL_S:,.0f} at the default) however fast it writes, and a complete line "
            "reaches the bucket within S seconds"
        ),
    )
    add_quiet(parser)
    return parser
