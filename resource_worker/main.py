"""A resource worker process: wires one resource's lifecycle (resource_worker/lifecycle.py) to the real node,
the scanner's inventory channel and the kubelet.

supervisord starts a worker only for a resource the node has (scanner/worker_demand.py), so it builds what
serving needs (gRPC, the tracer, the recorder) at its start, and what allocating needs (the Allocator,
placement: resource_worker/allocation_calls.py) once its first Register is on its way.
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq
from loguru import logger

from resource_worker.device_table import DeviceTable
from resource_worker.lifecycle import PluginInstance, Worker
from resource_worker.plugin_server import PluginServer
from shared.channels.inventory_subscriber import InventorySubscriber
from shared.config import Settings
from shared.kubelet.plugin_socket import remove_stale_sockets
from shared.node.driver_status import read_status
from shared.node.rbln_smi import GROUP_COMMANDS, RblnSmi
from shared.observability.metrics import recorder_for
from shared.observability.tracing import AllocationTracer, setup_tracing
from shared.programs import PLUGIN_RESTART_SIGNAL
from shared.resources import Resource
from shared.supervision.process_lifecycle import ShutdownSignal, exit_now, start_process
from shared.version import VERSION

if TYPE_CHECKING:
    from resource_worker.allocation_calls import AllocationCalls


class Serving:
    """The resource's serving parts, made once; `new_plugin` makes a plugin server per instance from them."""

    def __init__(self, settings: Settings, table: DeviceTable):
        self._settings = settings
        self._table = table
        self._metrics = recorder_for(settings.metrics_port, settings.run_dir)
        self._metrics.load(table.resource.value, [command.value for command in GROUP_COMMANDS])
        self.tracer: AllocationTracer = setup_tracing(settings.otlp_endpoint, VERSION, settings.node_name)
        self._calls_lock = threading.Lock()  # guards _calls: the first Register and any call may ask at once
        self._calls: AllocationCalls | None = None
        self._freeze()

    @staticmethod
    def _freeze() -> None:
        # What the imports made lives as long as the process: out of the collector's reach, a full collection
        # no longer walks it (about 16 ms at 34 000 objects), which would otherwise land in whichever
        # GetPreferredAllocation or Allocate happened to trigger it. Not collected first: the imports leave no
        # garbage a collection finds (it frees 0 objects at this point), and it cost the first registration
        # 9-16 ms (measured on a loaded 2-core machine).
        gc.freeze()

    def calls(self) -> AllocationCalls:
        """What answers GetPreferredAllocation and Allocate, made at the first ask."""
        with self._calls_lock:
            if self._calls is None:
                from resource_worker.allocation import Allocator
                from resource_worker.allocation_calls import AllocationCalls
                from shared.node.rsd_group import RsdGroups

                settings = self._settings
                smi = RblnSmi(settings.rbln_smi, observe=self._metrics.rbln_smi)
                allocator = Allocator(self._table, RsdGroups(smi, settings.rsd_lock_file), settings.dev_root,
                                      lambda device_id: read_status(settings.sysfs_root, device_id),
                                      cdi_annotation=settings.cdi_annotation)
                self._calls = AllocationCalls(self._table, allocator, self.tracer, self._metrics)
                self._freeze()
            return self._calls

    def new_plugin(self, on_stream_change: Callable[[], None]) -> PluginInstance:
        return PluginServer(self._table, self.calls, self._settings.kubelet_device_plugin_path, on_stream_change)


def parse_args(argv: list[str] | None) -> Resource:
    parser = argparse.ArgumentParser(prog="rbln-device-plugin-worker",
                                     description="Serve one resource to the kubelet.")
    parser.add_argument("--resource", required=True, choices=[r.value for r in Resource])
    return Resource(parser.parse_args(argv).resource)


def main(argv: list[str] | None = None) -> None:
    resource = parse_args(sys.argv[1:] if argv is None else argv)
    settings = start_process(resource.process_name, resourceName=resource.value)
    shutdown = ShutdownSignal().install()
    table = DeviceTable(resource)
    serving = Serving(settings, table)
    worker = Worker(resource, table, serving.new_plugin, settings.kubelet_socket, settings.run_dir, shutdown)
    shutdown.on_request(worker.wake)
    shutdown.on_signal(PLUGIN_RESTART_SIGNAL, worker.order_restart)
    context = zmq.Context()
    subscriber = InventorySubscriber(context, settings.run_dir, resource, worker.on_inventory,
                                     heartbeat_timeout=max(1.0, 3 * settings.device_scan_interval))
    subscriber.start()
    try:
        remove_stale_sockets(settings.kubelet_device_plugin_path, resource)
        worker.run()
    finally:
        subscriber.stop()
        context.term()
        serving.tracer.shutdown()
    logger.info("Shutdown")
    exit_now(shutdown)
