"""``python -m metrics_core alerts ROOT``: watch a runs root headless and post its alerts to a webhook.

The rules, their evaluation and the delivery are ``metrics_core.alerts``'s (``Alerter``); this
command reads its options (the webhook from ``--webhook``, else ``$METRICS_WEBHOOK``, else the
config's; a URL with a path on the command line is warned of), runs the alerter once (``--once``,
for cron) or until Ctrl-C, and prints each alert as a line.  Exit status 0 when done (or Ctrl-C),
1 when ``--once`` could not deliver everything, 2 for a bad root, config or webhook.
"""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from metrics_core.alerts.alerter import INTERVAL_S, Alerter, load_state, save_state
from metrics_core.alerts.rules import AlertConfig, load_config
from metrics_core.alerts.webhooks import WEBHOOK_VARIABLE, Alert, command_line_warning
from metrics_core.cli.command import interval_arg
from metrics_core.roots.discovery import find_runs
from metrics_core.text import clean

if TYPE_CHECKING:
    from metrics_core.cli.command import Subcommands

NAME = "alerts"
CONFIG_VARIABLE = "METRICS_ALERTS_CONFIG"  # the config file when --config is not given, as the dashboard reads it
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
        help=f"URL to POST alerts to (Slack and Discord URLs get their bodies); else ${WEBHOOK_VARIABLE}, else "
        "the config's webhook; without any, alerts are only printed. On the command line every user of the "
        "machine can read it: prefer the variable or the config",
    )
    parser.add_argument("--config", help=f"a TOML file of rules (README, 'Alerts'); else ${CONFIG_VARIABLE}")
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

    config_file = args.config or os.environ.get(CONFIG_VARIABLE)
    config = load_config(config_file) if config_file else AlertConfig()
    state = Path(args.state) if args.state else None
    firing = load_state(state) if state is not None else None
    webhook = args.webhook or os.environ.get(WEBHOOK_VARIABLE) or None
    alerter = Alerter(args.root, config, webhook=webhook, report=report, firing=firing)
    if args.webhook and (warning := command_line_warning(args.webhook)):
        report(warning)  # once the URL is accepted: a refused one is reported instead
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
