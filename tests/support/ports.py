"""Loopback TCP ports: a free one to hand a process, and the ones a process listens on."""

from __future__ import annotations

import os
import socket


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on: its socket fds matched against /proc/net/tcp{,6} in state LISTEN."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                rows = [line.split() for line in list(lines)[1:]]
        except FileNotFoundError:
            continue  # no IPv6 on this host
        ports |= {int(row[1].rsplit(":", 1)[1], 16) for row in rows if row[3] == "0A" and row[9] in inodes}
    return ports


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
