"""The sessions the access check hands to browsers in place of the token (``BrowserSessions``).

Its state is used from the server's event loop only: no lock."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class BrowserSessions:
    """The sessions handed to browsers: a random value the server keeps and the cookie carries.  A
    page on another port of the host receives the cookie (cookies are not scoped by port): its
    value opens nothing once it expires or the server restarts, never through a proxy that asks for
    the token, and is not the token.  At most ``limit`` are kept, the oldest dropped first (only
    a request with the token makes one), each for ``lifetime`` seconds."""

    lifetime: float = 7 * 24 * 3600.0  # a browser shows the token again once a week, or after a restart
    limit: int = 256
    clock: Callable[[], float] = time.monotonic
    _expires: OrderedDict[str, float] = field(default_factory=OrderedDict, init=False)  # oldest first: all live alike

    def new(self) -> str:
        """A new session value, valid for ``lifetime`` seconds from now."""
        while len(self._expires) >= self.limit:
            self._expires.popitem(last=False)
        value = secrets.token_urlsafe(32)
        self._expires[value] = self.clock() + self.lifetime
        return value

    def valid(self, value: str | None) -> bool:
        """Whether ``value`` is a session this server handed out and that has not expired."""
        expires = self._expires.get(value) if value else None
        if expires is not None and expires <= self.clock():
            del self._expires[value]
            return False
        return expires is not None

    def __len__(self) -> int:
        return len(self._expires)
