"""The kubelet's DRA health service (KEP-4680) on the DRA socket: `NodeWatchResources` streams the health of every
device of the pool, in v1 and v1alpha1 alike (docs/dra.md#device-health).

Every message is the complete list, which the kubelet reconciles its cache against. A stream sends one as soon as
the pool is known, one after any device's health changed (the inventory changes with every scan), and the same one
again every RESEND_PERIOD: the kubelet takes a device whose last report is older than the device's timeout for
Unknown, and clears the driver's devices when the stream ends.

All streams share one value, the newest report with its version; there is no queue. A waiting stream sends the
newest when it wakes. A stream whose client stops reading blocks in its own send (gRPC's flow control), holding
only its own handler thread, and sends the newest report once the client reads again: whatever changed meanwhile
is folded into it. The open streams are bounded, so that such clients cannot take the threads Prepare needs.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import grpc
from loguru import logger

from dra_worker.inventory import NodeInventory
from dra_worker.slices import offered_devices
from shared.device_health import Health
from shared.dra_health.v1 import api_pb2 as v1_pb2
from shared.dra_health.v1 import api_pb2_grpc as v1_grpc
from shared.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
from shared.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from shared.streams import StreamTracker

# What the kubelet is told to allow between two reports of a device before it reads Unknown. The kubelet's own
# default (healthinfo.go DefaultHealthTimeout), said outright so that a kubelet with another default judges the
# same: like the 30 s after which it takes an unreachable plugin for gone and wipes its slices, it lets a worker
# restart or a kubelet reconnect (every 5 s) pass without a pod's status flickering to Unknown, and still shows
# a worker that hangs with its stream open within half a minute.
HEALTH_TIMEOUT_SECONDS = 30
# The full report again without a change: three per timeout, so that two late or lost sends cost nothing.
RESEND_PERIOD = 10.0
# The kubelet's bound on a message (longer ones are cut).
MAX_MESSAGE = 1024

SUPPORTED_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


@dataclasses.dataclass(frozen=True)
class DeviceReport:
    device: str
    healthy: bool
    message: str
    """The driver status an Unhealthy device is in (FAULT, BUSY, ...); empty for a Healthy one."""


Report = tuple[DeviceReport, ...]


def health_report(inventory: NodeInventory) -> Report | None:
    """Every device the pool offers, with its health; None until every resource's first snapshot arrived (a
    partial list would have the kubelet forget the devices left out)."""
    if not inventory.complete:
        return None
    return tuple(DeviceReport(d.record.device_id, d.health is Health.HEALTHY,
                              "" if d.health is Health.HEALTHY else d.lifecycle[:MAX_MESSAGE])
                 for d in offered_devices(inventory))


class HealthReports:
    """The newest report, which every stream sends."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        # Guards _report, _version and _determined_at; notified when the report changes or a client goes.
        self._changed = threading.Condition()
        self._report: Report | None = None
        self._version = 0
        self._determined_at = 0

    def update(self, inventory: NodeInventory) -> None:
        """After every inventory snapshot: the report as of now."""
        report = health_report(inventory)
        with self._changed:
            self._determined_at = int(self._clock())
            if report != self._report:
                self._report = report
                self._version += 1
                self._changed.notify_all()

    def wake(self) -> None:
        """Every waiting stream checks whether its client is still there."""
        with self._changed:
            self._changed.notify_all()

    def next(self, seen: int, timeout: float, active: Callable[[], bool]) -> tuple[int, Report | None, int]:
        """(version, report, when it was determined, Unix seconds): at once when the report is newer than `seen`,
        else after `timeout` or once `active()` is false, whichever comes first."""
        with self._changed:
            self._changed.wait_for(lambda: not active() or (self._report is not None and self._version != seen),
                                   timeout)
            return self._version, self._report, self._determined_at


def _message(pb2: ModuleType, pool: str, report: Report, determined_at: int) -> Any:
    return pb2.NodeWatchResourcesResponse(devices=[
        pb2.DeviceHealth(device=pb2.DeviceIdentifier(pool_name=pool, device_name=entry.device),
                         health=pb2.HEALTHY if entry.healthy else pb2.UNHEALTHY, last_updated_time=determined_at,
                         health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS, message=entry.message)
        for entry in report])


class HealthWatch:
    """What both versions of the service do; `pb2` builds the messages in the caller's proto package."""

    def __init__(self, reports: HealthReports, pool: str, streams: StreamTracker,
                 resend_period: float = RESEND_PERIOD):
        self._reports = reports
        self._pool = pool
        self.streams = streams
        self._resend_period = resend_period

    def watch(self, context: grpc.ServicerContext, pb2: ModuleType) -> Iterator[Any]:
        if not self.streams.try_open():
            logger.warning("Health stream refused; too many open", limit=self.streams.limit)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self.streams.limit} health streams are open already; close one first")
        version = pb2.DESCRIPTOR.package
        logger.info("Health stream opened", version=version, streams=self.streams.open_streams)
        context.add_callback(self._reports.wake)  # a client that goes wakes its stream, which then ends
        try:
            seen = -1
            while context.is_active():
                seen, report, determined_at = self._reports.next(seen, self._resend_period, context.is_active)
                if report is not None and context.is_active():
                    yield _message(pb2, self._pool, report, determined_at)
        finally:
            self.streams.closed(by_kubelet=not context.is_active())
            logger.info("Health stream closed", version=version, streams=self.streams.open_streams)


class HealthServiceV1(v1_grpc.DRAResourceHealthServicer):
    def __init__(self, watch: HealthWatch):
        self._watch = watch

    def NodeWatchResources(self, request, context):
        return self._watch.watch(context, v1_pb2)


class HealthServiceV1alpha1(v1alpha1_grpc.DRAResourceHealthServicer):
    def __init__(self, watch: HealthWatch):
        self._watch = watch

    def NodeWatchResources(self, request, context):
        return self._watch.watch(context, v1alpha1_pb2)


def add_health_services(server: grpc.Server, watch: HealthWatch) -> None:
    v1_grpc.add_DRAResourceHealthServicer_to_server(HealthServiceV1(watch), server)
    v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(HealthServiceV1alpha1(watch), server)
