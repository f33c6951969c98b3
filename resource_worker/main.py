"""A resource worker process: keeps one resource's plugin serving the kubelet while it has devices."""

from __future__ import annotations

import argparse
import enum
import sys
import threading
import time
from typing import TYPE_CHECKING

import zmq
from loguru import logger

from resource_worker.allocation import Allocator
from resource_worker.device_table import DeviceTable, counts
from shared.plugin_socket import remove_stale_sockets
from resource_worker.rsd_group import RsdGroups
from resource_worker.subscriber import InventorySubscriber
from resource_worker.tracing import AllocationTracer, setup_tracing
from shared import process_status
from shared.config import Settings
from shared.ipc import InventoryMessage
from shared.metrics import Recorder, recorder_for
from shared.process_lifecycle import ShutdownSignal, exit_now, start_process
from shared.rbln_smi import GROUP_COMMANDS, RblnSmi
from shared.resources import Resource
from shared.device_status import read_status
from shared.version import VERSION

if TYPE_CHECKING:
    from resource_worker.plugin_server import PluginServer
    from resource_worker.registration import Registration

# How often a serving worker checks its socket even when nothing signals: it may vanish silently.
_IDLE_CHECK_SECONDS = 1.0
# A worker without devices has nothing to check: only an inventory or shutdown can give it work.
_UNTIL_SIGNALLED = None
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


class Phase(enum.Enum):
    """Where the serving instance stands with the kubelet."""

    UNREGISTERED = "unregistered"
    REGISTERING = "registering"
    REGISTERED = "registered"


