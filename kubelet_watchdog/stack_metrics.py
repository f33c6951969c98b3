"""The state metrics of the stack, as plain functions of what the watchdog's last check saw.

The check reads the status file of every process (the same reads the probes use) and keeps those written by
the running instance of their program. A worker that was killed leaves a file naming its old pid: it is not
trusted, and its successor's file replaces it, so a resource never has two `registered` series and its
devices are never counted twice. Status files are the stack's own, but a broken one must not break a
scrape: values of the wrong type are left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.device_health import Health
from shared.device_status import KernelStatus
from shared.metrics import (
    CDI_SPEC_RESOLVABLE,
    DEVICE_STATUS,
    DEVICES,
    DISCOVERY_FAILING,
    DRA_PREPARED_CLAIMS,
    LAST_SCAN,
    READY,
    REGISTERED,
    STREAMS,
    Family,
)
from shared.programs import WORKER_DRA
from shared.resources import Resource

# The status label's values: the driver's statuses, UNKNOWN for any other number, UNREADABLE without one.
UNKNOWN_STATUS = "UNKNOWN"
UNREADABLE_STATUS = "UNREADABLE"
STATUS_LABELS = frozenset({status.name for status in KernelStatus} | {UNKNOWN_STATUS, UNREADABLE_STATUS})

Status = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class StackView:
    """The trusted status files of the last check: None for a process whose file is missing or stale."""

    scanner: Status | None
    workers: Mapping[str, Status | None]
    ready: bool


Sample = tuple[Family, dict[str, str], float]


def status_label(name: Any) -> str:
    """A device's status as the label says it: `UNKNOWN(7)` (an undocumented code) is UNKNOWN."""
    if name in STATUS_LABELS:
        return name
    return UNKNOWN_STATUS if isinstance(name, str) and name.startswith(UNKNOWN_STATUS) else UNREADABLE_STATUS


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _worker_samples(resource: Resource, worker: Status | None) -> list[Sample]:
    name = resource.value
    samples: list[Sample] = [(REGISTERED, {"resource": name}, 1.0 if worker and worker.get("registered") is True
                              else 0.0)]
    if worker is None:
        return [*samples, (STREAMS, {"resource": name}, 0.0)]
    samples.append((STREAMS, {"resource": name}, _number(worker.get("streams")) or 0.0))
    for health, key in ((Health.HEALTHY, "healthyCount"), (Health.UNHEALTHY, "unhealthyCount")):
        count = _number(worker.get(key))
        if count is not None:
            samples.append((DEVICES, {"resource": name, "health": health.value}, count))
    devices = worker.get("devices")
    if isinstance(devices, Mapping):
        for device, state in sorted(devices.items()):
            status = state.get("status") if isinstance(state, Mapping) else None
            samples.append((DEVICE_STATUS, {"resource": name, "device": str(device), "status": status_label(status)},
                            1.0))
    return samples


def state_samples(view: StackView) -> list[Sample]:
    samples = [sample for resource in Resource
               for sample in _worker_samples(resource, view.workers.get(resource.process_name))]
    if view.scanner is not None:
        samples.append((DISCOVERY_FAILING, {}, 1.0 if view.scanner.get("discoveryError") else 0.0))
        published = _number(view.scanner.get("time"))
        if published is not None:
            samples.append((LAST_SCAN, {}, published))
        cdi = view.scanner.get("cdi")
        if isinstance(cdi, Mapping) and isinstance(cdi.get("resolvable"), bool):
            samples.append((CDI_SPEC_RESOLVABLE, {}, 1.0 if cdi["resolvable"] else 0.0))
    dra = view.workers.get(WORKER_DRA)
    prepared = _number(dra.get("preparedClaims")) if dra is not None else None
    if prepared is not None:
        samples.append((DRA_PREPARED_CLAIMS, {}, prepared))
    samples.append((READY, {}, 1.0 if view.ready else 0.0))
    return samples
