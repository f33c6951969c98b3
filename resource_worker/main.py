"""A resource worker process: wires one resource's lifecycle (resource_worker/lifecycle.py) to the real node,
the scanner's inventory channel and the kubelet."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable

import zmq
from loguru import logger

from resource_worker.allocation import Allocator
from resource_worker.device_table import DeviceTable
from resource_worker.lifecycle import PluginInstance, Worker
from shared.config import Settings
from shared.device_status import read_status
from shared.metrics import Recorder, recorder_for
from shared.plugin_socket import remove_stale_sockets
from shared.process_lifecycle import ShutdownSignal, exit_now, start_process
from shared.programs import PLUGIN_RESTART_SIGNAL
from shared.rbln_smi import GROUP_COMMANDS, RblnSmi
from shared.resources import Resource
from shared.rsd_group import RsdGroups
from shared.subscriber import InventorySubscriber
from shared.tracing import AllocationTracer, setup_tracing
from shared.version import VERSION


def plugin_factory(settings: Settings, table: DeviceTable, allocator: Allocator, tracer: AllocationTracer,
                   metrics: Recorder) -> Callable[[Callable[[], None]], PluginInstance]:
    """Makes the resource's plugin server, a new one for each instance."""
    frozen = False

    def new_plugin(on_stream_change: Callable[[], None]) -> PluginInstance:
        nonlocal frozen
        # Imported here: gRPC, the API, placement and prometheus_client cost a process about 16 MB, which
        # a worker whose resource the node does not have (most nodes have one of the three) never pays.
        from resource_worker.plugin_server import PluginServer

        metrics.load(table.resource.value, [command.value for command in GROUP_COMMANDS])
        server = PluginServer(table, allocator, settings.kubelet_device_plugin_path, on_stream_change, tracer,
                              metrics)
        if not frozen:
            # What the imports made lives as long as the process: out of the collector's reach, a full
            # collection no longer walks it (about 16 ms at 34 000 objects), which would otherwise land in
            # whichever GetPreferredAllocation or Allocate happened to trigger it. Collected first, so that no
            # garbage is frozen with it; once, as later instances add only a server's worth.
            gc.collect()
            gc.freeze()
            frozen = True
        return server

    return new_plugin


def build_worker(settings: Settings, resource: Resource, shutdown: ShutdownSignal, tracer: AllocationTracer,
                 metrics: Recorder) -> Worker:
    table = DeviceTable(resource)
    smi = RblnSmi(settings.rbln_smi, observe=metrics.rbln_smi)
    allocator = Allocator(table, RsdGroups(smi, settings.rsd_lock_file), settings.dev_root,
                          lambda device_id: read_status(settings.sysfs_root, device_id),
                          cdi_annotation=settings.cdi_annotation)
    return Worker(resource, table, plugin_factory(settings, table, allocator, tracer, metrics),
                  settings.kubelet_socket, settings.run_dir, shutdown)


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
    worker = build_worker(settings, resource, shutdown, tracer, metrics)
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
        tracer.shutdown()
    logger.info("Shutdown")
    exit_now(shutdown)
