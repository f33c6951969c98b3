"""The worker's devices and their health: the one piece of state its threads share.

Writers: the subscriber thread (scanner snapshots) and Allocate (final status
check). Readers: ListAndWatch streams, GetPreferredAllocation, Allocate and the
lifecycle loop. One condition variable guards all of it and wakes streams on change.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable

from loguru import logger

from resource_worker.health import DeviceHealth, Health, HealthHistory
from shared.inventory import DeviceRecord
from shared.ipc import InventoryMessage
from shared.resources import Resource
from shared.status import StatusReading


@dataclasses.dataclass(frozen=True)
class Advertised:
    record: DeviceRecord
    health: DeviceHealth

    @property
    def device_id(self) -> str:
        return self.record.device_id

    @property
    def healthy(self) -> bool:
        return self.health.health is Health.HEALTHY


def _device_fields(advertised: Advertised) -> dict:
    return {"device": advertised.device_id, "health": advertised.health.health.value,
            "status": advertised.health.status.name}


def _level(advertised: Advertised, default: str = "INFO") -> str:
    # Alerting on warn must never miss unusable hardware.
    return default if advertised.healthy else "WARNING"


class DeviceTable:
    def __init__(self, resource: Resource, clock: Callable[[], int] = time.monotonic_ns):
        self.resource = resource
        self._clock = clock
        # Guards every attribute below; notified whenever the advertised list changes.
        self._changed = threading.Condition()
        self._history = HealthHistory()
        self._devices: dict[str, Advertised] = {}
        self._generation = 0
        self._synced = False

    # -- writers ---------------------------------------------------------------------------

    def apply(self, message: InventoryMessage) -> None:
        """Take a scanner snapshot: update records and health, log what changed, wake streams."""
        with self._changed:
            previous = self._devices
            current = {}
            for record in message.devices:
                health = self._history.observe(record.device_id, record.status, record.observed_at_ns)
                current[record.device_id] = Advertised(record, health)
            changed = _advertised_view(previous) != _advertised_view(current)
            first_sync = not self._synced
            self._devices = current
            self._synced = True
            if changed:
                self._generation += 1
                self._changed.notify_all()
        if not first_sync:
            self._log_changes(previous, current)

    def check_status(self, device_ids: Iterable[str],
                     read: Callable[[str], StatusReading]) -> dict[str, DeviceHealth]:
        """Allocate's final check: read each device's status now and fold it into the history.

        Reads happen under the lock so that two observations of one device are
        stamped and applied in the order they were made.
        """
        with self._changed:
            results = {}
            for device_id in device_ids:
                observed_at = self._clock()
                results[device_id] = self._history.observe(device_id, read(device_id), observed_at)
            return results

    def forget_history(self) -> None:
        """The resource plugin instance ends (no devices left): the next one starts afresh."""
        with self._changed:
            self._history.clear()

    # -- readers ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        with self._changed:
            return self._synced

    def devices(self) -> list[Advertised]:
        with self._changed:
            return sorted(self._devices.values(), key=lambda a: a.device_id)

    def lookup(self, device_ids: Iterable[str]) -> dict[str, Advertised | None]:
        with self._changed:
            return {device_id: self._devices.get(device_id) for device_id in device_ids}

    def snapshot(self) -> tuple[int, list[Advertised]]:
        with self._changed:
            return self._generation, sorted(self._devices.values(), key=lambda a: a.device_id)

    def wait_for_change(self, generation: int, timeout: float) -> bool:
        """True once the advertised list differs from `generation`; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._generation != generation, timeout)

    def wake_all(self) -> None:
        """Wake waiting streams so they notice they must end."""
        with self._changed:
            self._changed.notify_all()

    # -- logging -----------------------------------------------------------------------------

    def _log_changes(self, previous: dict[str, Advertised], current: dict[str, Advertised]) -> None:
        base = {"resourceName": self.resource.value, **counts(current.values())}
        for device_id in sorted(current.keys() - previous.keys()):
            device = current[device_id]
            logger.log(_level(device), "Device appeared in inventory", **base, **_device_fields(device))
        for device_id in sorted(previous.keys() - current.keys()):
            logger.warning("Device disappeared from inventory", **base, device=device_id)
        for device_id in sorted(current.keys() & previous.keys()):
            before, after = previous[device_id].health, current[device_id].health
            if (before.health, before.status) != (after.health, after.status):
                logger.log(_level(current[device_id]), "Device state changed", **base,
                           **_device_fields(current[device_id]),
                           previousHealth=before.health.value, previousStatus=before.status.name)


def _advertised_view(devices: dict[str, Advertised]) -> dict[str, tuple[Health, int | None]]:
    """What the kubelet sees of each device: a change here means a new ListAndWatch message."""
    return {device_id: (a.health.health, a.record.numa_node) for device_id, a in devices.items()}


def counts(devices: Iterable[Advertised]) -> dict[str, int]:
    devices = list(devices)
    healthy = sum(1 for a in devices if a.healthy)
    return {"deviceCount": len(devices), "healthyCount": healthy, "unhealthyCount": len(devices) - healthy}
