"""Allocate: validate the request, check health once, make an RSD group per container, describe the devices.

Kept apart from gRPC: it takes device ID lists and returns plain results, or
raises AllocationError carrying the gRPC status the kubelet should see (docs/kubelet.md#allocate).
What happens along the way goes to an AllocateObserver as plain reports (the servicer logs, traces and
counts them); nothing outside reads inside the results but their nodes and annotations.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from resource_worker.device_table import Advertised, DeviceTable
from shared.cdi.annotation import CdiAnnotation, allocate_annotations
from shared.node.device_health import Health
from shared.node.device_nodes import (
    CONTAINER_RSD_PATH,
    DEVICE_NODE_TIMEOUT,
    DeviceNode,
    first_missing,
    rsd_host_path,
)
from shared.node.device_record import DeviceRecord
from shared.node.driver_status import StatusReading
from shared.node.rsd_group import GroupChange, RsdGroupError, RsdGroups
from shared.observability.hostile_ids import listed, quoted


class ErrorKind(enum.Enum):
    """Why an Allocate was refused; the servicer maps each to a gRPC status code."""

    INVALID_REQUEST = "invalid request"
    UNKNOWN_DEVICE = "unknown device"
    UNHEALTHY_DEVICE = "unhealthy device"
    RSD_GROUP_FAILED = "RSD group failed"
    DEVICE_NODE_MISSING = "device node missing"


class AllocationError(Exception):
    def __init__(self, kind: ErrorKind, message: str, device_ids: Sequence[str] = ()):
        super().__init__(message)
        self.kind = kind
        self.device_ids = list(device_ids)


@dataclasses.dataclass(frozen=True)
class ContainerAllocation:
    devices: tuple[DeviceRecord, ...]
    group: GroupChange
    nodes: tuple[DeviceNode, ...]
    annotations: dict[str, str]
    cdi_resolvable: bool
    """Whether, by the scanner's latest check, a CDI spec resolved the annotation's device."""

    @property
    def device_ids(self) -> list[str]:
        return [d.device_id for d in self.devices]

    @property
    def bus_ids(self) -> list[str]:
        return sorted(d.bus_id for d in self.devices)

    @property
    def rsd_host_path(self) -> str:
        return rsd_host_path(self.group.group_id)


@dataclasses.dataclass(frozen=True)
class GroupReport:
    """A container's RSD group. `made` False: the container shares the group of an identical earlier one, and
    cost nothing (no groups replaced, no rbln-smi calls)."""

    rsd_host_path: str
    made: bool
    replaced_groups: list[int]
    smi_calls: int
    smi_ms: float


@dataclasses.dataclass(frozen=True)
class ContainerReport:
    """One container answered: its devices, its group and what it cost."""

    device_ids: list[str]
    bus_ids: list[str]
    group: GroupReport
    seconds: float
    cdi_annotation: bool
    cdi_resolvable: bool


class ContainerObserver(Protocol):
    def group(self, report: GroupReport) -> None:
        """The container's group is known (made, or shared with an earlier container)."""


class AllocateObserver(Protocol):
    """What one Allocate call tells the outside: logs, spans and metrics are the observer's."""

    def refused(self, requests: Sequence[Sequence[str]], error: AllocationError) -> None:
        """The request failed validation, before any container was worked on."""

    def container(self, device_ids: list[str], bus_ids: list[str]) -> AbstractContextManager[ContainerObserver]:
        """Opened around one container's work; an exception leaving it fails the container."""
        ...

    def answered(self, report: ContainerReport) -> None:
        """A container is done (after its `container` block has closed)."""


