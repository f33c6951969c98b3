"""The records of the status files (shared.channels.status_files keeps the files): one dataclass per kind of process.

Writers build a record and `write` it; readers `decode` what `status_files.read_status` returned. The
files cross process boundaries and outlive versions (a worker of the old image may still be running while
the new watchdog reads), so decoding is tolerant field by field, the way an operator would want a broken
file read: a field that is missing (an older writer) or of the wrong type reads as absent (None, or empty),
fields the reader does not know (a newer writer) are ignored, and only a document that is not an object or
names no pid (nothing then says which instance wrote it) decodes to None. No reader indexes a document.
"""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from collections.abc import Mapping
from typing import Any

from shared.channels import status_files
from shared.programs import SCANNER, WORKER_DRA

Document = Mapping[str, Any]


def _typed(value: Any, kinds: type | tuple[type, ...]) -> Any:
    """`value` if it is of `kinds` (a bool is not a number), else None."""
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        return None
    return value if isinstance(value, kinds) else None


def _number(value: Any) -> float | None:
    number = _typed(value, (int, float))
    return None if number is None else float(number)


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(item for item in value if isinstance(item, str)) if isinstance(value, list) else ()


@dataclasses.dataclass(frozen=True)
class Stamp:
    """What `write` adds to every record: which instance wrote it, and when."""

    pid: int
    monotonic: float | None = None
    time: float | None = None

    @classmethod
    def decode(cls, document: Document) -> Stamp | None:
        pid = _typed(document.get("pid"), int)
        if not pid:
            return None
        return cls(pid, _number(document.get("monotonic")), _number(document.get("time")))


@dataclasses.dataclass(frozen=True)
class RefusedSpec:
    path: str | None
    err: str | None


@dataclasses.dataclass(frozen=True)
class CdiCheck:
    """The scanner's latest check of the CDI spec dirs (docs/cdi.md)."""

    device: str | None = None
    resolvable: bool | None = None
    defined_in: tuple[str, ...] = ()
    conflict: tuple[str, ...] = ()
    refused_specs: tuple[RefusedSpec, ...] = ()
    refused_spec_count: int | None = None
    dir_errors: tuple[str, ...] = ()
    spec_dirs: tuple[str, ...] = ()
    annotation: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "resolvable": self.resolvable, "definedIn": list(self.defined_in),
                "conflict": list(self.conflict),
                "refusedSpecs": [{"path": r.path, "err": r.err} for r in self.refused_specs],
                "refusedSpecCount": self.refused_spec_count, "dirErrors": list(self.dir_errors),
                "specDirs": list(self.spec_dirs), "annotation": self.annotation}

    @classmethod
    def decode(cls, document: Any) -> CdiCheck | None:
        if not isinstance(document, Mapping):
            return None
        refused = document.get("refusedSpecs")
        return cls(device=_typed(document.get("device"), str), resolvable=_typed(document.get("resolvable"), bool),
                   defined_in=_strings(document.get("definedIn")), conflict=_strings(document.get("conflict")),
                   refused_specs=tuple(RefusedSpec(_typed(r.get("path"), str), _typed(r.get("err"), str))
                                       for r in (refused if isinstance(refused, list) else ())
                                       if isinstance(r, Mapping)),
                   refused_spec_count=_typed(document.get("refusedSpecCount"), int),
                   dir_errors=_strings(document.get("dirErrors")), spec_dirs=_strings(document.get("specDirs")),
                   annotation=_typed(document.get("annotation"), str))


@dataclasses.dataclass(frozen=True)
class ScannerStatus:
    resources: dict[str, int]
    """Devices found per resource name."""
    discovery_error: str | None = None
    scan_ms: float | None = None
    cdi: CdiCheck | None = None
    stamp: Stamp | None = None
    """None until written (`write` stamps it); always set on a decoded record."""

    def to_json(self) -> dict[str, Any]:
        return {"resources": dict(self.resources), "discoveryError": self.discovery_error, "scanMs": self.scan_ms,
                "cdi": None if self.cdi is None else self.cdi.to_json()}

    @classmethod
    def decode(cls, document: Document, stamp: Stamp) -> ScannerStatus:
        resources = document.get("resources")
        return cls({name: count for name, count in resources.items() if _typed(count, int) is not None}
                   if isinstance(resources, Mapping) else {},
                   _typed(document.get("discoveryError"), str), _number(document.get("scanMs")),
                   CdiCheck.decode(document.get("cdi")), stamp)


