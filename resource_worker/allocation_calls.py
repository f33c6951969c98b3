"""The two calls that choose and hand out devices, GetPreferredAllocation and Allocate, with their logs, spans
and metrics: what resource_worker/servicer.py answers them with.

Loaded once the first Register is on its way (resource_worker/main.py's Serving): placement, the allocator and
the RSD groups are some 30 ms of imports that the way to Register need not wait for, and no kubelet asks
either call of a plugin it has not registered yet.

Every call answers whatever it is sent: a bad request gets a gRPC error (Allocate) or an empty answer
(GetPreferredAllocation), never a dead worker.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence

import grpc
from loguru import logger

from resource_worker.allocation import (
    AllocateObserver,
    AllocationError,
    Allocator,
    ContainerAllocation,
    ContainerReport,
    ErrorKind,
    GroupReport,
)
from resource_worker.device_table import DeviceTable
from resource_worker.placement import (
    WORK_BUDGET,
    Candidate,
    Placement,
    PlacementRequestError,
    candidate_from_record,
    place,
)
from shared.kubelet.deviceplugin.v1beta1 import api_pb2
from shared.node.device_record import DeviceRecord
from shared.observability.hostile_ids import logged
from shared.observability.metrics import Recorder, Result
from shared.observability.tracing import AllocateTrace, AllocationTracer, ContainerSpan

_STATUS_CODES = {
    ErrorKind.INVALID_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.UNKNOWN_DEVICE: grpc.StatusCode.NOT_FOUND,
    ErrorKind.UNHEALTHY_DEVICE: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.RSD_GROUP_FAILED: grpc.StatusCode.INTERNAL,
    ErrorKind.DEVICE_NODE_MISSING: grpc.StatusCode.INTERNAL,
}

def container_response(allocation: ContainerAllocation) -> api_pb2.ContainerAllocateResponse:
    response = api_pb2.ContainerAllocateResponse(annotations=allocation.annotations)
    for node in allocation.nodes:
        response.devices.add(container_path=node.container_path, host_path=node.host_path,
                             permissions=node.permissions)
    return response


def _ms(since: float) -> float:
    return round((time.monotonic() - since) * 1000, 3)


def _short(value: object) -> object:
    """A score component as a log record carries it: the IDs component bounded like any ID list."""
    return logged(list(value)) if isinstance(value, tuple) else value


class _PlacementView:
    """The candidates placement weighs, with the records they were made from."""

    def __init__(self, records: list[DeviceRecord]) -> None:
        self.records = records
        self.candidates: dict[str, Candidate] = {r.device_id: candidate_from_record(r) for r in records}

    def made_from(self, records: list[DeviceRecord]) -> bool:
        # The very same record objects: holding them keeps their identities from being reused.
        return len(records) == len(self.records) and all(a is b for a, b in zip(records, self.records, strict=True))


class _ContainerRecord:
    def __init__(self, resource: str, bus_ids: list[str], span: ContainerSpan):
        self._resource = resource
        self._bus_ids = bus_ids
        self._span = span

    def group(self, report: GroupReport) -> None:
        if report.made:
            logger.debug("Recreated RSD group", resourceName=self._resource, busIDs=self._bus_ids,
                         rsdGroup=report.rsd_host_path, replacedGroups=report.replaced_groups,
                         smiCalls=report.smi_calls, smiMs=report.smi_ms)
        self._span.rsd_group(report.rsd_host_path)


class _AllocateRecord(AllocateObserver):
    """One Allocate call's logs and spans, and when each container was done (for the metrics)."""

    def __init__(self, resource: str, trace: AllocateTrace, started: float, ready_after: list[float]):
        self._resource = resource
        self._trace = trace
        self._started = started
        self._ready_after = ready_after

    def refused(self, requests: Sequence[Sequence[str]], error: AllocationError) -> None:
        self._trace.refused([logged(ids) for ids in requests], error)

    @contextlib.contextmanager
    def container(self, device_ids: list[str], bus_ids: list[str]) -> Iterator[_ContainerRecord]:
        logger.info("Starting container allocation", resourceName=self._resource, deviceIDs=device_ids,
                    busIDs=bus_ids)
        with self._trace.container(device_ids, bus_ids) as span:
            yield _ContainerRecord(self._resource, bus_ids, span)

    def answered(self, report: ContainerReport) -> None:
        group = report.group
        logger.info("Completed container allocation", resourceName=self._resource, deviceIDs=report.device_ids,
                    busIDs=report.bus_ids, rsdGroup=group.rsd_host_path, durationMs=round(report.seconds * 1000, 3),
                    smiCalls=group.smi_calls, smiMs=group.smi_ms, cdiAnnotation=report.cdi_annotation,
                    cdiResolvable=report.cdi_resolvable)
        self._ready_after.append(time.monotonic() - self._started)


