"""``python -m metrics_core alerts ROOT``: watch a runs root headless and post its alerts to a webhook.

The rules, their evaluation and the delivery are ``metrics_core.alerts``'s (``Alerter``); this
command reads its options, runs the alerter once (``--once``, for cron) or until Ctrl-C, and
prints each alert as a line.  Exit status 0 when done (or Ctrl-C), 1 when ``--once`` could not
deliver everything, 2 for a bad root, config or webhook.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from metrics_core.alerts.evaluator import INTERVAL_S, Alerter, load_state, save_state
from metrics_core.alerts.rules import AlertConfig, load_config
from metrics_core.alerts.webhooks import Alert
from metrics_core.cli.command import interval_arg
from metrics_core.roots.discovery import find_runs
from metrics_core.text import clean

if TYPE_CHECKING:
    from metrics_core.cli.command import Subcommands

NAME = "alerts"
ONCE_DELIVERY_S = 60.0  # how long ``alerts --once`` keeps retrying a receiver that is down


def add_parser(commands: Subcommands) -> None:
    """``alerts ROOT --webhook URL [--config FILE] [--interval S] [--once] [--state FILE]``."""
    parser = commands.add_parser(
        NAME,
        help="watch a runs root and post alerts to a webhook (NaN loss, "
        "loss spike, stalled, crashed, failed, thresholds)",
    )
    parser.add_argument("root", help="the runs root: every directory under it holding a metrics.jsonl")
    parser.add_argument(
        "--webhook",
        help="URL to POST alerts to (Slack and Discord URLs get their bodies); "
        "else the config's webhook; without either, alerts are only printed",
    )
    parser.add_argument("--config", help="a TOML file of rules (README, 'Alerts')")
    parser.add_argument(
        "--interval", type=interval_arg, default=INTERVAL_S, help=f"seconds between passes (default {INTERVAL_S:g})"
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help=f"one pass, then deliver (retrying for up to {ONCE_DELIVERY_S:.0f} s) and exit",
    )
    parser.add_argument(
        "--state",
        help="a JSON file of what was alerted on, read at start and kept up to date: "
        "with --once from cron, a condition is posted once, not once per call",
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the alerter on ``args.root`` (module docstring)."""

    def report(message: str) -> None:
        err.write(clean(message) + "\n")
        err.flush()

    def show(alert: Alert) -> None:
        out.write(alert.line() + "\n")
        out.flush()

    config = load_config(args.config) if args.config else AlertConfig()
    state = Path(args.state) if args.state else None
    firing = load_state(state) if state is not None else None
    alerter = Alerter(args.root, config, webhook=args.webhook, report=report, firing=firing)
    find_runs(args.root)  # a root that is not there is an error now, not at the first pass

    def save() -> None:
        if state is not None:
            save_state(state, alerter)

    try:
        if args.once:
            for alert in alerter.tick():
                show(alert)
            delivered = alerter.drain(within=ONCE_DELIVERY_S)
            save()
            if delivered:
                return 0
            report(f"alerts: {alerter.delivery.pending} alert(s) not delivered")
            return 1
        alerter.run(interval=args.interval, stop=threading.Event(), on_alert=lambda alert: (show(alert), save()))
    finally:
        alerter.close()
    return 0