@dataclasses.dataclass(frozen=True)
class DeviceState:
    health: str | None
    status: str | None
    """The driver's status name (`READY`, `UNKNOWN(7)`, ...)."""


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    """A device plugin worker's (one per resource name)."""

    resource: str | None = None
    registered: bool | None = None
    streams: int | None = None
    endpoint: str | None = None
    scanned_at: float | None = None
    """The inventory's scan time (monotonic seconds) the worker last applied."""
    device_count: int | None = None
    healthy_count: int | None = None
    unhealthy_count: int | None = None
    cdi_resolvable: bool | None = None
    """What this worker's Allocate goes by: the verdict of the last snapshot it took."""
    devices: dict[str, DeviceState] | None = None
    stamp: Stamp | None = None

    def to_json(self) -> dict[str, Any]:
        return {"resource": self.resource, "registered": self.registered, "streams": self.streams,
                "endpoint": self.endpoint, "scannedAt": self.scanned_at, "deviceCount": self.device_count,
                "healthyCount": self.healthy_count, "unhealthyCount": self.unhealthy_count,
                "cdiResolvable": self.cdi_resolvable,
                "devices": None if self.devices is None else {
                    device: {"health": state.health, "status": state.status} for device, state in self.devices.items()}}

    @classmethod
    def decode(cls, document: Document, stamp: Stamp) -> WorkerStatus:
        devices = document.get("devices")
        return cls(resource=_typed(document.get("resource"), str), registered=_typed(document.get("registered"), bool),
                   streams=_typed(document.get("streams"), int), endpoint=_typed(document.get("endpoint"), str),
                   scanned_at=_number(document.get("scannedAt")), device_count=_typed(document.get("deviceCount"), int),
                   healthy_count=_typed(document.get("healthyCount"), int),
                   unhealthy_count=_typed(document.get("unhealthyCount"), int),
                   cdi_resolvable=_typed(document.get("cdiResolvable"), bool),
                   devices={str(device): DeviceState(_typed(state.get("health"), str), _typed(state.get("status"), str))
                            if isinstance(state, Mapping) else DeviceState(None, None)
                            for device, state in devices.items()} if isinstance(devices, Mapping) else None,
                   stamp=stamp)


@dataclasses.dataclass(frozen=True)
class DraStatus:
    """worker-dra's."""

    registered: bool | None = None
    prepared_claims: int | None = None
    slice_generation: int | None = None
    devices: int | None = None
    health_streams: int | None = None
    """The kubelet's open NodeWatchResources streams."""
    tainted_devices: int | None = None
    """Devices published with the unhealthy taint."""
    stamp: Stamp | None = None

    def to_json(self) -> dict[str, Any]:
        return {"registered": self.registered, "preparedClaims": self.prepared_claims,
                "sliceGeneration": self.slice_generation, "devices": self.devices,
                "healthStreams": self.health_streams, "taintedDevices": self.tainted_devices}

    @classmethod
    def decode(cls, document: Document, stamp: Stamp) -> DraStatus:
        return cls(_typed(document.get("registered"), bool), _typed(document.get("preparedClaims"), int),
                   _typed(document.get("sliceGeneration"), int), _typed(document.get("devices"), int),
                   _typed(document.get("healthStreams"), int), _typed(document.get("taintedDevices"), int), stamp)


StatusRecord = ScannerStatus | WorkerStatus | DraStatus


def record_kind(process: str) -> type[ScannerStatus] | type[WorkerStatus] | type[DraStatus]:
    """The record a process's status file holds: every program but the scanner and worker-dra is a worker."""
    return ScannerStatus if process == SCANNER else DraStatus if process == WORKER_DRA else WorkerStatus


def decode(process: str, document: Any) -> StatusRecord | None:
    """The record of `process` in `document` (module docstring: what is tolerated); None without one."""
    if not isinstance(document, Mapping):
        return None
    stamp = Stamp.decode(document)
    return None if stamp is None else record_kind(process).decode(document, stamp)


def decode_scanner(document: Any) -> ScannerStatus | None:
    """The scanner's record in `document`, whichever instance wrote it."""
    record = decode(SCANNER, document)
    return record if isinstance(record, ScannerStatus) else None


def write(run_dir: pathlib.Path, process: str, record: StatusRecord) -> None:
    """Publish `record` as the status of `process` (stamped with this process's pid and the time)."""
    if not isinstance(record, record_kind(process)):
        raise TypeError(f"{process}'s status is a {record_kind(process).__name__}, not a {type(record).__name__}")
    status_files.write_status(run_dir, process, record.to_json())


class ChangeWriter:
    """Writes `process`'s records, each only if it differs from the last one written: every write wakes the
    watchdog, which reads the file again. Any thread may write."""

    def __init__(self, run_dir: pathlib.Path, process: str):
        self._run_dir = run_dir
        self._process = process
        self._lock = threading.Lock()  # guards _last, and keeps two threads' writes in order
        self._last: StatusRecord | None = None

    def write(self, record: StatusRecord) -> None:
        with self._lock:
            if record != self._last:
                write(self._run_dir, self._process, record)
                self._last = record
