"""The state metrics of the stack, as plain functions of what the watchdog last judged.

A judgement (when a status file is replaced, at each check of supervisord's table) reads the status file
of every process (the same reads the probes use) and keeps those written by the running instance of their
program. A worker that was killed leaves a file naming its old pid: it is not trusted, and its successor's
file replaces it, so a resource never has two `registered` series and its
devices are never counted twice. Status files are the stack's own, but a broken one must not break a
scrape: values of the wrong type are left out (shared.status_records reads them as absent).
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
    DRA_HEALTH_STREAMS,
    DRA_PREPARED_CLAIMS,
    DRA_TAINTED_DEVICES,
    LAST_SCAN,
    READY,
    REGISTERED,
    STREAMS,
    Family,
)
from shared.programs import WORKER_DRA
from shared.resources import Resource
from shared.status_records import DraStatus, ScannerStatus, StatusRecord, WorkerStatus

# The status label's values: the driver's statuses, UNKNOWN for any other number, UNREADABLE without one.
UNKNOWN_STATUS = "UNKNOWN"
UNREADABLE_STATUS = "UNREADABLE"
STATUS_LABELS = frozenset({status.name for status in KernelStatus} | {UNKNOWN_STATUS, UNREADABLE_STATUS})

@dataclasses.dataclass(frozen=True)
class StackView:
    """The trusted status records of the last check: None for a process whose file is missing or stale."""

    scanner: StatusRecord | None
    workers: Mapping[str, StatusRecord | None]
    ready: bool


Sample = tuple[Family, dict[str, str], float]


def status_label(name: Any) -> str:
    """A device's status as the label says it: `UNKNOWN(7)` (an undocumented code) is UNKNOWN."""
    if name in STATUS_LABELS:
        return name
    return UNKNOWN_STATUS if isinstance(name, str) and name.startswith(UNKNOWN_STATUS) else UNREADABLE_STATUS


def _count(value: int | None) -> float | None:
    return None if value is None else float(value)


def _worker_samples(resource: Resource, worker: StatusRecord | None) -> list[Sample]:
    name = resource.value
    if not isinstance(worker, WorkerStatus):
        return [(REGISTERED, {"resource": name}, 0.0), (STREAMS, {"resource": name}, 0.0)]
    samples: list[Sample] = [(REGISTERED, {"resource": name}, 1.0 if worker.registered else 0.0),
                             (STREAMS, {"resource": name}, _count(worker.streams) or 0.0)]
    for health, count in ((Health.HEALTHY, worker.healthy_count), (Health.UNHEALTHY, worker.unhealthy_count)):
        if count is not None:
            samples.append((DEVICES, {"resource": name, "health": health.value}, float(count)))
    for device, state in sorted((worker.devices or {}).items()):
        samples.append((DEVICE_STATUS, {"resource": name, "device": device, "status": status_label(state.status)},
                        1.0))
    return samples


def state_samples(view: StackView) -> list[Sample]:
    samples = [sample for resource in Resource
               for sample in _worker_samples(resource, view.workers.get(resource.process_name))]
    scanner = view.scanner
    if isinstance(scanner, ScannerStatus):
        samples.append((DISCOVERY_FAILING, {}, 1.0 if scanner.discovery_error else 0.0))
        if scanner.stamp is not None and scanner.stamp.time is not None:
            samples.append((LAST_SCAN, {}, scanner.stamp.time))
        if scanner.cdi is not None and scanner.cdi.resolvable is not None:
            samples.append((CDI_SPEC_RESOLVABLE, {}, 1.0 if scanner.cdi.resolvable else 0.0))
    dra = view.workers.get(WORKER_DRA)
    if isinstance(dra, DraStatus):
        for family, value in ((DRA_PREPARED_CLAIMS, dra.prepared_claims), (DRA_HEALTH_STREAMS, dra.health_streams),
                              (DRA_TAINTED_DEVICES, dra.tainted_devices)):
            if value is not None:
                samples.append((family, {}, float(value)))
    samples.append((READY, {}, 1.0 if view.ready else 0.0))
    return samples
