"""What every connection to the watchdog's two ports (the health service and /metrics) is held to, on the
process's one event loop (shared/supervision/loop_thread.py) (docs/security.md#the-ports).

Anything that can reach the pod's IP can open connections to both ports, so no client gets a thread, a
call slot or time of its own: each connection is a few objects of this loop, and
- it must be done within a total deadline from its accept, however it trickles its bytes in or reads
  the answer: then it is closed, whatever it is doing;
- a port holds a bounded number of connections; when it is full, the least recently active connection
  (the longest silent) is closed to admit the new one, so that a fresh probe always gets in: holding the
  port takes opening connections faster than the probe does, and each one is gone by its deadline.

The loop sleeps in epoll without a timeout when no connection is open: an idle node pays nothing.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import random
import resource
import socket
import threading
from collections.abc import Callable

from loguru import logger

# Descriptors the process keeps for everything else (files, supervisord, inotify, grpc's own).
_RESERVED_DESCRIPTORS = 256
# What a port has at least, whatever the limit: a probe must still get in.
_MIN_PORT_DESCRIPTORS = 16
# Connections the kernel keeps waiting for an accept (capped by net.core.somaxconn, 4096 by default): a
# burst of reconnecting clients must not drop a probe's SYN, whose retransmission comes a second later.
LISTEN_BACKLOG = 4096
# Each connection's deadline is shortened by up to this share, at random: connections opened together
# (a thousand held by one client) then end spread over a second instead of all at once, and so do their
# reopenings, which would otherwise arrive as one burst.
DEADLINE_SPREAD = 0.2


# Descriptors the ports' connection tables hold between them (ConnectionTable).
_claimed_descriptors = 0
# Guards `_claimed_descriptors`.
_descriptors_lock = threading.Lock()


def _claim_descriptors(wanted: int) -> int:
    """Descriptors one port may have for its connections, at most `wanted`, out of what the other ports
    have not claimed: the ports share the process's limit. The soft limit is raised towards the hard one
    first, so that a full port closes its oldest connection instead of failing its accepts (asyncio then
    stops accepting for a second, and every other open of the process fails too: status files, supervisord)."""
    global _claimed_descriptors
    with _descriptors_lock:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        needed = _claimed_descriptors + wanted + _RESERVED_DESCRIPTORS
        if soft != resource.RLIM_INFINITY and soft < needed:
            raised = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError):
                pass
        room = wanted if soft == resource.RLIM_INFINITY else min(
            wanted, max(_MIN_PORT_DESCRIPTORS, soft - _RESERVED_DESCRIPTORS - _claimed_descriptors))
        _claimed_descriptors += room
        return room


def _release_descriptors(count: int) -> None:
    global _claimed_descriptors
    with _descriptors_lock:
        _claimed_descriptors -= count


class ConnectionTable:
    """The open connections of one port, least recently active first; admitting one into a full table
    closes the first. Its room (`limit`) is claimed from the process's descriptors, `descriptors_each` per
    connection, until `release`."""

    def __init__(self, name: str, limit: int, descriptors_each: int = 1):
        self._name = name
        self._descriptors = _claim_descriptors(limit * descriptors_each)
        self.limit = max(1, self._descriptors // descriptors_each)
        # Only touched on the loop's thread.
        self._open: collections.OrderedDict[GuardedConnection, None] = collections.OrderedDict()
        self.evicted = 0

    def release(self) -> None:
        """The descriptors back to the process, once the port is closed."""
        _release_descriptors(self._descriptors)
        self._descriptors = 0

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, connection: GuardedConnection) -> None:
        while len(self._open) >= self.limit:
            oldest, _ = self._open.popitem(last=False)
            oldest.close()
            if not self.evicted:
                logger.warning("Connection limit reached; closing the least recently active connections",
                               port=self._name, limit=self.limit)
            self.evicted += 1
        self._open[connection] = None

    def touch(self, connection: GuardedConnection) -> None:
        if connection in self._open:
            self._open.move_to_end(connection)

    def remove(self, connection: GuardedConnection) -> None:
        self._open.pop(connection, None)


class GuardedConnection(asyncio.Protocol):
    """A connection of a `ConnectionTable`, closed `deadline` seconds after its accept at the latest
    (`DEADLINE_SPREAD`)."""

    def __init__(self, table: ConnectionTable, deadline: float):
        self._table = table
        self._deadline_seconds = deadline
        self.transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._table.admit(self)
        deadline = self._deadline_seconds * (1 - DEADLINE_SPREAD * random.random())
        self._deadline = asyncio.get_running_loop().call_later(deadline, self.close)

    def data_received(self, data: bytes) -> None:
        self._table.touch(self)
        self.received(data)

    def received(self, data: bytes) -> None:
        """What the client sent."""

    def close(self) -> None:
        """Closes at once, whatever is still to be written: the client had its time."""
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._table.remove(self)
        if self._deadline is not None:
            self._deadline.cancel()
        self.lost()

    def lost(self) -> None:
        """The connection is closed, by either side."""


async def serve(protocol_factory: Callable[[], asyncio.Protocol], sock: socket.socket) -> asyncio.Server:
    """`sock` served on the running loop (asyncio sets the socket's backlog again: to LISTEN_BACKLOG)."""
    return await asyncio.get_running_loop().create_server(protocol_factory, sock=sock, backlog=LISTEN_BACKLOG)


def listening_socket(port: int) -> socket.socket:
    """A socket listening on `port` of every interface: IPv6 and IPv4 at once, IPv4 alone where IPv6 is
    off (as Go's ":port" listens). No SO_REUSEPORT: a second server on the port must fail to bind instead
    of silently answering half of the clients."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so, and without it a reply
            # sent in two writes waits out the client's delayed ACK (40 ms).
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue
            raise
        try:
            # A restarted watchdog binds again while the old connections linger in TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((address, port))
            sock.listen(LISTEN_BACKLOG)
        except OSError as exc:
            sock.close()
            if family == socket.AF_INET6 and exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue
            raise
        sock.setblocking(False)
        return sock
    raise AssertionError("unreachable")
