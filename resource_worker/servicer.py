"""The kubelet-facing DevicePlugin service of one resource (what the kubelet gets: docs/kubelet.md).

Every handler answers whatever it is sent: a bad request gets a gRPC error
(Allocate) or an empty answer (GetPreferredAllocation), never a dead worker. Those two calls are answered by
resource_worker/allocation_calls.py, which `calls` hands over once it is loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grpc
from loguru import logger

from resource_worker.device_table import Advertised, DeviceTable
from shared.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from shared.kubelet.streams import StreamTracker
from shared.observability.hostile_ids import logged

if TYPE_CHECKING:
    from resource_worker.allocation_calls import AllocationCalls

OPTIONS = api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
# Every way a stream ends (the kubelet cancels, the server stops) wakes it at once; this is only a
# safety net, long enough not to cost an idle worker anything.
_STREAM_WAKE_SECONDS = 30.0


def device_list(devices: Sequence[Advertised]) -> api_pb2.ListAndWatchResponse:
    response = api_pb2.ListAndWatchResponse()
    for advertised in devices:
        device = response.devices.add(ID=advertised.device_id, health=advertised.health.health.value)
        if advertised.record.numa_node is not None:
            device.topology.nodes.add(ID=advertised.record.numa_node)
    return response


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, table: DeviceTable, calls: Callable[[], AllocationCalls], streams: StreamTracker,
                 stopping: threading.Event):
        self._table = table
        self._calls = calls
        self._streams = streams
        self._stopping = stopping
        self._resource = table.resource.value

    def GetDevicePluginOptions(self, request, context):
        return OPTIONS

    def ListAndWatch(self, request, context):
        ended = threading.Event()

        def on_end() -> None:
            ended.set()
            self._table.wake_all()

        if not self._streams.try_open():
            logger.warning("Refused device list stream; too many open", resourceName=self._resource,
                           limit=self._streams.limit)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self._streams.limit} device list streams are open already for {self._resource}")
        context.add_callback(on_end)
        try:
            sent = None
            while not ended.is_set() and not self._stopping.is_set():
                generation, devices = self._table.snapshot()
                if generation != sent:
                    # Yielding after the client cancelled would block forever.
                    if not context.is_active():
                        break
                    logger.debug("Sending device list to kubelet", resourceName=self._resource,
                                 deviceIDs=logged([d.device_id for d in devices]))
                    yield device_list(devices)
                    sent = generation
                self._table.wait_for_change(sent, _STREAM_WAKE_SECONDS)
        finally:
            self._streams.closed(by_kubelet=not self._stopping.is_set())

    def GetPreferredAllocation(self, request, context):
        return self._calls().preferred_allocation(request, context)

    def Allocate(self, request, context):
        return self._calls().allocate(request, context)

    def PreStartContainer(self, request, context):
        return api_pb2.PreStartContainerResponse()
