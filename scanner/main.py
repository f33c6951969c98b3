"""The scanner process: scan the node every interval, have supervisord run the workers its resources need, and
publish each resource's inventory (scanner/outputs.py)."""

from __future__ import annotations

import os
import time

from loguru import logger

from scanner.discovery import scan
from scanner.worker_demand import WorkerDemand, absent_grace, supervisord_orders
from shared.config import RUN_DIR_ENV, ResourceApi, Settings
from shared.fs.safe_open import ensure_private_dir
from shared.node.rbln_smi import RblnSmi
from shared.observability.metrics import Recorder, recorder_for
from shared.programs import SCANNER
from shared.resources import Resource
from shared.supervision.process_lifecycle import ShutdownSignal, exit_now, start_process


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
    smi = RblnSmi(settings.rbln_smi, observe=metrics.rbln_smi)
    demand = worker_demand(settings)
    outputs = None
    try:
        while not shutdown.is_set():
            started = time.monotonic()
            result = scan(smi, settings.sysfs_root)
            metrics.scan(time.monotonic() - started)
            if demand is not None:
                # Before the publication: a new worker's start (its interpreter, its imports) is the longest
                # part of its way to Register; it asks for its snapshot once it is up.
                demand.follow({r: len(d) for r, d in result.inventories.items()}, result.error is not None)
            if outputs is None:
                from scanner.outputs import ScanOutputs  # after the first scan's demand: see its docstring

                outputs = ScanOutputs(settings, metrics)
            outputs.take(result, started)
            shutdown.wait(max(0.0, started + settings.device_scan_interval - time.monotonic()))
    finally:
        if outputs is not None:
            outputs.close()


def main() -> None:
    settings = start_process(SCANNER)
    shutdown = ShutdownSignal().install()
    run(settings, shutdown, recorder_for(settings.metrics_port, settings.run_dir))
    logger.info("Shutdown")
    exit_now(shutdown)
