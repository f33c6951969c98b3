"""The scanner process: scan the node every interval and publish each resource's inventory."""

from __future__ import annotations

import os
import time

import zmq
from loguru import logger

from scanner.cdi_watch import CdiWatch
from scanner.discovery import Exclusion, ScanResult, scan
from scanner.feature_file import FeatureFile
from scanner.node_labels import NodeFacts, derive_labels
from scanner.publisher import InventoryPublisher
from scanner.worker_demand import WorkerDemand, absent_grace, supervisord_orders
from shared.cdi.stale_specs import remove_stale_specs
from shared.channels import inventory_protocol, status_files, status_records
from shared.channels.status_records import ScannerStatus
from shared.config import RUN_DIR_ENV, ResourceApi, Settings
from shared.fs.safe_open import ensure_private_dir
from shared.node.device_health import Health, HealthHistory
from shared.node.rbln_smi import RblnSmi, SmiCommand
from shared.observability.metrics import Recorder, recorder_for
from shared.programs import SCANNER
from shared.resources import Resource
from shared.supervision.process_lifecycle import ShutdownSignal, exit_now, start_process


class ScanReporter:
    """Logs what a scan found that an operator must know, without repeating a steady state."""

    def __init__(self) -> None:
        self._excluded: frozenset[Exclusion] = frozenset()
        self._unreadable: frozenset[Exclusion] = frozenset()
        self._failing = False

    def report(self, result: ScanResult, duration: float) -> None:
        if result.error is not None:
            # Repeated on every scan: the node has no usable device until this clears.
            logger.error("Device discovery failed; reporting zero devices until it recovers", err=result.error)
        elif self._failing:
            logger.info("Device discovery recovered")
        self._failing = result.error is not None
        excluded = frozenset(result.excluded)
        for exclusion in sorted(excluded - self._excluded, key=lambda e: e.device):
            logger.error("Device excluded from advertisement", device=exclusion.device, err=exclusion.reason)
        self._excluded = excluded if result.error is None else self._excluded
        unreadable = frozenset(result.unreadable)
        for problem in sorted(unreadable - self._unreadable, key=lambda e: e.device):
            logger.warning("Device attribute cannot be read; advertising the device without it",
                           device=problem.device, err=problem.reason)
        self._unreadable = unreadable if result.error is None else self._unreadable
        logger.debug("Reconciled device inventory", durationMs=round(duration * 1000, 3),
                     smiMs=round(result.smi_seconds * 1000, 3),
                     deviceCount=sum(len(d) for d in result.inventories.values()),
                     resources={r.value: len(d) for r, d in result.inventories.items() if d})


class NodeLabeller:
    """Turns each scan into the node's labels and keeps them in NFD_FEATURE_FILE.

    Health is judged as the workers judge it (shared.node.device_health), with a history of its own, so
    `npu.healthy` counts the devices the kubelet is told are Healthy."""

    def __init__(self, feature_file: FeatureFile) -> None:
        self._file = feature_file
        self._history = HealthHistory()

    def facts(self, result: ScanResult) -> NodeFacts | None:
        if result.error is not None:
            return None
        advertised = [device for devices in result.inventories.values() for device in devices]
        healthy = sum(self._history.observe(d.device_id, d.status, d.observed_at_ns).health is Health.HEALTHY
                      for d in advertised)
        return NodeFacts(npu_products=result.npu_products, vf1_count=len(result.inventories[Resource.NPU_VF1]),
                         vf4_count=len(result.inventories[Resource.NPU_VF4]), healthy=healthy,
                         driver_version=result.driver_version)

    def update(self, result: ScanResult) -> None:
        facts = self.facts(result)
        self._file.update(None if facts is None else derive_labels(facts))

    def remove(self) -> None:
        self._file.remove()


