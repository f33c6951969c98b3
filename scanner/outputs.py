"""What the scanner does with each scan once its workers are asked for: publish the inventories to the workers
(ZeroMQ), check that the CDI device resolves, log what an operator must know, keep the node's labels and the
scanner's status file current.

Loaded after the first scan (scanner/main.py): ZeroMQ and the CDI spec reader are some 40 ms of imports that
the first scan's worker starts need not wait for.
"""

from __future__ import annotations

import os
import time

import zmq
from loguru import logger

from scanner.cdi_watch import CdiWatch
from scanner.discovery import Exclusion, ScanResult
from scanner.feature_file import FeatureFile
from scanner.node_labels import NodeFacts, derive_labels
from scanner.publisher import InventoryPublisher
from shared.cdi.stale_specs import remove_stale_specs
from shared.channels import inventory_protocol, status_files, status_records
from shared.channels.status_records import ScannerStatus
from shared.config import Settings
from shared.node.device_health import Health, HealthHistory
from shared.node.rbln_smi import SmiCommand
from shared.observability.metrics import Recorder
from shared.programs import SCANNER
from shared.resources import Resource


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


class ScanOutputs:
    """Everything a scan is turned into, in order: snapshots, metrics, labels, the status file."""

    def __init__(self, settings: Settings, metrics: Recorder):
        self._settings = settings
        self._metrics = metrics
        remove_stale_specs(settings.cdi_root)
        # Any value the scanner never had before: `uuid` would add some 4 ms to its start for one random string.
        self._epoch = os.urandom(16).hex()
        self._sequence = {resource: 0 for resource in Resource}
        self._reporter = ScanReporter()
        self._labeller = (NodeLabeller(FeatureFile(settings.nfd_feature_file, settings.device_scan_interval))
                          if settings.nfd_feature_file else None)
        self._cdi = CdiWatch(settings.cdi_spec_dirs, settings.cdi_annotation)
        self._context = zmq.Context()
        self._publisher = InventoryPublisher(self._context, settings.run_dir)
        self._publisher.start()

    def take(self, result: ScanResult, started: float) -> None:
        """Publish `result` (the scan that began at `started`, CLOCK_MONOTONIC) and record it."""
        cdi_state = self._cdi.check()
        scanned_at = time.monotonic_ns()
        for resource, devices in result.inventories.items():
            self._sequence[resource] += 1
            self._publisher.publish(inventory_protocol.InventoryMessage(
                resource, self._epoch, self._sequence[resource], scanned_at, devices, result.error,
                cdi_state.resolvable, result.driver_version))
        # The value files and their zero series are made once the first scan is published, not before: the
        # workers wait for it. Later calls find them made.
        self._metrics.load(smi_commands=[SmiCommand.LIST.value])
        self._reporter.report(result, time.monotonic() - started)
        if self._labeller is not None:
            self._labeller.update(result)
        self._metrics.flush()
        status_records.write(self._settings.run_dir, SCANNER, ScannerStatus(
            resources={r.value: len(d) for r, d in result.inventories.items()},
            discovery_error=result.error,
            scan_ms=round((time.monotonic() - started) * 1000, 3),
            cdi=cdi_state.record(self._cdi.dirs, self._settings.cdi_annotation.value)))

    def close(self) -> None:
        if self._labeller is not None:
            self._labeller.remove()
        self._publisher.stop()
        self._context.term()
        status_files.remove_status(self._settings.run_dir, SCANNER)