class AllocationCalls:
    """GetPreferredAllocation and Allocate of one resource, for the servicer to answer with."""

    def __init__(self, table: DeviceTable, allocator: Allocator, tracer: AllocationTracer, metrics: Recorder):
        self._table = table
        self._tracer = tracer
        self._metrics = metrics
        self._allocator = allocator
        self._resource = table.resource.value
        # Guards `_placement_view`: the candidates of the device records last seen, made anew only when the
        # table holds other records (a scan), not on every GetPreferredAllocation.
        self._view_lock = threading.Lock()
        self._placement_view: _PlacementView | None = None

    def _candidates(self) -> dict[str, Candidate]:
        records = [advertised.record for advertised in self._table.devices()]
        with self._view_lock:
            if self._placement_view is None or not self._placement_view.made_from(records):
                self._placement_view = _PlacementView(records)
            return self._placement_view.candidates

    def _flush_metrics_when_answered(self, context) -> None:
        """The call's metrics (and the rbln-smi calls it made) are written once the answer has gone out."""
        if not context.add_callback(self._metrics.flush):
            self._metrics.flush()  # the call has ended already

    def preferred_allocation(self, request, context):
        started = time.monotonic()
        self._flush_metrics_when_answered(context)
        response = api_pb2.PreferredAllocationResponse()
        candidates = self._candidates()
        fallbacks = 0
        for container in request.container_requests:
            chosen: list[str] = []
            try:
                placement = place(candidates, list(container.available_deviceIDs),
                                  list(container.must_include_deviceIDs), container.allocation_size)
                chosen = placement.devices
                self._log_placement(placement, container.allocation_size)
            except PlacementRequestError as exc:
                fallbacks += 1
                self._fallback(container, str(exc))
            except Exception as exc:  # never an error to the kubelet: it would fail pod admission
                fallbacks += 1
                self._fallback(container, f"internal error: {type(exc).__name__}: {exc}")
            response.container_responses.add(deviceIDs=chosen)
        self._metrics.preferred_allocation(self._resource, time.monotonic() - started, fallbacks)
        return response

    def _log_placement(self, placement: Placement, size: int) -> None:
        logger.debug("Preferred allocation", resourceName=self._resource, deviceIDs=logged(placement.devices),
                     size=size, provenOptimal=placement.proven_optimal, searchWork=placement.work)
        shortfall = placement.shortfall()
        if shortfall is not None:
            # Not a failure: the answer is valid and at least as good as the heuristic's; it may not be the best.
            logger.debug("Preferred allocation search stopped at its work bound", resourceName=self._resource,
                         searchWork=placement.work, workBudget=WORK_BUDGET, openComponent=shortfall.component,
                         openBound=_short(shortfall.bound), answerValue=_short(shortfall.answer))

    def _fallback(self, container, reason: str) -> None:
        logger.warning("Preferred allocation fallback to kubelet", resourceName=self._resource, err=reason[:512],
                       available=logged(list(container.available_deviceIDs)),
                       mustInclude=logged(list(container.must_include_deviceIDs)),
                       size=container.allocation_size)

    def allocate(self, request, context):
        started = time.monotonic()
        self._flush_metrics_when_answered(context)
        requested = [list(c.devices_ids) for c in request.container_requests]
        all_ids = logged([i for ids in requested for i in ids])
        ready_after: list[float] = []  # for each container done so far, seconds since the call started
        try:
            with self._tracer.allocate(self._resource) as trace:
                allocations = self._allocator.allocate(requested,
                                                       _AllocateRecord(self._resource, trace, started, ready_after))
                # Inside the call's handling: an answer that cannot be built fails like any other error.
                response = api_pb2.AllocateResponse(container_responses=[container_response(a) for a in allocations])
        except AllocationError as exc:
            self._count_allocations(Result.FAILURE, started, ready_after, len(requested))
            logger.error("Container allocation failed", resourceName=self._resource,
                         deviceIDs=logged(exc.device_ids) or all_ids, err=str(exc), durationMs=_ms(started))
            context.abort(_STATUS_CODES[exc.kind], str(exc))
        except Exception as exc:
            self._count_allocations(Result.FAILURE, started, ready_after, len(requested))
            logger.opt(exception=True).error("Container allocation failed", resourceName=self._resource,
                                             deviceIDs=all_ids, err=f"{type(exc).__name__}: {exc}",
                                             durationMs=_ms(started))
            context.abort(grpc.StatusCode.INTERNAL, f"internal error allocating {', '.join(all_ids)}: {exc}")
        self._count_allocations(Result.SUCCESS, started, ready_after, len(requested))
        return response

    def _count_allocations(self, result: Result, started: float, ready_after: list[float], containers: int) -> None:
        """Each container request counts once: the ones not done when the call failed at the time it failed (a
        call naming no container counts as one failed container, so that no failure goes unseen)."""
        ended = time.monotonic() - started
        self._metrics.allocations(self._resource, result,
                                  ready_after + [ended] * (max(containers, 1) - len(ready_after)))
