"""Health policy and history: which devices the kubelet may hand out (docs/node.md#driver-status).

The verdict rests on the last status that could actually be read:
- READY is Healthy, and is the only reading that clears a fault;
- any other number (BUSY, PROBING, INIT, FAULT, FINISH, unknown) is Unhealthy;
- UNREADABLE says nothing about the device: it keeps an unresolved fault
  Unhealthy, and otherwise falls back to Healthy for compatibility with
  drivers and VFs that never expose a status file.
"""

from __future__ import annotations

import dataclasses
import enum

from shared.node.driver_status import UNREADABLE, StatusReading


class Health(enum.Enum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclasses.dataclass(frozen=True)
class DeviceHealth:
    health: Health
    status: StatusReading
    """The latest reading, readable or not: what logs and errors report."""
    decided_by: StatusReading
    """The last readable reading, on which `health` rests; UNREADABLE when none was read yet."""
    observed_at_ns: int


def judge(previous: DeviceHealth | None, reading: StatusReading, observed_at_ns: int) -> DeviceHealth:
    if reading.readable:
        decided_by = reading
    else:
        decided_by = previous.decided_by if previous is not None else UNREADABLE
    healthy = decided_by.ready or not decided_by.readable
    return DeviceHealth(Health.HEALTHY if healthy else Health.UNHEALTHY, reading, decided_by, observed_at_ns)


class HealthHistory:
    """The last conclusion per device ID, for the life of one worker's resource plugin.

    Not thread-safe: its owner (DeviceTable) guards it with its lock. Entries
    outlive a device's disappearance, so an ID that comes back inherits them.
    """

    def __init__(self) -> None:
        self._entries: dict[str, DeviceHealth] = {}

    def observe(self, device_id: str, reading: StatusReading, observed_at_ns: int) -> DeviceHealth:
        """Apply a reading unless one at least as new was already applied; returns the current conclusion."""
        previous = self._entries.get(device_id)
        if previous is not None and observed_at_ns <= previous.observed_at_ns:
            return previous
        current = judge(previous, reading, observed_at_ns)
        self._entries[device_id] = current
        return current

    def clear(self) -> None:
        self._entries.clear()
