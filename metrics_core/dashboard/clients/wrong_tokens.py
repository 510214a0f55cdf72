"""Wrong tokens cost their sender time (``GuessLimit``), counted per client (``guesser``): per user
of this host for a loopback connection, else per address.

Its state is used from the server's event loop only: no lock."""

from __future__ import annotations

import functools
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from metrics_core.dashboard.clients.loopback_peers import Address, peer_uid

LOOPBACK = "loopback"
FORWARDED = "forwarded"


@dataclass(slots=True)
class _Client:
    wrong: int  # wrong tokens so far
    until: float  # no token from this client is checked before this time
    last: float  # when its last wrong token came


@dataclass
class GuessLimit:
    """After ``free`` wrong tokens from a client (``guesser``), its next token is checked only
    after a wait that doubles with each further wrong one, from ``first`` up to ``longest`` seconds;
    a token sent during the wait is not checked (answering at once "right" would let guesses in
    parallel through).  At most ``limit`` clients are kept, the least recently wrong dropped first;
    a client is forgotten ``forget`` seconds after its last wrong token and its wait."""

    free: int = 5
    first: float = 1.0
    longest: float = 60.0  # then one guess a minute per client
    limit: int = 1024
    forget: float = 600.0
    clock: Callable[[], float] = time.monotonic
    _clients: OrderedDict[str, _Client] = field(default_factory=OrderedDict, init=False)  # least recently wrong first
    _last_wait_ends: float = field(default=float("-inf"), init=False)

    def anyone_waits(self) -> bool:
        """Whether some client's wait may not be over: if not, no client needs to be told apart."""
        return bool(self._clients) and self._last_wait_ends > self.clock()

    def wait(self, client: str) -> float:
        """Seconds before a token from ``client`` is checked; 0: now."""
        known = self._clients.get(client) if self._clients else None  # the common case: nobody guessed
        if known is None:
            return 0.0
        now = self.clock()
        if now >= max(known.until, known.last) + self.forget:
            del self._clients[client]
            return 0.0
        return max(known.until - now, 0.0)

    def wrong(self, client: str) -> None:
        """``client`` sent a wrong token: past ``free`` of them, its wait starts (and doubles)."""
        now = self.clock()
        known = self._clients.pop(client, None) or _Client(0, now, now)
        known.wrong += 1
        known.last = now
        extra = known.wrong - self.free
        if extra > 0:
            known.until = now + min(self.first * 2 ** min(extra - 1, 32), self.longest)
            self._last_wait_ends = max(self._last_wait_ends, known.until)
        self._clients[client] = known
        while len(self._clients) > self.limit:
            self._clients.popitem(last=False)

    def __len__(self) -> int:
        return len(self._clients)


def guesser(client: Address | None, server: Address | None) -> str:
    """Whom a request's wrong tokens count against: for a loopback connection the user of this host
    who opened it (``uid:1000``, from ``loopback_peers``), so one user's guesses slow that user
    only; else, or when that socket is not found (not Linux, gone), ``client_key`` of its address.
    An address with port 0 is not a connection's but an ``X-Forwarded-For`` header's, which uvicorn
    believes from loopback, so whatever any user of the node wrote there: all such are one client.
    For a loopback client this asks the kernel (a system call, or where that is refused a read of
    its socket table): ask only when a wait or a wrong token needs the answer."""
    if client and not client[1]:
        return FORWARDED
    key = client_key(client[0] if client else None)
    if key == LOOPBACK and server:
        uid = peer_uid(client, server)
        if uid is not None:
            return f"uid:{uid}"
    return key


@functools.lru_cache(maxsize=256)  # a client sends from the same address every time
def client_key(address: str | None) -> str:
    """The client an address stands for: every loopback address is one (anyone on the host can send
    from any of 127.0.0.0/8), an IPv6 address its /64, any other address itself."""
    if not address:
        return ""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if parsed.is_loopback or (parsed.version == 6 and parsed.ipv4_mapped and parsed.ipv4_mapped.is_loopback):
        return LOOPBACK
    if parsed.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return address
