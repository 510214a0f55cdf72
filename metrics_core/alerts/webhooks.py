"""Alerts out of the process: ``Alert`` (a condition of a run that started or stopped holding),
the body a webhook gets for it, and ``Delivery``, which posts each alert until the receiver takes it.

Delivery is at least once per firing alert, in order: a receiver that is down or answers
5xx/408/429 is retried with exponential backoff (``Retry-After`` honoured) until it answers; a 4xx
is final (the request will never be accepted) and reported.  A URL the HTTP client would refuse (a
space or a control character in it, a port that is no number) is refused once, when the delivery
is made, never retried.  A report names a webhook by its scheme and host only (``redacted_url``):
the path of a Slack or Discord URL is its secret, so a URL with a path given on a command line,
which every user of the machine can read, is warned of (``command_line_warning``).  Every request has a timeout.  Slack
and Discord webhook URLs get the bodies those services accept; any other URL gets the generic JSON
body (``webhook_body``).  Text from run files is escaped for the chat services that render markup,
and Discord mentions are disabled.  ``Alert`` lives here, below the rules and the evaluator, because
the rules' config checks its webhook URL with ``webhook_kind``.
"""

from __future__ import annotations

import logging
import math
import re
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import orjson

from metrics_core.errors import AlertConfigError
from metrics_core.text import clean, duration, fit, utf8

MAX_QUEUE = 10_000  # undelivered alerts kept while a receiver is down; the oldest go first
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Alert:
    """A condition of a run that started (``firing``) or stopped (``cleared``) holding."""

    run: str
    condition: str
    state: str  # "firing" | "cleared"
    message: str
    time: datetime
    step: int | None = None

    def line(self) -> str:
        """One plain terminal line; run-file text cleaned."""
        return clean(f"{self.time:%Y-%m-%d %H:%M:%S}Z  {self.state:<7}  {self.run}  {self.condition}: {self.message}")


# -- webhook delivery ----------------------------------------------------------------------------

_DISCORD_HOSTS = ("discord.com", "discordapp.com", "ptb.discord.com", "canary.discord.com")
_DISCORD_MARKUP = str.maketrans({char: "\\" + char for char in "\\*_~`|>#[]()<"})
_SLACK_MARKUP = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_NOT_IN_A_URL = re.compile(r"[\x00-\x20\x7f]")  # what http.client refuses to send, a space included


def webhook_kind(url: str) -> str:
    """``slack``, ``discord`` or ``json``: the body a webhook URL gets, chosen by its host.
    AlertConfigError, naming the URL by its scheme and host only, for a URL that is not http(s) or
    that the HTTP client would refuse to post to (whose error would quote the secret path)."""
    parts = _split(url)
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise AlertConfigError(f"webhook {redacted_url(url)!r}: expected an http:// or https:// URL")
    if _NOT_IN_A_URL.search(url):
        raise AlertConfigError(f"webhook {redacted_url(url)!r}: the URL holds a space or a control character")
    try:
        port_ok = parts.port is None or parts.port >= 0
    except ValueError:  # what urlsplit says of a port that is no number or out of range
        port_ok = False
    if not port_ok:
        raise AlertConfigError(f"webhook {redacted_url(url)!r}: its port is not a number from 0 to 65535")
    host = parts.hostname.lower()
    if host == "hooks.slack.com":
        return "slack"
    if host in _DISCORD_HOSTS and parts.path.startswith("/api/webhooks/"):
        return "discord"
    return "json"


WEBHOOK_VARIABLE = "METRICS_WEBHOOK"  # where a webhook URL stays out of the process's command line


def command_line_warning(url: str) -> str | None:
    """The warning for a webhook URL given on a command line, or None when it has no path: every
    user of the machine reads a command line (``ps``, ``/proc/<pid>/cmdline``), and the path of a
    Slack or Discord URL is its secret.  Names the URL by scheme and host only."""
    parts = _split(url)
    if parts is None or (parts.path in ("", "/") and not parts.query):
        return None
    return (
        f"warning: the webhook {redacted_url(url)} is on the command line, where every user of this machine "
        f"can read it (ps, /proc/<pid>/cmdline): set ${WEBHOOK_VARIABLE} or the alerts config's `webhook` instead"
    )


def redacted_url(url: str) -> str:
    """A webhook URL without its path or user info: the path of a Slack or Discord URL is its secret."""
    parts = _split(url)
    if parts is None:
        return "(not a URL)"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ":?"
    return f"{parts.scheme}://{parts.hostname or ''}{port}/…" if parts.scheme else "(not a URL)"


def _split(url: str) -> urllib.parse.SplitResult | None:
    """``url`` in parts, or None when it cannot be split (an unclosed ``[`` of an IPv6 host)."""
    try:
        return urllib.parse.urlsplit(url)
    except ValueError:
        return None


