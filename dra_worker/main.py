"""worker-dra: the kubelet DRA plugin of driver npu.rebellions.ai (RESOURCE_API=dra), wired to the node,
the scanner's inventory channel, the kubelet and the API server (docs/dra.md)."""

from __future__ import annotations

import pathlib
import threading
from typing import Any

import grpc
import zmq
from loguru import logger

from dra_worker.checkpoint import Checkpoint
from dra_worker.claim_status import ClaimStatusWriter
from dra_worker.health import HealthReports, HealthWatch, add_health_services
from dra_worker.inventory import InventoryState
from dra_worker.kube import ApiFailure
from dra_worker.prepare import Preparer, PrepareSettings
from dra_worker.publisher import SlicePublisher
from dra_worker.rebuild import rebuild_claims
from dra_worker.registration import RegistrationService
from dra_worker.server import UnixServer
from dra_worker.servicer import DraPlugin, add_services
from shared.channels import status_files, status_records
from shared.channels.inventory_subscriber import InventorySubscriber
from shared.channels.status_records import DraStatus
from shared.config import DRA_DRIVER, Settings
from shared.kubelet.pluginregistration.v1 import api_pb2_grpc as registration_grpc
from shared.kubelet.streams import StreamTracker
from shared.node.driver_status import read_status
from shared.node.rbln_smi import GROUP_COMMANDS, RblnSmi
from shared.node.rsd_group import RsdGroups
from shared.observability.metrics import Recorder, recorder_for
from shared.observability.tracing import setup_tracing
from shared.programs import WORKER_DRA
from shared.resources import Resource
from shared.supervision.process_lifecycle import ShutdownSignal, exit_now, start_process
from shared.version import VERSION

Json = dict[str, Any]


class LazyApi:
    """The API client, made at its first use: credentials that are missing now (no service account token
    mounted yet, an unreadable kubeconfig) fail that call, which is retried, never the process."""

    def __init__(self, kubeconfig: pathlib.Path | None):
        self._kubeconfig = kubeconfig
        self._lock = threading.Lock()  # guards _api while it is made
        self._api: Any = None

    def _get(self) -> Any:
        with self._lock:
            if self._api is None:
                from dra_worker.api_credentials import ConfigError
                from dra_worker.kube import KubeApi

                try:
                    self._api = KubeApi(self._kubeconfig)
                except ConfigError as exc:
                    source = str(self._kubeconfig) if self._kubeconfig else "the service account"
                    raise ApiFailure(f"API server credentials from {source}: {exc}") from None
            return self._api

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)


def _follow_inventories(context: zmq.Context, settings: Settings,
                        inventory: InventoryState) -> list[InventorySubscriber]:
    """One subscriber per resource, started: the worker offers every device the scanner found."""
    subscribers = [InventorySubscriber(context, settings.run_dir, resource, inventory.on_inventory,
                                       heartbeat_timeout=max(1.0, 3 * settings.device_scan_interval))
                   for resource in Resource]
    for subscriber in subscribers:
        subscriber.start()
    return subscribers


def _preparer(settings: Settings, api: LazyApi, inventory: InventoryState,
              metrics: Recorder) -> tuple[Preparer, Checkpoint]:
    """Prepare and Unprepare on this node: its checkpoint (rebuilt from the CDI specs and rbln-smi's groups when
    unreadable), its RSD groups and its devices' status files."""
    smi = RblnSmi(settings.rbln_smi, observe=metrics.rbln_smi)
    checkpoint = Checkpoint(settings.dra_plugin_dir, rebuild=lambda: rebuild_claims(settings.cdi_root, smi.groups()),
                            on_rebuilt=metrics.checkpoint_rebuild)
    return Preparer(PrepareSettings(
        api=api, inventory=inventory.current, rsd_groups=RsdGroups(smi, settings.rsd_lock_file), checkpoint=checkpoint,
        read_status=lambda device: read_status(settings.sysfs_root, device), pool=settings.node_name,
        cdi_root=settings.cdi_root, dev_root=settings.dev_root, cdi_annotation=settings.cdi_annotation,
        on_stale_unprepared=metrics.stale_claim_unprepared)), checkpoint


def _server(settings: Settings, plugin: DraPlugin, health_watch: HealthWatch,
            registration: RegistrationService) -> UnixServer:
    """The DRA socket (the DRA and health services) and the registration socket, not started yet."""
    def services(server: grpc.Server) -> None:
        add_services(server, plugin)
        add_health_services(server, health_watch)
        registration_grpc.add_RegistrationServicer_to_server(registration, server)

    return UnixServer(settings.dra_socket, services, "dra", announced=settings.dra_registration_socket)


def main() -> None:
    settings = start_process(WORKER_DRA, driver=DRA_DRIVER)
    shutdown = ShutdownSignal().install()
    metrics = recorder_for(settings.metrics_port, settings.run_dir)
    metrics.load(smi_commands=[command.value for command in GROUP_COMMANDS], dra=True)
    tracer = setup_tracing(settings.otlp_endpoint, VERSION, settings.node_name)
    settings.dra_plugin_dir.mkdir(parents=True, exist_ok=True)
    api = LazyApi(settings.kubeconfig)

    inventory = InventoryState()
    publisher = SlicePublisher(api, settings.node_name, inventory.current, on_publish=metrics.slice_publish,
                               on_watch_restart=metrics.slice_watch_restart,
                               taint_effect=settings.dra_unhealthy_taint_effect)
    health = HealthReports()

    def inventory_changed() -> None:
        publisher.wake()
        health.update(inventory.current())

    inventory.on_change = inventory_changed  # before any snapshot can arrive: the subscribers start below
    preparer, checkpoint = _preparer(settings, api, inventory, metrics)
    registration = RegistrationService(settings.dra_socket)

    status = status_records.ChangeWriter(settings.run_dir, WORKER_DRA)

    def report() -> None:
        """The status file the probes, metrics and `status` read; after every call and every scan interval."""
        metrics.flush()
        status.write(DraStatus(
            registered=registration.registered.is_set(), prepared_claims=preparer.prepared_count(),
            slice_generation=publisher.generation, devices=len(inventory.current().devices),
            health_streams=health_watch.streams.open_streams, tainted_devices=publisher.tainted))

    registration.on_change = report
    plugin = DraPlugin(preparer, settings.node_name, tracer, metrics, on_change=report,
                       claim_status=ClaimStatusWriter(api, settings.node_name, inventory.current))
    health_watch = HealthWatch(health, settings.node_name, StreamTracker(on_change=report))

    server = _server(settings, plugin, health_watch, registration)
    context = zmq.Context()
    subscribers = _follow_inventories(context, settings, inventory)
    try:
        server.start()
        logger.info("Serving the DRA plugin", driver=DRA_DRIVER, endpoint=str(settings.dra_socket),
                    registrationSocket=str(settings.dra_registration_socket), checkpoint=str(checkpoint.path))
        publisher.start()
        report()
        while not shutdown.wait(settings.device_scan_interval):
            report()
    finally:
        server.stop()
        publisher.stop()
        for subscriber in subscribers:
            subscriber.stop()
        context.term()
        tracer.shutdown()
        status_files.remove_status(settings.run_dir, WORKER_DRA)
    logger.info("Shutdown")
    exit_now(shutdown)
