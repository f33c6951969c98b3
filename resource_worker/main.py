"""A resource worker process: keeps one resource's plugin serving the kubelet while it has devices."""

from __future__ import annotations

import argparse
import sys
import threading

import zmq
from loguru import logger

from resource_worker.allocation import Allocator
from resource_worker.device_table import DeviceTable, counts
from resource_worker.plugin_server import PluginServer, remove_stale_sockets
from resource_worker.registration import RegistrationError
from resource_worker.rsd_group import RsdGroups
from resource_worker.subscriber import InventorySubscriber
from resource_worker.tracing import AllocationTracer, setup_tracing
from shared import runtime_status
from shared.config import Settings
from shared.process import ShutdownSignal, start_process
from shared.rbln_smi import RblnSmi
from shared.resources import Resource
from shared.status import read_status
from shared.version import VERSION

# Checked this often even when nothing signals: the socket may vanish silently.
_IDLE_CHECK_SECONDS = 1.0
_BACKOFF_START = 0.2
_BACKOFF_MAX = 5.0


class Backoff:
    def __init__(self) -> None:
        self.delay = _BACKOFF_START

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.delay * 2, _BACKOFF_MAX)
        return delay

    def reset(self) -> None:
        self.delay = _BACKOFF_START


class Worker:
    def __init__(self, settings: Settings, resource: Resource, shutdown: ShutdownSignal,
                 tracer: AllocationTracer):
        self._settings = settings
        self._tracer = tracer
        self._resource = resource
        self._shutdown = shutdown
        # Set by anything the lifecycle loop must react to: inventory, streams, shutdown.
        self._attention = threading.Event()
        self.table = DeviceTable(resource)
        smi = RblnSmi(settings.rbln_smi)
        self._allocator = Allocator(self.table, RsdGroups(smi, settings.rsd_lock_file), settings.dev_root,
                                    lambda device_id: read_status(settings.sysfs_root, device_id))
        self._server: PluginServer | None = None
        self._registered = False
        self._waiting_logged = False
        self._backoff = Backoff()
        self._reported: dict | None = None

    def on_inventory(self, message) -> None:
        self.table.apply(message)
        self._attention.set()

    def wake(self) -> None:
        self._attention.set()

    def run(self) -> None:
        remove_stale_sockets(self._settings.kubelet_device_plugin_path, self._resource)
        while not self._shutdown.is_set():
            timeout = self._step()
            self._report()
            self._attention.wait(timeout)
            self._attention.clear()
        if self._server is not None:
            self._server.stop()
        runtime_status.remove_status(self._settings.run_dir, self._resource.process_name)

    def _report(self) -> None:
        """Keep the status file (read by the watchdog's readiness probe and `status`) current."""
        status = {"resource": self._resource.value, "registered": self._registered,
                  "streams": self._server.streams.open_streams if self._server else 0,
                  "endpoint": self._server.socket_name if self._server else None,
                  **counts(self.table.devices())}
        if status != self._reported:
            runtime_status.write_status(self._settings.run_dir, self._resource.process_name, status)
            self._reported = status

    def _step(self) -> float:
        """Move one step towards the desired state; returns how long to wait before the next step."""
        has_devices = self.table.synced and bool(self.table.devices())
        if not has_devices:
            if self._server is not None:
                self._stop_serving()
                logger.info("Stopped device plugin for absent resource", resourceName=self._resource.value)
            return _IDLE_CHECK_SECONDS
        if self._server is not None and not self._server.socket_exists:
            logger.warning("Device plugin socket was removed; serving on a new one",
                           resourceName=self._resource.value, endpoint=self._server.socket_name)
            self._server.stop()
            self._server = None
        if self._server is None:
            self._server = PluginServer(self.table, self._allocator, self._settings.kubelet_device_plugin_path,
                                        self.wake, self._tracer)
            self._server.serve()
            self._registered = False
        if self._registered and self._server.streams.take_dropped():
            logger.warning("Kubelet ended the device list stream; registering again",
                           resourceName=self._resource.value)
            self._registered = False
        if not self._registered:
            return self._register()
        return _IDLE_CHECK_SECONDS

    def _register(self) -> float:
        assert self._server is not None
        kubelet_socket = self._settings.kubelet_socket
        if not kubelet_socket.exists():
            if not self._waiting_logged:
                logger.info("Waiting for the kubelet socket", resourceName=self._resource.value,
                            path=str(kubelet_socket))
                self._waiting_logged = True
            return self._backoff.next()
        try:
            self._server.register(kubelet_socket)
        except RegistrationError as exc:
            logger.warning("Registration with kubelet failed; retrying", resourceName=self._resource.value,
                           err=str(exc))
            return self._backoff.next()
        self._registered = True
        self._waiting_logged = False
        self._backoff.reset()
        return _IDLE_CHECK_SECONDS

    def _stop_serving(self) -> None:
        assert self._server is not None
        self._server.stop()
        self._server = None
        self._registered = False
        # A later instance for this resource starts with no health history.
        self.table.forget_history()


def parse_args(argv: list[str] | None) -> Resource:
    parser = argparse.ArgumentParser(prog="rbln-device-plugin-worker",
                                     description="Serve one resource to the kubelet.")
    parser.add_argument("--resource", required=True, choices=[r.value for r in Resource])
    return Resource(parser.parse_args(argv).resource)


def main(argv: list[str] | None = None) -> None:
    resource = parse_args(sys.argv[1:] if argv is None else argv)
    settings = start_process(resource.process_name, resourceName=resource.value)
    shutdown = ShutdownSignal().install()
    tracer = setup_tracing(settings.otlp_endpoint, VERSION, settings.node_name)
    worker = Worker(settings, resource, shutdown, tracer)
    shutdown.on_request(worker.wake)
    context = zmq.Context()
    subscriber = InventorySubscriber(context, settings.run_dir, resource, worker.on_inventory,
                                     heartbeat_timeout=max(1.0, 3 * settings.device_scan_interval))
    subscriber.start()
    try:
        worker.run()
    finally:
        subscriber.stop()
        context.term()
        tracer.shutdown()
    logger.info("Shutdown")