def _dedupe(ids: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _refuse_partial_overlaps(containers: Sequence[Sequence[str]]) -> None:
    """A device can be in one RSD group only: two containers may name it only with the very same devices
    (they then share one group), else the second group would take it from the first container's."""
    first_set: dict[str, tuple[int, frozenset[str]]] = {}
    for index, ids in enumerate(containers):
        devices = frozenset(ids)
        for device_id in ids:
            earlier, earlier_devices = first_set.setdefault(device_id, (index, devices))
            if earlier_devices != devices:
                raise AllocationError(ErrorKind.INVALID_REQUEST,
                                      f"device {quoted(device_id)} is requested by containers {earlier} and {index} "
                                      f"with different devices; an RSD group holds each device once", [device_id])


class Allocator:
    def __init__(self, table: DeviceTable, rsd_groups: RsdGroups, dev_root: pathlib.Path,
                 read_status: Callable[[str], StatusReading], node_timeout: float = DEVICE_NODE_TIMEOUT,
                 cdi_annotation: CdiAnnotation = CdiAnnotation.ALWAYS):
        self._table = table
        self._rsd_groups = rsd_groups
        self._dev_root = dev_root
        self._read_status = read_status
        self._node_timeout = node_timeout
        self._cdi_annotation = cdi_annotation

    def allocate(self, requests: Sequence[Sequence[str]], observer: AllocateObserver) -> list[ContainerAllocation]:
        """The whole of one Allocate call: every container's allocation, in request order."""
        try:
            containers = self.validate(requests)
        except AllocationError as exc:
            observer.refused(requests, exc)
            raise
        # Containers naming the same devices share their group: a second change would destroy it.
        made: dict[frozenset[str], ContainerAllocation] = {}
        # The latest scan's verdict, once per call: every container of it is answered alike.
        cdi_resolvable = self._table.cdi_resolvable
        return [self._shared_or_new(devices, made, cdi_resolvable, observer) for devices in containers]

    def _shared_or_new(self, devices: Sequence[Advertised], made: dict[frozenset[str], ContainerAllocation],
                       cdi_resolvable: bool, observer: AllocateObserver) -> ContainerAllocation:
        started = time.monotonic()
        ids = [d.device_id for d in devices]
        bus_ids = sorted(d.record.bus_id for d in devices)
        with observer.container(ids, bus_ids) as container:
            allocation = made.get(frozenset(ids))
            if allocation is None:
                allocation = made[frozenset(ids)] = self.allocate_container(devices, cdi_resolvable)
                change = allocation.group
                group = GroupReport(allocation.rsd_host_path, True, list(change.replaced), change.smi.calls,
                                    round(change.smi.seconds * 1000, 3))
            else:
                group = GroupReport(allocation.rsd_host_path, False, [], 0, 0.0)
            container.group(group)
        observer.answered(ContainerReport(allocation.device_ids, allocation.bus_ids, group,
                                          time.monotonic() - started, bool(allocation.annotations),
                                          allocation.cdi_resolvable))
        return allocation

    def validate(self, requests: Sequence[Sequence[str]]) -> list[list[Advertised]]:
        """Resolve every container's IDs to this resource's devices, and run the final health check."""
        if not requests:
            raise AllocationError(ErrorKind.INVALID_REQUEST, "Allocate request has no container requests")
        resource = self._table.resource.value
        wanted = []
        for index, ids in enumerate(requests):
            if not ids:
                raise AllocationError(ErrorKind.INVALID_REQUEST, f"container request {index} names no device")
            wanted.append(_dedupe(ids))
        _refuse_partial_overlaps(wanted)
        distinct = _dedupe([device_id for ids in wanted for device_id in ids])
        known = self._table.lookup(distinct)
        unknown = [device_id for device_id, device in known.items() if device is None]
        if unknown:
            raise AllocationError(ErrorKind.UNKNOWN_DEVICE, f"unknown device {listed(unknown, quote=True)}: "
                                  f"not a device of {resource}", unknown)
        # One read per distinct device, shared by every container of the request.
        health = self._table.check_status(distinct, self._read_status)
        unhealthy = [device_id for device_id in distinct if health[device_id].health is Health.UNHEALTHY]
        if unhealthy:
            detail = listed([f"{d} is Unhealthy ({health[d].status.name})" for d in unhealthy])
            raise AllocationError(ErrorKind.UNHEALTHY_DEVICE, f"cannot allocate unhealthy devices: {detail}",
                                  unhealthy)
        found = {device_id: device for device_id, device in known.items() if device is not None}
        return [[found[device_id] for device_id in ids] for ids in wanted]

    def allocate_container(self, devices: Sequence[Advertised], cdi_resolvable: bool) -> ContainerAllocation:
        """One container's devices, RSD group and nodes; the CDI annotation as CDI_ANNOTATION says, given
        whether a spec resolves its device (read once per Allocate call by the caller)."""
        records = tuple(sorted((d.record for d in devices), key=lambda r: r.device_id))
        ids = [r.device_id for r in records]
        device_nodes = tuple(DeviceNode(f"/dev/{r.device_id}", f"/dev/{r.device_id}") for r in records)
        # Before the group is made: a container that cannot get its devices must not cost an RSD change.
        self._await_nodes(device_nodes, ids)
        try:
            group = self._rsd_groups.recreate(records)
        except RsdGroupError as exc:
            raise AllocationError(ErrorKind.RSD_GROUP_FAILED, f"RSD group for {listed(ids)} failed: {exc}",
                                  ids) from None
        rsd = DeviceNode(CONTAINER_RSD_PATH, rsd_host_path(group.group_id))
        self._await_nodes((rsd,), ids)
        return ContainerAllocation(records, group, (rsd, *device_nodes),
                                   allocate_annotations(self._cdi_annotation, cdi_resolvable), cdi_resolvable)

    def _await_nodes(self, nodes: Sequence[DeviceNode], ids: Sequence[str]) -> None:
        """Wait, bounded, for each host node to exist under DEV_ROOT (a new RSD node appears asynchronously)."""
        missing = first_missing(self._dev_root, nodes, self._node_timeout)
        if missing is not None:
            raise AllocationError(ErrorKind.DEVICE_NODE_MISSING,
                                  f"device node {missing.host_path} for {listed(ids)} did not appear "
                                  f"under {self._dev_root} within {self._node_timeout:g}s", ids)
