"""The alerter: a root's ``AlertEvaluator`` and its webhook ``Delivery``, headless or in a server.

``Alerter`` is what ``python -m metrics_core alerts`` runs and what a dashboard server runs once
per root (``dashboard.alerting``, never once per viewer); what it finds is the evaluator's
(``alerts.evaluator``), how each alert is posted the delivery's (``alerts.webhooks``).  A headless
alerter run once per call (``alerts --once --state FILE``) remembers what is firing in a state
file (``load_state``, ``save_state``), written whole or not at all, so a condition that stays true
is sent once across calls too.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path

import orjson

from metrics_core.alerts.evaluator import AlertEvaluator, RunFollow
from metrics_core.alerts.rules import AlertConfig
from metrics_core.alerts.webhooks import Alert, Delivery
from metrics_core.errors import AlertConfigError
from metrics_core.read.private_files import create_private
from metrics_core.roots.discovery import RunInfo
from metrics_core.text import utf8

INTERVAL_S = 10.0  # between passes: an idle pass over 1,000 runs is a stat each (docs/PERFORMANCE.md)


class Alerter:
    """An ``AlertEvaluator`` and, with a webhook, its ``Delivery``: ``tick`` is one pass and the
    due deliveries, ``run`` repeats it until ``stop`` is set.  A dashboard server runs one per
    root in a thread and shows ``evaluator.firing()`` and ``evaluator.recent()``."""

    def __init__(
        self,
        root: str | Path,
        config: AlertConfig | None = None,
        *,
        webhook: str | None = None,
        report: Callable[[str], None] | None = None,
        firing: Mapping[str, Iterable[str]] | None = None,
        pace: Callable[[], None] | None = None,
        follow: Callable[[RunInfo], RunFollow] | None = None,
        runs: Callable[[], list[RunInfo]] | None = None,
    ) -> None:
        """``pace``, ``follow``, ``runs``: as ``AlertEvaluator``'s."""
        self.config = config or AlertConfig()
        url = webhook or self.config.webhook
        # The webhook first: a URL that cannot be posted to is refused before the root is opened.
        self.delivery = None if url is None else Delivery(url, root=str(root), report=report)
        self.evaluator = AlertEvaluator(root, self.config, firing=firing, pace=pace, follow=follow, runs=runs)

    def tick(self, *, now: datetime | None = None) -> list[Alert]:
        """One pass; firing alerts (and cleared ones with ``notify_cleared``) are queued and the
        due ones posted.  Returns the pass's alerts."""
        alerts = self.evaluator.evaluate(now=now or datetime.now(timezone.utc))
        if self.delivery is not None:
            for alert in alerts:
                if alert.state == "firing" or self.config.notify_cleared:
                    self.delivery.put(alert)
            self.delivery.pump()
        return alerts

    def run(self, *, interval: float, stop: threading.Event, on_alert: Callable[[Alert], None]) -> None:
        """``tick`` every ``interval`` seconds until ``stop`` is set, retrying deliveries between."""
        while not stop.is_set():
            deadline = time.monotonic() + interval
            for alert in self.tick():
                on_alert(alert)
            while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                due = self.delivery.pump() if self.delivery is not None else None
                stop.wait(left if due is None else min(left, max(due, 0.05)))

    def drain(self, *, within: float) -> bool:
        """Retry the queued deliveries for up to ``within`` seconds; True when none is left."""
        deadline = time.monotonic() + within
        while self.delivery is not None and (due := self.delivery.pump()) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, max(due, 0.05)))
        return True

    def close(self) -> None:
        self.evaluator.close()


# -- what an alerter remembers across calls (``alerts --once --state FILE``) ------------------------


def load_state(path: Path) -> dict[str, list[str]]:
    """The conditions alerted on per run, as ``save_state`` left them ({} when there is no file)."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, orjson.JSONDecodeError) as exc:
        raise AlertConfigError(f"{path}: cannot read the alerts state ({exc})") from exc
    firing = data.get("firing") if isinstance(data, dict) else None
    if not (
        isinstance(firing, dict)
        and all(isinstance(v, list) and all(isinstance(c, str) for c in v) for v in firing.values())
    ):
        raise AlertConfigError(f'{path}: not an alerts state file (expected {{"firing": {{run: [condition, ...]}}}})')
    return firing


def save_state(path: Path, alerter: Alerter) -> None:
    """What is firing and was delivered (an undelivered alert is posted again by the next call),
    written whole or not at all (a temporary file renamed over the old one).  The temporary file
    is new, 0600 and never reached through a link (``private_files.create_private``): a link
    another user left at a name of their guessing cannot make this write over one of yours."""
    undelivered = {(a.run, a.condition) for a in alerter.delivery.queued()} if alerter.delivery else set()
    firing = {
        utf8(name): [a.condition for a in alerts if (name, a.condition) not in undelivered]
        for name, alerts in alerter.evaluator.firing().items()
    }
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with os.fdopen(create_private(temporary), "wb") as file:
            file.write(orjson.dumps({"firing": firing}))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
