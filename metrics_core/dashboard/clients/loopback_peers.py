"""Which user of this host opened a loopback connection: the ``uid`` of its client's socket, read
from the kernel's table of TCP sockets (Linux: ``/proc/net/tcp``, ``/proc/net/tcp6``).

An address says nothing of who connected (anyone on the node can send from any of 127.0.0.0/8),
the kernel does: the client's end of a loopback connection is a socket of this host, listed with
the request's client address as its local one, the server's as its remote one, and the user that
made it in its ``uid`` column.  Only an established socket is believed: a closed one lingers as a
time-wait entry whose ``uid`` says 0 (root) whoever made it.

Cost: the kernel writes the table as it is read, a line of some 150 bytes a socket, and a head
node may hold thousands.  So the table is read a chunk at a time and only until the one line is
found, matched as bytes (the line the kernel would write for that address pair, ``_needle``), and
only that line is split; an IPv4 client is looked for in ``tcp``, then as an IPv4-mapped address in
``tcp6`` (a dual-stack client socket).  None when the table is not there (not Linux), the socket is
gone or is not established: the caller falls back to what the address says.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 16  # bytes a read: some 400 sockets' lines
ESTABLISHED = b"01"  # the kernel's TCP_ESTABLISHED, as the ``st`` column writes it
UID_FIELD = 4  # after the address pair: st, tx_queue:rx_queue, tr:tm->when, retrnsmt, uid
Address = Sequence  # (host, port), as an ASGI scope's ``client`` and ``server``
IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def peer_uid(client: Address, server: Address, *, tables: Path = Path("/proc/net")) -> int | None:
    """The uid of the socket of this host whose local address is ``client`` and remote one
    ``server`` (an established TCP connection), or None when there is none."""
    try:
        mine, theirs = ipaddress.ip_address(client[0]), ipaddress.ip_address(server[0])
        ports = int(client[1]), int(server[1])
    except (ValueError, TypeError, IndexError):
        return None
    for table, pair in _forms(mine, theirs):
        try:
            with open(tables / table, "rb", buffering=0) as lines:
                uid = socket_uid(lines, _needle(pair, ports))
        except OSError:
            continue
        if uid is not None:
            return uid
    return None


def socket_uid(lines: BinaryIO, needle: bytes) -> int | None:
    """The ``uid`` on the established socket's line of ``lines`` (a ``/proc/net/tcp`` table) that
    holds ``needle`` (its local and remote address as written); reads no further than that line."""
    text = b""
    while True:
        at = text.find(needle)
        end = text.find(b"\n", at) if at >= 0 else -1
        if end >= 0:
            fields = text[at + len(needle) : end].split()
            if len(fields) > UID_FIELD and fields[0] == ESTABLISHED and fields[UID_FIELD].isdigit():
                return int(fields[UID_FIELD])
            text = text[end:]  # a closed socket of the same pair: the live one may follow
            continue
        chunk = lines.read(CHUNK)
        if not chunk:
            return None
        text = (
            text[at:] if at >= 0 else text[1 - len(needle) :]
        ) + chunk  # a line cut by a chunk's end is whole in the next


def _forms(mine: IP, theirs: IP) -> list[tuple[str, tuple[IP, IP]]]:
    """Where the client's socket may be listed, and as which address pair."""
    mine4, theirs4 = _unmapped(mine), _unmapped(theirs)
    if mine4.version == 6 or theirs4.version == 6:
        return [("tcp6", (mine, theirs))]
    mapped = tuple(ipaddress.IPv6Address(f"::ffff:{address}") for address in (mine4, theirs4))
    return [("tcp", (mine4, theirs4)), ("tcp6", mapped)]


def _unmapped(address: IP) -> IP:
    return (address.ipv4_mapped or address) if address.version == 6 else address


def _needle(pair: tuple[IP, IP], ports: tuple[int, int]) -> bytes:
    """`` local:port remote:port `` as the kernel writes them."""
    local, remote = (f"{_words(address)}:{port:04X}" for address, port in zip(pair, ports, strict=True))
    return f" {local} {remote} ".encode()


def _words(address: IP) -> str:
    """An address as the kernel writes it: each 32-bit word in this machine's byte order, in hex."""
    packed = address.packed
    return "".join(f"{int.from_bytes(packed[at : at + 4], sys.byteorder):08X}" for at in range(0, len(packed), 4))
