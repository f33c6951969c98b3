"""One node, one way of serving its NPUs: a stack refuses to start while another live instance serves them the
other way (the device plugin's worker sockets in KUBELET_DEVICE_PLUGIN_PATH, or a DRA plugin's registration
socket, by either naming scheme: fixed, or with a pod's UID). Serving both would let two allocators hand out one
NPU twice.

A socket file counts only while something accepts connections on it: a killed instance's leftovers do not.
"""

from __future__ import annotations

import pathlib
import re
import socket
from collections.abc import Sequence

from shared.config import DRA_REGISTRATION_SOCKETS, ResourceApi, Settings
from shared.plugin_socket import socket_pattern
from shared.resources import Resource

_CONNECT_TIMEOUT = 0.5


def is_live(path: pathlib.Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(_CONNECT_TIMEOUT)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


def _live_sockets(directory: pathlib.Path, patterns: Sequence[re.Pattern[str]]) -> list[pathlib.Path]:
    """The sockets in `directory` whose names match a pattern and on which something accepts connections."""
    try:
        names = sorted(entry.name for entry in directory.iterdir())
    except OSError:
        return []
    matching = [directory / name for name in names if any(p.fullmatch(name) for p in patterns)]
    return [path for path in matching if is_live(path)]


def other_mode_conflict(settings: Settings) -> str | None:
    """Why this stack must not start, or None."""
    if settings.resource_api is ResourceApi.DRA:
        live = _live_sockets(settings.kubelet_device_plugin_path, [socket_pattern(resource) for resource in Resource])
        if live:
            return (f"RESOURCE_API=dra, but a live device plugin serves this node's NPUs ({live[0]}); "
                    "stop it first: a node serves its NPUs one way only")
        return None
    live = _live_sockets(settings.kubelet_plugin_registry_path, [DRA_REGISTRATION_SOCKETS])
    if live:
        return (f"RESOURCE_API=device-plugin, but a live DRA plugin serves this node's NPUs ({live[0]}); "
                "stop it first: a node serves its NPUs one way only")
    return None
