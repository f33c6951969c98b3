"""The device nodes a container gets: its NPUs' own nodes and its RSD group's node at /dev/rsd0, each waited
for under DEV_ROOT (a new RSD node appears asynchronously). Allocate and DRA's Prepare give the same ones."""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Sequence

CONTAINER_RSD_PATH = "/dev/rsd0"
DEVICE_PERMISSIONS = "rw"
DEVICE_NODE_TIMEOUT = 5.0
_NODE_POLL = 0.02


@dataclasses.dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = DEVICE_PERMISSIONS


def rsd_host_path(group_id: int) -> str:
    return f"/dev/rsd{group_id}"


def own_node(device_id: str) -> DeviceNode:
    return DeviceNode(f"/dev/{device_id}", f"/dev/{device_id}")


def rsd_node(group_id: int) -> DeviceNode:
    return DeviceNode(CONTAINER_RSD_PATH, rsd_host_path(group_id))


def first_missing(dev_root: pathlib.Path, nodes: Sequence[DeviceNode], timeout: float) -> DeviceNode | None:
    """Wait, bounded by `timeout` for all, until each host node exists under `dev_root`; the first one that
    did not appear, or None."""
    deadline = time.monotonic() + timeout
    for node in nodes:
        path = dev_root / node.host_path.removeprefix("/dev/")
        while not path.exists():
            if time.monotonic() >= deadline:
                return node
            time.sleep(_NODE_POLL)
    return None
