"""The node's devices as worker-dra serves them: the scanner's latest snapshot of every resource, with health.

Three subscribers (one per resource, each on its own thread) hand their snapshots in; readers take an
immutable `NodeInventory`. Every snapshot calls `on_change`, which wakes the
slice publisher.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping

from shared import ipc
from shared.device_health import Health, HealthHistory
from shared.inventory import DeviceRecord
from shared.resources import Resource


@dataclasses.dataclass(frozen=True)
class ServedDevice:
    record: DeviceRecord
    resource: Resource
    health: Health
    lifecycle: str = "READY"
    """The driver status the health rests on (READY, FAULT, BUSY, ...; UNREADABLE while none was read): what the
    health stream's message and the slice's taint say of an Unhealthy device."""


@dataclasses.dataclass(frozen=True)
class NodeInventory:
    devices: Mapping[str, ServedDevice]
    """Every device of every resource, by device name."""
    driver_version: str = ""
    cdi_resolvable: bool = False
    """The scanner's check: a spec in CDI_SPEC_DIRS resolves the toolkit's device rebellions.ai/npu=runtime."""
    synced: frozenset[Resource] = frozenset()
    """The resources whose first snapshot has arrived."""

    @property
    def complete(self) -> bool:
        return self.synced == frozenset(Resource)


class InventoryState:
    def __init__(self, on_change: Callable[[], None] = lambda: None):
        self.on_change = on_change
        """Called after every snapshot, on the subscriber's thread."""
        # Guards _messages, _history and _current.
        self._lock = threading.Lock()
        self._messages: dict[Resource, ipc.InventoryMessage] = {}
        self._history = HealthHistory()
        self._current = NodeInventory({})

    def current(self) -> NodeInventory:
        with self._lock:
            return self._current

    def on_inventory(self, message: ipc.InventoryMessage) -> None:
        with self._lock:
            self._messages[message.resource] = message
            devices = {}
            for resource, latest in self._messages.items():
                for record in latest.devices:
                    verdict = self._history.observe(record.device_id, record.status, record.observed_at_ns)
                    devices[record.device_id] = ServedDevice(record, resource, verdict.health,
                                                             verdict.decided_by.name)
            driver = next((m.driver_version for m in self._messages.values() if m.driver_version), "")
            self._current = NodeInventory(devices, driver, message.cdi_resolvable, frozenset(self._messages))
        # Every snapshot: the publisher compares what it would publish with what it did, at no API cost.
        self.on_change()
