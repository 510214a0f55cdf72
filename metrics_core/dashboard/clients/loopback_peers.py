"""Which user of this host opened a loopback connection: the ``uid`` of its client's socket, as
the kernel tells it (Linux).

An address says nothing of who connected (anyone on the node can send from any of 127.0.0.0/8),
the kernel does: the client's end of a loopback connection is a socket of this host whose local
address is the request's client and whose remote one is the server's, and it knows the user that
made it.  Only a socket a process still holds is believed (its inode is not 0): a closed one
lingers as a time-wait entry whose ``uid`` says 0 (root) whoever made it.  A half-closed one
(``shutdown``) is still its user's.

Asked two ways, cheapest first (``peer_uid``):

* the kernel's socket diagnostics (``NETLINK_SOCK_DIAG``, what ``ss`` uses; no privilege needed):
  one request naming the socket by its address pair, answered from the kernel's hash tables, so
  its cost does not grow with the sockets a head node holds (``diagnosed_uid``);
* where that is refused (a sandbox, a kernel without it), the table of TCP sockets,
  ``/proc/net/tcp`` and ``tcp6`` (``listed_uid``).  The kernel writes it as it is read, a line of
  some 150 bytes a socket, and writing thousands is what costs: it is read a chunk at a time, only
  up to the one line, matched as bytes (the line as the kernel writes that address pair), and only
  that line split.  An IPv4 client is looked for in ``tcp``, then as an IPv4-mapped address in
  ``tcp6`` (a dual-stack client socket).

None when neither knows the socket (not Linux, the socket closed or gone): the caller falls back
to what the address says.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 16  # bytes a read of the table: some 400 sockets' lines
UID_FIELD, INODE_FIELD = (
    4,
    6,
)  # on a table's line after the address pair: st, queues, timer, retrnsmt, uid, timeout, inode
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLMSG_ERROR = 4, 20, 2
NO_COOKIE = 0xFFFFFFFF  # the socket is named by its addresses alone
Address = Sequence  # (host, port), as an ASGI scope's ``client`` and ``server``
IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def peer_uid(client: Address, server: Address, *, tables: Path = Path("/proc/net")) -> int | None:
    """The uid of the TCP socket a process of this host holds whose local address is ``client``
    and remote one ``server``, or None when there is none: the socket diagnostics' answer, or where they
    are refused the socket table's in ``tables``."""
    try:
        return diagnosed_uid(client, server)
    except OSError:
        return listed_uid(client, server, tables=tables)


def diagnosed_uid(client: Address, server: Address) -> int | None:
    """``peer_uid`` as the kernel's socket diagnostics answer it; ``OSError`` when they do not."""
    pair = _pair(client, server)
    if pair is None:
        return None
    (mine, theirs), ports = pair
    mine, theirs = _unmapped(mine), _unmapped(theirs)
    if mine.version != theirs.version:
        return None
    family = socket.AF_INET if mine.version == 4 else socket.AF_INET6
    request = (
        struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
        + struct.pack(">HH", *ports)
        + mine.packed.ljust(16, b"\0")
        + theirs.packed.ljust(16, b"\0")
        + struct.pack("=III", 0, NO_COOKIE, NO_COOKIE)
    )
    if not hasattr(socket, "AF_NETLINK"):
        raise OSError(errno.EAFNOSUPPORT, "no netlink here")
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as kernel:
        kernel.send(struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, 1, 1, 0) + request)  # NLM_F_REQUEST
        kernel.setblocking(False)  # the kernel answers within send: nothing to read is no answer
        answer = kernel.recv(1024)
    kind = struct.unpack_from("=H", answer, 4)[0] if len(answer) >= 20 else None
    if kind == NLMSG_ERROR:
        code = -struct.unpack_from("=i", answer, 16)[0]
        if code == errno.ENOENT:  # no such socket
            return None
        raise OSError(code, "socket diagnostics refused")
    if kind != SOCK_DIAG_BY_FAMILY or len(answer) < 88:
        raise OSError(errno.EPROTO, "socket diagnostics answered in a shape not known here")
    uid, inode = struct.unpack_from("=II", answer, 80)  # inet_diag_msg's
    return uid if inode else None


def listed_uid(client: Address, server: Address, *, tables: Path = Path("/proc/net")) -> int | None:
    """``peer_uid`` as the kernel's socket tables in ``tables`` list it."""
    pair = _pair(client, server)
    if pair is None:
        return None
    (mine, theirs), ports = pair
    for table, addresses in _forms(mine, theirs):
        try:
            with open(tables / table, "rb", buffering=0) as lines:
                uid = socket_uid(lines, _needle(addresses, ports))
        except OSError:
            continue
        if uid is not None:
            return uid
    return None


def socket_uid(lines: BinaryIO, needle: bytes) -> int | None:
    """The ``uid`` on the line of ``lines`` (a ``/proc/net/tcp`` table) that holds ``needle`` (its
    local and remote address as written) and a socket a process holds; reads no further than that
    line."""
    text = b""
    while True:
        at = text.find(needle)
        end = text.find(b"\n", at) if at >= 0 else -1
        if end >= 0:
            fields = text[at + len(needle) : end].split()
            if len(fields) > INODE_FIELD and fields[INODE_FIELD] != b"0" and fields[UID_FIELD].isdigit():
                return int(fields[UID_FIELD])
            text = text[end:]  # a closed socket of the same pair: the live one may follow
            continue
        chunk = lines.read(CHUNK)
        if not chunk:
            return None
        # A line cut by a read's end is whole once the next read is added.
        text = (text[at:] if at >= 0 else text[1 - len(needle) :]) + chunk


def _pair(client: Address, server: Address) -> tuple[tuple[IP, IP], tuple[int, int]] | None:
    """The two addresses and ports, or None when they are not an IP address and a port each."""
    try:
        return (ipaddress.ip_address(client[0]), ipaddress.ip_address(server[0])), (int(client[1]), int(server[1]))
    except (ValueError, TypeError, IndexError):
        return None


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
