"""Names of a worker's plugin sockets in the kubelet's device-plugin directory.

Kept apart from the gRPC server: a worker clears its predecessors' sockets at
start-up, before it knows whether its resource has devices (and so whether it
needs gRPC at all).
"""

from __future__ import annotations

import os
import pathlib
import re
import secrets

from shared.resources import Resource

SOCKET_PREFIX = "rbln-device-plugin-"


def socket_pattern(resource: Resource) -> re.Pattern[str]:
    # pid and a random tag: never a prefix of another resource's name (npu vs npu-vf4).
    return re.compile(rf"^{re.escape(SOCKET_PREFIX + resource.slug)}-[0-9]+-[0-9a-f]{{8}}\.sock$")


def new_socket_name(resource: Resource) -> str:
    return f"{SOCKET_PREFIX}{resource.slug}-{os.getpid()}-{secrets.token_hex(4)}.sock"


def remove_stale_sockets(plugin_dir: pathlib.Path, resource: Resource) -> list[str]:
    """Remove sockets an earlier worker of `resource` left behind (it was killed); their names."""
    pattern = socket_pattern(resource)
    removed = []
    try:
        entries = list(plugin_dir.iterdir())
    except OSError:
        return removed
    for path in entries:
        if pattern.match(path.name):
            try:
                path.unlink()
                removed.append(path.name)
            except OSError:
                pass
    return removed
