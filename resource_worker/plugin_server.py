"""One resource plugin instance: a gRPC server on its own socket, registered with the kubelet.

An instance lives while its resource has devices. Each instance gets a socket
name of its own (the kubelet tells instances apart by socket path), and the
server is serving before Register is called, because the kubelet dials back
from inside Register.
"""

from __future__ import annotations

import os
import pathlib
import threading
from collections.abc import Callable
from concurrent import futures
from typing import TYPE_CHECKING

import grpc
from loguru import logger

from resource_worker.device_table import DeviceTable, counts, device_fields, log_level
from resource_worker.registration import Registration
from resource_worker.servicer import OPTIONS, DevicePluginServicer
from shared.kubelet.aio_serving import blocking_handlers
from shared.kubelet.deviceplugin.v1beta1 import api_pb2_grpc
from shared.kubelet.plugin_socket import new_socket_name
from shared.kubelet.streams import StreamTracker
from shared.supervision.loop_thread import shared_loop

if TYPE_CHECKING:
    from resource_worker.allocation_calls import AllocationCalls
    from resource_worker.plugin_socket_watch import SocketWatch

# Each open ListAndWatch pins a thread; leave room for several streams plus unary calls.
SERVER_THREADS = 16
STOP_GRACE = 1.0


class PluginServer:
    def __init__(self, table: DeviceTable, calls: Callable[[], AllocationCalls], plugin_dir: pathlib.Path,
                 on_change: Callable[[], None], socket_watch: SocketWatch | None = None):
        """`calls`: what answers GetPreferredAllocation and Allocate (made at its first call, which may wait
        for it). `on_change`: called whenever a stream opens or ends and, from the first Register on, whenever
        the socket file may have gone. `socket_watch`: the process's own unless given."""
        self._table = table
        self._calls = calls
        self._on_change = on_change
        self._socket_watch = socket_watch
        self._watch: int | None = None
        self.streams = StreamTracker(on_change)
        self._stopping = threading.Event()
        self.socket_name = new_socket_name(table.resource)
        self.socket_path = plugin_dir / self.socket_name
        self._handlers = futures.ThreadPoolExecutor(max_workers=SERVER_THREADS, thread_name_prefix="grpc-device-plugin")
        servicer = DevicePluginServicer(table, calls, self.streams, self._stopping)
        self._service = blocking_handlers(
            lambda server: api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server), self._handlers)
        self._loop = shared_loop()
        self._server: grpc.aio.Server | None = None

    async def _start(self) -> None:
        server = grpc.aio.server(handlers=self._service)
        old_umask = os.umask(0o077)  # the socket file is created owner-only
        try:
            server.add_insecure_port(f"unix://{self.socket_path}")
        finally:
            os.umask(old_umask)
        await server.start()
        self._server = server

    def serve(self) -> None:
        self._loop.call(self._start())

    def register(self, kubelet_socket: pathlib.Path, on_done: Callable[[], None]) -> Registration:
        """Start registering this instance's socket; `on_done` is called when the kubelet has answered."""
        registration = Registration(kubelet_socket, self.socket_name, self._table.resource.value, OPTIONS, on_done)
        if self._watch is None:
            self._watch_socket()
        # Made now, with the first Register on its way, rather than before it: no kubelet asks a plugin to
        # allocate before it has registered it.
        self._calls()
        return registration

    def _watch_socket(self) -> None:
        """Watch the socket, once the first Register is on its way: a process's first watch costs some 10 ms
        (inotify_simple's imports, its look-up of libc), which the registration need not wait for."""
        if self._socket_watch is None:
            from resource_worker.plugin_socket_watch import shared_watch

            self._socket_watch = shared_watch()
        if self._socket_watch is not None:
            self._watch = self._socket_watch.watch(self.socket_path, self._on_change)

    def log_registered(self) -> None:
        devices = self._table.devices()
        logger.info("Registered device plugin with kubelet", resourceName=self._table.resource.value,
                    endpoint=self.socket_name, **counts(devices))
        for device in devices:
            logger.log(log_level(device.health.health), "Device exposed", resourceName=self._table.resource.value,
                       **device_fields(device), busID=device.record.bus_id, numaNode=device.record.numa_node)

    @property
    def socket_exists(self) -> bool:
        return self.socket_path.exists()

    @property
    def socket_watched(self) -> bool:
        return self._watch is not None

    def stop(self) -> None:
        if self._socket_watch is not None and self._watch is not None:
            self._socket_watch.unwatch(self._watch)
            self._watch = None
        self._stopping.set()
        self._table.wake_all()
        if self._server is not None:
            self._loop.call(self._server.stop(STOP_GRACE))
        # Stopped means no handler runs any more: an Allocate past the grace period still finishes
        # its RSD group change before the socket goes (and before the process may exit).
        self._handlers.shutdown(wait=True)
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
