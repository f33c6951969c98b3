"""Health policy and history: which devices the kubelet may hand out.

The policy is a pure function of (what was last concluded, what was just read):
- READY is Healthy, and is the only reading that clears a fault;
- any other number (BUSY, PROBING, INIT, FAULT, FINISH, unknown) is Unhealthy;
- UNREADABLE says nothing about the device: it keeps an unresolved fault
  Unhealthy, and otherwise falls back to Healthy for compatibility with
  drivers and VFs that never expose a status file.
"""

from __future__ import annotations

import dataclasses
import enum

from shared.status import StatusReading


class Health(enum.Enum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclasses.dataclass(frozen=True)
class DeviceHealth:
    health: Health
    status: StatusReading
    observed_at_ns: int

    @property
    def unresolved_fault(self) -> bool:
        # Unhealthy can only come from a numeric non-READY reading, directly or
        # carried through UNREADABLE readings, so it is exactly "a fault no READY has cleared".
        return self.health is Health.UNHEALTHY


def judge(previous: DeviceHealth | None, reading: StatusReading, observed_at_ns: int) -> DeviceHealth:
    if reading.ready:
        health = Health.HEALTHY
    elif reading.readable:
        health = Health.UNHEALTHY
    elif previous is not None and previous.unresolved_fault:
        health = Health.UNHEALTHY
    else:
        health = Health.HEALTHY
    return DeviceHealth(health, reading, observed_at_ns)


class HealthHistory:
    """The last conclusion per device ID, for the life of one worker's resource plugin.

    Not thread-safe: its owner (DeviceTable) guards it with its lock. Entries
    outlive a device's disappearance, so an ID that comes back inherits them.
    """

    def __init__(self) -> None:
        self._entries: dict[str, DeviceHealth] = {}

    def observe(self, device_id: str, reading: StatusReading, observed_at_ns: int) -> DeviceHealth:
        """Apply a reading unless a newer one was already applied; returns the current conclusion."""
        previous = self._entries.get(device_id)
        if previous is not None and observed_at_ns <= previous.observed_at_ns:
            return previous
        current = judge(previous, reading, observed_at_ns)
        self._entries[device_id] = current
        return current

    def get(self, device_id: str) -> DeviceHealth | None:
        return self._entries.get(device_id)

    def clear(self) -> None:
        self._entries.clear()