def warn_if_legacy_names_asked_for(settings: Settings) -> None:
    """USE_GENERIC_RESOURCE_NAME=false asked the original for per-product resource names; there are none here.

    The scanner is the process that names the resources, so it alone warns: once when the stack starts
    (again only if the scanner itself is restarted), not once per process. Every process shows the
    setting in its startup record."""
    if not settings.use_generic_resource_name:
        logger.warning("Legacy resource names are not supported; advertising the generic names",
                       useGenericResourceName=False, resourceNames=[resource.value for resource in Resource])


def worker_demand(settings: Settings) -> WorkerDemand | None:
    """Who starts and stops the device plugin workers: this scanner, when supervisord runs it in device plugin
    mode (in DRA mode supervisord starts worker-dra itself; run alone, the scanner has no workers)."""
    if settings.resource_api is not ResourceApi.DEVICE_PLUGIN or "SUPERVISOR_SERVER_URL" not in os.environ:
        return None
    return WorkerDemand(supervisord_orders(settings.run_dir), time.monotonic,
                        absent_grace(settings.device_scan_interval))


def run(settings: Settings, shutdown: ShutdownSignal, metrics: Recorder) -> None:
    warn_if_legacy_names_asked_for(settings)
    ensure_private_dir(settings.run_dir, RUN_DIR_ENV)
    remove_stale_specs(settings.cdi_root)
    smi = RblnSmi(settings.rbln_smi, observe=metrics.rbln_smi)
    # Any value the scanner never had before: `uuid` would add some 4 ms to its start for one random string.
    epoch = os.urandom(16).hex()
    sequence = {resource: 0 for resource in Resource}
    reporter = ScanReporter()
    labeller = (NodeLabeller(FeatureFile(settings.nfd_feature_file, settings.device_scan_interval))
                if settings.nfd_feature_file else None)
    cdi = CdiWatch(settings.cdi_spec_dirs, settings.cdi_annotation)
    demand = worker_demand(settings)
    context = zmq.Context()
    publisher = InventoryPublisher(context, settings.run_dir)
    publisher.start()
    try:
        while not shutdown.is_set():
            started = time.monotonic()
            result = scan(smi, settings.sysfs_root)
            metrics.scan(time.monotonic() - started)
            if demand is not None:
                # Before the publication: a new worker's start (its interpreter, its imports) is the longest
                # part of its way to Register; it asks for its snapshot once it is up.
                demand.follow({r: len(d) for r, d in result.inventories.items()}, result.error is not None)
            cdi_state = cdi.check()
            scanned_at = time.monotonic_ns()
            for resource, devices in result.inventories.items():
                sequence[resource] += 1
                publisher.publish(inventory_protocol.InventoryMessage(resource, epoch, sequence[resource], scanned_at,
                                                       devices, result.error, cdi_state.resolvable,
                                                       result.driver_version))
            # The value files and their zero series are made once the first scan is published, not before: the
            # workers wait for it. Later calls find them made.
            metrics.load(smi_commands=[SmiCommand.LIST.value])
            reporter.report(result, time.monotonic() - started)
            if labeller is not None:
                labeller.update(result)
            metrics.flush()
            status_records.write(settings.run_dir, SCANNER, ScannerStatus(
                resources={r.value: len(d) for r, d in result.inventories.items()},
                discovery_error=result.error,
                scan_ms=round((time.monotonic() - started) * 1000, 3),
                cdi=cdi_state.record(cdi.dirs, settings.cdi_annotation.value)))
            shutdown.wait(max(0.0, started + settings.device_scan_interval - time.monotonic()))
    finally:
        if labeller is not None:
            labeller.remove()
        publisher.stop()
        context.term()
        status_files.remove_status(settings.run_dir, SCANNER)


def main() -> None:
    settings = start_process(SCANNER)
    shutdown = ShutdownSignal().install()
    run(settings, shutdown, recorder_for(settings.metrics_port, settings.run_dir))
    logger.info("Shutdown")
    exit_now(shutdown)
