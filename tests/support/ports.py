"""Loopback TCP ports: a free one to hand a process, and the ones a process listens on."""

from __future__ import annotations

import os
import socket


def _tcp_rows(pid: int) -> list[list[str]]:
    """The rows of /proc/net/tcp{,6} of a process's sockets (its socket fds matched by inode)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                rows += [line.split() for line in list(lines)[1:]]
        except FileNotFoundError:
            continue  # no IPv6 on this host
    return [row for row in rows if row[9] in inodes]


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on (state LISTEN)."""
    return {int(row[1].rsplit(":", 1)[1], 16) for row in _tcp_rows(pid) if row[3] == "0A"}


def connections_to(pid: int, port: int) -> int:
    """How many established TCP connections a process holds to `port` (state ESTABLISHED)."""
    return sum(1 for row in _tcp_rows(pid) if row[3] == "01" and int(row[2].rsplit(":", 1)[1], 16) == port)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
