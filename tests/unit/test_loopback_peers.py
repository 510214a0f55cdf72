"""Whom a loopback connection belongs to (``dashboard.clients.loopback_peers``): the kernel asked
both ways (its socket diagnostics, its socket table) about real connections of this process, and
the reading of the table itself on one made line by line as the kernel writes it."""

from __future__ import annotations

import io
import os
import socket
from pathlib import Path

import pytest

from metrics_core.dashboard.clients.loopback_peers import CHUNK, diagnosed_uid, listed_uid, peer_uid, socket_uid
from metrics_core.dashboard.clients.wrong_tokens import guesser

linux = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="the kernel's socket table is Linux's")
WAYS = {"diagnostics": diagnosed_uid, "table": listed_uid, "either": peer_uid}


@linux
@pytest.mark.parametrize("way", WAYS)
def test_a_loopback_connection_is_found_as_its_clients_user_and_a_closed_one_is_not(way: str) -> None:
    """A connection to a listening socket of this process: looked up as the server sees it (the
    client's address, the server's), it is this process's user, its client half-closed too; its
    client closed, it is no one's."""
    uid_of = WAYS[way]
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        with accepted:
            seen = accepted.getpeername(), accepted.getsockname()  # what the ASGI scope's client and server hold
            assert uid_of(*seen) == os.getuid()
            assert way != "either" or guesser(*seen) == f"uid:{os.getuid()}"
            assert uid_of(("127.0.0.1", seen[0][1]), ("127.0.0.2", seen[1][1])) is None  # no such pair
            client.shutdown(socket.SHUT_WR)  # sent all it will: still its process's
            assert uid_of(*seen) == os.getuid()
            client.close()
            assert uid_of(*seen) is None  # no process holds it: its uid is no one's
            assert way != "either" or guesser(*seen) == "loopback"


@linux
@pytest.mark.parametrize("way", WAYS)
def test_a_dual_stack_servers_clients_are_found_over_ipv4_and_ipv6(way: str) -> None:
    """A server listening on ``::`` sees an IPv4 client as ``::ffff:127.0.0.1``: its socket is in
    ``tcp``, that of a dual-stack client in ``tcp6``; an IPv6 client in ``tcp6``."""
    if not socket.has_dualstack_ipv6():
        pytest.skip("no IPv6 here")
    with socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True) as listener:
        port = listener.getsockname()[1]
        for family, address in (
            (socket.AF_INET, "127.0.0.1"),
            (socket.AF_INET6, "::1"),
            (socket.AF_INET6, "::ffff:127.0.0.1"),
        ):
            with socket.socket(family) as client:
                client.connect((address, port))
                accepted, _ = listener.accept()
                with accepted:
                    assert WAYS[way](accepted.getpeername()[:2], accepted.getsockname()[:2]) == os.getuid(), address


def table_line(slot: int, local: str, remote: str, state: str, uid: int) -> bytes:
    """One line of ``/proc/net/tcp`` as the kernel writes it (``tcp4_seq_show``); a time-wait
    entry's (state 06) as ``get_timewait4_sock`` does, with no inode."""
    inode = 0 if state == "06" else slot + 9000
    return (
        f"{slot:4d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid:5d}        0 {inode} "
        f"1 0000000000000000 100 0 0 10 0\n"
    ).encode()


class CountingReads(io.BytesIO):
    """A table that counts the bytes handed out, in reads of at most ``CHUNK`` as the kernel's are."""

    handed = 0

    def read(self, size: int = -1) -> bytes:
        chunk = super().read(min(size, CHUNK))
        self.handed += len(chunk)
        return chunk


def test_the_table_is_read_only_up_to_the_line_even_one_cut_between_reads() -> None:
    """The wanted line is found where a read ends inside it; a closed socket of the same pair
    before it (its uid 0 whoever made it, no inode) is passed over; nothing after the line is read."""
    pair, other = "0100007F:D431 0100007F:2135", "0100007F:D432 0100007F:2135"
    lines = [table_line(n, *other.split(), "01", 1000 + n) for n in range(CHUNK // 150)]
    lines.append(table_line(1, *pair.split(), "06", 0))  # a time-wait entry of the same pair
    head = b"".join(lines)
    head += b" " * ((CHUNK - 20 - len(head)) % CHUNK)  # the wanted line starts 20 bytes before a read ends
    wanted = table_line(2, *pair.split(), "01", 1234)
    rest = b"".join(table_line(n, *other.split(), "01", 7) for n in range(5000))
    table = CountingReads(head + wanted + rest)
    assert socket_uid(table, f" {pair} ".encode()) == 1234
    assert table.handed < len(head) + len(wanted) + CHUNK < len(table.getvalue())
    assert socket_uid(CountingReads(head + rest), f" {pair} ".encode()) is None  # only closed: no one's
