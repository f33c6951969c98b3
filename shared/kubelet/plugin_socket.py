"""The sockets of the kubelet's device-plugin directory: names of a worker's plugin sockets, and which
kubelet.sock is there.

Kept apart from the gRPC server: a worker clears its predecessors' sockets at
start-up, before it knows whether its resource has devices (and so whether it
needs gRPC at all), and the configuration checks that the longest name fits.
"""

from __future__ import annotations

import os
import pathlib
import re

from shared.resources import Resource

SOCKET_PREFIX = "rbln-device-plugin-"
_TAG_BYTES = 4

SocketIdentity = tuple[int, int, int]
"""Device, inode and modification time of a socket file: a socket gets its time when it is bound and keeps it,
so a kubelet that restarts makes a kubelet.sock of another identity even when the inode number is reused."""


def socket_identity(path: pathlib.Path) -> SocketIdentity | None:
    """The identity of the socket at `path`; None when there is none."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_mtime_ns


def socket_pattern(resource: Resource) -> re.Pattern[str]:
    # The whole name: the npu pattern must not match npu-vf4's sockets.
    return re.compile(rf"{re.escape(SOCKET_PREFIX + resource.slug)}-[0-9a-f]{{{2 * _TAG_BYTES}}}\.sock")


def new_socket_name(resource: Resource) -> str:
    """A name no earlier instance had: the kubelet tells instances apart by their socket path. Short,
    because the kubelet's directory and the name must fit a unix socket path together."""
    return _socket_name(resource, os.urandom(_TAG_BYTES).hex())


def longest_socket_name() -> str:
    return max((_socket_name(resource, "f" * 2 * _TAG_BYTES) for resource in Resource), key=len)


def _socket_name(resource: Resource, tag: str) -> str:
    return f"{SOCKET_PREFIX}{resource.slug}-{tag}.sock"


def remove_stale_sockets(plugin_dir: pathlib.Path, resource: Resource) -> list[str]:
    """Remove sockets an earlier worker of `resource` left behind (it was killed); their names."""
    pattern = socket_pattern(resource)
    removed: list[str] = []
    try:
        entries = list(plugin_dir.iterdir())
    except OSError:
        return removed
    for path in entries:
        if pattern.fullmatch(path.name):
            try:
                path.unlink()
                removed.append(path.name)
            except OSError:
                pass
    return removed
