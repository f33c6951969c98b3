"""What tests see of the kubelet simulator: snapshots of its resources and of the Register calls it received."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

from shared.kubelet.deviceplugin.v1beta1 import api_pb2


class DeviceView(NamedTuple):
    health: str
    numa_nodes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ResourceView:
    """What the kubelet knows about one resource; a snapshot, never changed in place."""

    name: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    """As answered by GetDevicePluginOptions when the resource last registered."""
    devices: Mapping[str, DeviceView]
    """The last ListAndWatch message, kept after the stream ends."""
    connected: bool
    """False once the ListAndWatch stream ended (or the kubelet stopped), until a new Register."""
    updates: int
    """ListAndWatch messages received since the last Register."""
    registrations: int
    """Accepted Register calls for this resource."""

    @property
    def health(self) -> dict[str, str]:
        return {device: view.health for device, view in self.devices.items()}


@dataclasses.dataclass(frozen=True)
class RegistrationRecord:
    request: api_pb2.RegisterRequest
    time: float
    """time.time() when Register was received."""
    error: str | None
    """The error Register answered with; None when accepted."""