class Worker:
    """The lifecycle loop: one thread moves the resource towards "served and registered" step by step.

    Everything that can change what the next step is (an inventory, a stream
    opening or ending, a Register answer, shutdown) sets `_attention`; the loop
    never blocks on the kubelet, so it notices each of them at once.
    """

    def __init__(self, settings: Settings, resource: Resource, shutdown: ShutdownSignal,
                 tracer: AllocationTracer, metrics: Recorder):
        self._settings = settings
        self._tracer = tracer
        self._metrics = metrics
        self._resource = resource
        self._shutdown = shutdown
        # Set by anything the lifecycle loop must react to: inventory, streams, Register answers, shutdown.
        self._attention = threading.Event()
        self.table = DeviceTable(resource)
        smi = RblnSmi(settings.rbln_smi, observe=metrics.rbln_smi)
        self._allocator = Allocator(self.table, RsdGroups(smi, settings.rsd_lock_file), settings.dev_root,
                                    lambda device_id: read_status(settings.sysfs_root, device_id))
        # The fields below belong to the lifecycle loop's thread.
        self._server: PluginServer | None = None
        self._phase = Phase.UNREGISTERED
        self._registration: Registration | None = None
        self._retry_at = 0.0
        self._waiting_for: str | None = None  # the reason for not being registered last logged
        self._backoff = Backoff()
        self._reported: dict | None = None
        # Set by the subscriber thread: when the scan behind the current inventory ran (CLOCK_MONOTONIC, s).
        self._scanned_at: float | None = None

    def on_inventory(self, message: InventoryMessage) -> None:
        self.table.apply(message)
        self._scanned_at = message.scanned_at_ns / 1e9
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
            self._stop_serving()
        process_status.remove_status(self._settings.run_dir, self._resource.process_name)

    def _report(self) -> None:
        """Keep the status file (read by the watchdog's probes and metrics, and by `status`) current."""
        devices = self.table.devices()
        status = {"resource": self._resource.value, "registered": self._phase is Phase.REGISTERED,
                  "streams": self._server.streams.open_streams if self._server else 0,
                  "endpoint": self._server.socket_name if self._server else None,
                  "scannedAt": self._scanned_at, **counts(devices),
                  "devices": {d.device_id: {"health": d.health.health.value, "status": d.health.status.name}
                              for d in devices}}
        if status != self._reported:
            process_status.write_status(self._settings.run_dir, self._resource.process_name, status)
            self._reported = status

    def _step(self) -> float | None:
        """Move one step towards the desired state; returns how long to wait before the next step (None: until
        something sets `_attention`)."""
        if not (self.table.synced and self.table.devices()):
            if self._server is not None:
                self._stop_serving()
                # A later instance for this resource starts with no health history.
                self.table.forget_history()
                logger.info("Stopped device plugin for absent resource", resourceName=self._resource.value)
            return _UNTIL_SIGNALLED
        if self._server is not None and not self._server.socket_exists:
            logger.warning("Device plugin socket was removed; serving on a new one",
                           resourceName=self._resource.value, endpoint=self._server.socket_name)
            self._stop_serving()
        if self._server is None:
            self._server = self._new_server()
            self._server.serve()
        if self._phase is Phase.REGISTERED and self._server.streams.take_dropped():
            logger.warning("Kubelet ended the device list stream; registering again",
                           resourceName=self._resource.value)
            self._phase = Phase.UNREGISTERED
        if self._phase is Phase.REGISTERING:
            return self._finish_registration()
        if self._phase is Phase.UNREGISTERED:
            return self._register()
        return _IDLE_CHECK_SECONDS

    def _new_server(self) -> PluginServer:
        # Imported here: gRPC, the API, placement and prometheus_client cost a process about 16 MB, which
        # a worker whose resource the node does not have (most nodes have one of the three) never pays.
        from resource_worker.plugin_server import PluginServer

        self._metrics.load(self._resource.value, [command.value for command in GROUP_COMMANDS])
        return PluginServer(self.table, self._allocator, self._settings.kubelet_device_plugin_path, self.wake,
                            self._tracer, self._metrics)

    def _register(self) -> float:
        assert self._server is not None
        now = time.monotonic()
        if now < self._retry_at:
            return self._retry_at - now
        kubelet_socket = self._settings.kubelet_socket
        if not kubelet_socket.exists():
            self._log_wait("INFO", "Waiting for the kubelet socket", path=str(kubelet_socket))
            return self._retry_later(now)
        self._registration = self._server.register(kubelet_socket, self.wake)
        self._phase = Phase.REGISTERING
        return _IDLE_CHECK_SECONDS

    def _finish_registration(self) -> float:
        assert self._server is not None and self._registration is not None
        if not self._registration.done():
            return _IDLE_CHECK_SECONDS
        from resource_worker.registration import RegistrationError  # loaded with the server

        registration, self._registration = self._registration, None
        try:
            registration.result()
        except RegistrationError as exc:
            self._log_wait("WARNING", "Registration with kubelet failed; retrying", err=str(exc))
            self._phase = Phase.UNREGISTERED
            return self._retry_later(time.monotonic())
        self._phase = Phase.REGISTERED
        self._waiting_for = None
        self._backoff.reset()
        self._server.log_registered()
        return _IDLE_CHECK_SECONDS

    def _log_wait(self, level: str, message: str, **fields) -> None:
        """Say why the worker is not registered yet, once per reason; retries for the same reason log at debug."""
        logger.log(level if message != self._waiting_for else "DEBUG", message, resourceName=self._resource.value,
                   **fields)
        self._waiting_for = message

    def _retry_later(self, now: float) -> float:
        delay = self._backoff.next()
        self._retry_at = now + delay
        return delay

    def _stop_serving(self) -> None:
        assert self._server is not None
        if self._registration is not None:
            self._registration.cancel()
            self._registration = None
        self._server.stop()
        self._server = None
        self._phase = Phase.UNREGISTERED


def parse_args(argv: list[str] | None) -> Resource:
    parser = argparse.ArgumentParser(prog="rbln-device-plugin-worker",
                                     description="Serve one resource to the kubelet.")
    parser.add_argument("--resource", required=True, choices=[r.value for r in Resource])
    return Resource(parser.parse_args(argv).resource)


def main(argv: list[str] | None = None) -> None:
    resource = parse_args(sys.argv[1:] if argv is None else argv)
    settings = start_process(resource.process_name, resourceName=resource.value)
    shutdown = ShutdownSignal().install()
    metrics = recorder_for(settings.metrics_port, settings.run_dir)
    tracer = setup_tracing(settings.otlp_endpoint, VERSION, settings.node_name)
    worker = Worker(settings, resource, shutdown, tracer, metrics)
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
    exit_now(shutdown)
