"""A resource worker process: wires one resource's lifecycle (resource_worker/lifecycle.py) to the real node,
the scanner's inventory channel and the kubelet.

Until its resource has devices a worker holds only the subscription, its device table and the log: what
serving needs (resource_worker/serving.py: gRPC, the tracer, the recorder, placement) is imported and made
when the first snapshot with devices asks for a plugin server.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq
from loguru import logger

from resource_worker.device_table import DeviceTable
from resource_worker.lifecycle import PluginInstance, Worker
from shared.channels.inventory_subscriber import InventorySubscriber
from shared.config import Settings
from shared.kubelet.plugin_socket import remove_stale_sockets
from shared.programs import PLUGIN_RESTART_SIGNAL
from shared.resources import Resource
from shared.supervision.process_lifecycle import ShutdownSignal, exit_now, start_process

if TYPE_CHECKING:
    from resource_worker.serving import Serving


class DeferredServing:
    """The worker's plugin factory: makes the serving parts the first time a plugin server is wanted."""

    def __init__(self, settings: Settings, table: DeviceTable):
        self._settings = settings
        self._table = table
        self._serving: Serving | None = None  # the lifecycle thread's

    def new_plugin(self, on_stream_change: Callable[[], None]) -> PluginInstance:
        if self._serving is None:
            from resource_worker.serving import Serving

            self._serving = Serving(self._settings, self._table)
        return self._serving.new_plugin(on_stream_change)

    def shutdown(self) -> None:
        if self._serving is not None:
            self._serving.tracer.shutdown()


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
    serving = DeferredServing(settings, table)
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
        serving.shutdown()
    logger.info("Shutdown")
    exit_now(shutdown)