def webhook_body(url: str, alert: Alert, *, root: str) -> bytes:
    """The POST body for ``alert``: ``{"text"}`` for Slack, ``{"content", "allowed_mentions"}``
    for Discord, else the generic JSON object (docs/FORMAT.md, "Alert webhooks")."""
    kind = webhook_kind(url)
    if kind == "json":
        return orjson.dumps(
            {
                "source": "metrics_core",
                "state": alert.state,
                "run": utf8(alert.run),
                "root": utf8(root),
                "condition": utf8(alert.condition),
                "message": utf8(alert.message),
                "step": alert.step,
                "time": alert.time.isoformat().replace("+00:00", "Z"),
            }
        )
    verb = "" if alert.state == "firing" else "cleared: "
    text = clean(utf8(f"{verb}run {alert.run}: {alert.condition}: {alert.message} (runs root {root})"))
    if kind == "slack":
        return orjson.dumps({"text": fit(text, 3000).translate(_SLACK_MARKUP)})
    return orjson.dumps({"content": fit(text, 1000).translate(_DISCORD_MARKUP), "allowed_mentions": {"parse": []}})


class Delivery:
    """A FIFO of alerts for one webhook, each posted until the receiver takes it; see the module
    docstring.  ``pump`` never sleeps: it sends what is due and says when to call it again."""

    def __init__(
        self,
        url: str,
        *,
        root: str,
        timeout_s: float = 10.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        report: Callable[[str], None] | None = None,
    ) -> None:
        webhook_kind(url)
        self.url, self.root = url, root
        self.timeout_s, self.backoff_s, self.max_backoff_s = timeout_s, backoff_s, max_backoff_s
        self.clock = clock
        self.report = report or _log.warning
        self._queue: deque[Alert] = deque()
        self._due = float("-inf")
        self._wait = backoff_s
        self.stats = {"sent": 0, "failed_attempts": 0, "rejected": 0, "dropped": 0}

    def put(self, alert: Alert) -> None:
        if len(self._queue) >= MAX_QUEUE:
            dropped = self._queue.popleft()
            self.stats["dropped"] += 1
            self.report(f"alerts: {MAX_QUEUE:,} alerts undelivered; dropped the oldest, for {dropped.run!r}")
        self._queue.append(alert)

    @property
    def pending(self) -> int:
        return len(self._queue)

    def queued(self) -> list[Alert]:
        """The alerts not delivered yet, oldest first."""
        return list(self._queue)

    def pump(self) -> float | None:
        """Post the due alerts in order; return the seconds until the next attempt is due, or
        None when nothing is left to send."""
        while self._queue and self.clock() >= self._due:
            alert = self._queue[0]
            failure, retry_after = self._post(alert)
            if failure is None:
                self._queue.popleft()
                self.stats["sent"] += 1
                self._wait = self.backoff_s
            elif retry_after is None:  # refused for good: retrying would be refused again
                self._queue.popleft()
                self.stats["rejected"] += 1
                self.report(f"alerts: {redacted_url(self.url)} refused the alert for {alert.run!r}, dropped: {failure}")
            else:
                self.stats["failed_attempts"] += 1
                wait = max(self._wait, retry_after)
                self._due = self.clock() + wait
                self._wait = min(self._wait * 2, self.max_backoff_s)
                self.report(
                    f"alerts: {redacted_url(self.url)} unreachable ({failure}); {self.pending} alert(s) "
                    f"queued, next try in {duration(wait)}"
                )
        return None if not self._queue else max(self._due - self.clock(), 0.0)

    def _post(self, alert: Alert) -> tuple[str | None, float | None]:
        """(None, None) when delivered; else why, and 0 or the receiver's Retry-After when a retry
        may succeed, None when it cannot."""
        # Imported here: http.client and its email parsers would add to every ``tail`` and ``summary``.
        import http.client
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            self.url,
            data=webhook_body(self.url, alert, root=self.root),
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "metrics-core-alerts"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read(1 << 16)  # the status is the answer; a body that never ends must not hold us
            return None, None
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code}"
            if exc.code >= 500 or exc.code in (408, 429):
                return reason, _retry_after(exc.headers.get("Retry-After"))
            return reason, None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, timeout, DNS, a bad reply
            text = clean(str(getattr(exc, "reason", exc))).replace(self.url, redacted_url(self.url))
            return text[:200] or type(exc).__name__, 0.0


def _retry_after(value: str | None) -> float:
    """A Retry-After header in seconds (its date form is not honoured: 0)."""
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return min(seconds, 3600.0) if math.isfinite(seconds) and seconds > 0 else 0.0
