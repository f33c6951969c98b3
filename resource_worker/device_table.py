"""The worker's devices and their health: the one piece of state its threads share.

Writers: the subscriber thread (scanner snapshots), Allocate (final status
check) and the lifecycle loop (end of a resource plugin instance). Readers:
ListAndWatch streams, GetPreferredAllocation, Allocate and the lifecycle loop.
One condition variable guards all of it and wakes streams on change.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterable

from loguru import logger

from shared.channels.inventory_protocol import InventoryMessage
from shared.node.device_health import DeviceHealth, Health, HealthHistory
from shared.node.device_record import DeviceRecord
from shared.node.driver_status import StatusReading
from shared.resources import Resource


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


def log_level(health: Health) -> str:
    # Alerting on warn must never miss unusable hardware.
    return "INFO" if health is Health.HEALTHY else "WARNING"


def device_fields(advertised: Advertised) -> dict:
    """The keys every record about one device carries."""
    return {"device": advertised.device_id, "health": advertised.health.health.value,
            "status": advertised.health.status.name}


class DeviceTable:
    def __init__(self, resource: Resource, clock: Callable[[], int] = time.monotonic_ns):
        self.resource = resource
        self._clock = clock
        # Guards every attribute below; notified whenever the advertised list changes.
        self._changed = threading.Condition()
        self._history = HealthHistory()
        self._devices: dict[str, Advertised] = {}
        self._generation = 0
        self._wakes = 0  # bumped by wake_all(): ends waits that are not about a change
        self._synced = False
        self._cdi_resolvable = False  # the latest snapshot's: does a CDI spec resolve the annotation's device

    # -- writers ---------------------------------------------------------------------------

    def apply(self, message: InventoryMessage) -> None:
        """Take a scanner snapshot: update records and health, log what changed, wake streams."""
        with self._changed:
            previous = self._devices
            current = self._replace_devices(message.devices)
            self._cdi_resolvable = message.cdi_resolvable
            first_sync = not self._synced
            self._synced = True
        # The first snapshot is announced by `Device exposed` at registration instead.
        if not first_sync:
            self._log_changes(previous, current)

    def check_status(self, device_ids: Iterable[str],
                     read: Callable[[str], StatusReading]) -> dict[str, DeviceHealth]:
        """Allocate's final check: read each device's status now and fold it into the history.

        Reads happen under the lock, so two observations of one device are applied
        in the order they were made. Each is stamped after its read while the
        scanner stamps before its own: a scan observation that the clock calls
        newer was read after this one, and one read before it can never win.
        """
        with self._changed:
            results = {}
            for device_id in device_ids:
                reading = read(device_id)
                results[device_id] = self._history.observe(device_id, reading, self._clock())
            return results

    def forget_history(self) -> None:
        """The resource plugin instance ended (no devices left): the next one starts afresh.

        Devices that a snapshot brought back while the instance was stopping are
        judged again from their own latest reading, as the first observations of
        the new history: nothing advertised rests on the history that was dropped.
        """
        with self._changed:
            self._history.clear()
            self._replace_devices([advertised.record for advertised in self._devices.values()])

    def _replace_devices(self, records: Iterable[DeviceRecord]) -> dict[str, Advertised]:
        """Judge `records` through the history and advertise them; the caller holds the lock."""
        previous = self._devices
        self._devices = {record.device_id: Advertised(record, self._history.observe(
            record.device_id, record.status, record.observed_at_ns)) for record in records}
        if _advertised_view(previous) != _advertised_view(self._devices):
            self._generation += 1
            self._changed.notify_all()
        return self._devices

    # -- readers ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        with self._changed:
            return self._synced

    @property
    def cdi_resolvable(self) -> bool:
        """Whether the scanner's latest check found a CDI spec resolving the annotation's device."""
        with self._changed:
            return self._cdi_resolvable

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
            wakes = self._wakes
            return self._changed.wait_for(
                lambda: self._generation != generation or self._wakes != wakes, timeout) and \
                self._generation != generation

    def wake_all(self) -> None:
        """Wake waiting streams so they notice they must end."""
        with self._changed:
            self._wakes += 1
            self._changed.notify_all()

    # -- logging -----------------------------------------------------------------------------

    def _log_changes(self, previous: dict[str, Advertised], current: dict[str, Advertised]) -> None:
        base = {"resourceName": self.resource.value, **counts(current.values())}
        for device_id in sorted(current.keys() - previous.keys()):
            device = current[device_id]
            logger.log(log_level(device.health.health), "Device appeared in inventory", **base,
                       **device_fields(device))
        for device_id in sorted(previous.keys() - current.keys()):
            logger.warning("Device disappeared from inventory", **base, device=device_id)
        for device_id in sorted(current.keys() & previous.keys()):
            for (before_health, before_status), (health, status) in _state_changes(
                    previous[device_id].health, current[device_id].health):
                logger.log(log_level(health), "Device state changed", **base, device=device_id,
                           health=health.value, status=status.name,
                           previousHealth=before_health.value, previousStatus=before_status.name)


_State = tuple[Health, StatusReading]


def _state_changes(before: DeviceHealth, after: DeviceHealth) -> list[tuple[_State, _State]]:
    """The (previous, new) states to log for one device between two publications.

    A verdict that changed is first shown with the reading that decided it. When
    that read (typically Allocate's) came before the one this scan saw, a recovery
    still shows READY and a fault its code, and a later unreadable read follows as
    a change of its own: an unreadable status never appears as what ended or
    started a fault.
    """
    states = [(before.health, before.status)]
    if after.health is not before.health:
        states.append((after.health, after.decided_by))
    states.append((after.health, after.status))
    return [(old, new) for old, new in itertools.pairwise(states) if old != new]


def _advertised_view(devices: dict[str, Advertised]) -> dict[str, tuple[Health, int | None]]:
    """What the kubelet sees of each device: a change here means a new ListAndWatch message."""
    return {device_id: (a.health.health, a.record.numa_node) for device_id, a in devices.items()}


def counts(devices: Iterable[Advertised]) -> dict[str, int]:
    devices = list(devices)
    healthy = sum(1 for a in devices if a.healthy)
    return {"deviceCount": len(devices), "healthyCount": healthy, "unhealthyCount": len(devices) - healthy}
