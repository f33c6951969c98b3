"""One node, one way of serving its NPUs: a stack refuses to start while another live instance serves them the
other way (the device plugin's worker sockets in KUBELET_DEVICE_PLUGIN_PATH, or the DRA plugin's registration
socket). Serving both would let two allocators hand out one NPU twice.

A socket file counts only while something accepts connections on it: a killed instance's leftovers do not.
"""

from __future__ import annotations

import pathlib
import socket

from shared.config import ResourceApi, Settings
from shared.kubelet.plugin_socket import socket_pattern
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


def _device_plugin_sockets(plugin_dir: pathlib.Path) -> list[pathlib.Path]:
    patterns = [socket_pattern(resource) for resource in Resource]
    try:
        names = sorted(entry.name for entry in plugin_dir.iterdir())
    except OSError:
        return []
    return [plugin_dir / name for name in names if any(p.fullmatch(name) for p in patterns)]


def other_mode_conflict(settings: Settings) -> str | None:
    """Why this stack must not start, or None."""
    if settings.resource_api is ResourceApi.DRA:
        live = [path for path in _device_plugin_sockets(settings.kubelet_device_plugin_path) if is_live(path)]
        if live:
            return (f"RESOURCE_API=dra, but a live device plugin serves this node's NPUs ({live[0]}); "
                    "stop it first: a node serves its NPUs one way only")
        return None
    registration = settings.dra_registration_socket
    if registration.exists() and is_live(registration):
        return (f"RESOURCE_API=device-plugin, but a live DRA plugin serves this node's NPUs ({registration}); "
                "stop it first: a node serves its NPUs one way only")
    return None
