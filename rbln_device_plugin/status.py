"""`rbln-device-plugin status`: what the stack in this pod is doing, for an operator (`kubectl exec`).

Process states come from supervisord over XML-RPC on the run dir's socket; what
each resource and device looks like comes from the status files the processes keep
in the run dir. A status file counts only if the running instance of its program
wrote it. Which container holds each device comes from the kubelet's PodResources
API; when it cannot be asked the holders are shown as unknown, and nothing else
changes. Exit status: 0 when supervisord answered, 1 when it could not be asked.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from collections.abc import Mapping
from typing import Any

from kubelet_watchdog.probes import current_status
from shared import process_status
from shared.config import OPTIONS, Option
from shared.pod_resources import DeviceKey, Holder, PodResourcesUnavailable, device_holders
from shared.programs import DRA_PROGRAMS, PROGRAMS, SCANNER, WORKER_DRA, WORKERS
from shared.resources import Resource
from shared.status_records import Document, DraStatus, ScannerStatus, WorkerStatus
from shared.supervisord.client import SupervisorError, connect

_RUN_DIR = next(option for option in OPTIONS if option.field == "run_dir")
_POD_RESOURCES = next(option for option in OPTIONS if option.field == "kubelet_pod_resources_socket")
UNKNOWN_HOLDER = "unknown"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    for option, what in ((_RUN_DIR, "the stack's run dir"),
                         (_POD_RESOURCES, "the kubelet's PodResources socket, asked which pod holds each device")):
        assert option.flag is not None, f"{option.env} is a setting with a flag"
        parser.add_argument(option.flag, dest=option.field, metavar=option.env,
                            help=f"{what} (env {option.env}, default {option.default})")


def _setting(args: argparse.Namespace, option: Option) -> pathlib.Path:
    return pathlib.Path(getattr(args, option.field, None) or os.environ.get(option.env) or option.default)


def _age(now: float, then: float | None) -> float | None:
    return None if then is None else round(now - then, 3)


def _devices(resource: Resource, worker: WorkerStatus | None,
             holders: Mapping[DeviceKey, list[Holder]] | None) -> list[dict[str, Any]]:
    """The devices the resource's worker advertises; `heldBy` is None when the kubelet could not be asked."""
    if worker is None or worker.devices is None:
        return []
    return [{"device": device, "resource": resource.value, "health": state.health, "status": state.status,
             "heldBy": None if holders is None else [str(h) for h in holders.get((resource.value, device), [])]}
            for device, state in sorted(worker.devices.items())]


def _worker(workers: Mapping[str, Document | None], programs: Mapping[str, Mapping[str, Any]],
            name: str) -> WorkerStatus | None:
    record = current_status(workers.get(name), programs, name)
    return record if isinstance(record, WorkerStatus) else None


def build_report(programs: Mapping[str, Mapping[str, Any]] | None, scanner: Document | None,
                 workers: Mapping[str, Document | None], now_monotonic: float,
                 holders: Mapping[DeviceKey, list[Holder]] | None = None,
                 pod_resources_error: str | None = None) -> dict[str, Any]:
    """The report as plain data. `programs` is None when supervisord could not be asked: then no
    status file can be trusted, since nothing says whether the process that wrote it still runs.
    `holders` is None when the kubelet could not be asked which container holds which device."""
    known = programs or {}
    processes = {name: {"state": known.get(name, {}).get("statename", "UNKNOWN" if programs is None else "ABSENT"),
                        "pid": known.get(name, {}).get("pid") or None,
                        "description": known.get(name, {}).get("description", "")}
                 for name in (DRA_PROGRAMS if WORKER_DRA in known else PROGRAMS)}
    current = current_status(scanner, known, SCANNER)
    scan = current if isinstance(current, ScannerStatus) else None
    resources = {}
    devices = []
    for resource in Resource:
        worker = _worker(workers, known, resource.process_name)
        devices += _devices(resource, worker, holders)
        resources[resource.value] = {
            "process": resource.process_name,
            "registered": bool(worker and worker.registered),
            "streams": (worker.streams or 0) if worker else 0,
            # Without its worker, the scanner still tells how many devices the resource has.
            "deviceCount": worker.device_count if worker else scan.resources.get(resource.value) if scan else None,
            "healthyCount": worker.healthy_count if worker else None,
            "unhealthyCount": worker.unhealthy_count if worker else None,
            "lastScanAgeSeconds": _age(now_monotonic, worker.scanned_at) if worker else None,
        }
    dra = current_status(workers.get(WORKER_DRA), known, WORKER_DRA)
    return {
        "processes": processes,
        "resources": resources,
        "devices": devices,
        "podResources": {"error": pod_resources_error},
        "scanner": {"lastScanAgeSeconds": _age(now_monotonic, scan.stamp.monotonic) if scan and scan.stamp else None,
                    "discoveryError": scan.discovery_error if scan else None},
        # The scanner's latest CDI check (None without a current scanner status).
        "cdi": scan.cdi.to_json() if scan and scan.cdi else None,
        # worker-dra's status in DRA mode (None otherwise, or without a current status of it).
        "dra": dra.to_json() if isinstance(dra, DraStatus) else None,
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header] + [[_cell(value) for value in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]


def render_text(report: Mapping[str, Any]) -> str:
    processes = _table(["PROCESS", "STATE", "PID", "DETAIL"],
                       [[name, p["state"], p["pid"], p["description"] or None]
                        for name, p in report["processes"].items()])
    resources = _table(["RESOURCE", "REGISTERED", "STREAMS", "DEVICES", "HEALTHY", "UNHEALTHY", "LAST SCAN"],
                       [[name, r["registered"], r["streams"], r["deviceCount"], r["healthyCount"],
                         r["unhealthyCount"], None if r["lastScanAgeSeconds"] is None
                         else f"{r['lastScanAgeSeconds']:.1f}s ago"]
                        for name, r in report["resources"].items()])
    lines = [*processes, "", *resources]
    if report["devices"]:
        lines += ["", *_table(["DEVICE", "RESOURCE", "HEALTH", "STATUS", "HELD BY"],
                              [[d["device"], d["resource"], d["health"], d["status"],
                                UNKNOWN_HOLDER if d["heldBy"] is None else ", ".join(d["heldBy"]) or None]
                               for d in report["devices"]])]
    if report["podResources"]["error"]:
        lines += ["", f"held by: {UNKNOWN_HOLDER}; the kubelet's PodResources API cannot be asked: "
                      f"{report['podResources']['error']}"]
    scanner = report["scanner"]
    if scanner["lastScanAgeSeconds"] is not None:
        lines += ["", f"scanner: last scan {scanner['lastScanAgeSeconds']:.1f}s ago"
                      + (f", discovery failing: {scanner['discoveryError']}" if scanner["discoveryError"] else "")]
    cdi = report["cdi"]
    if cdi is not None:
        lines += ["", *_cdi_lines(cdi)]
    dra = report.get("dra")
    if dra is not None:
        lines += ["", f"dra: registered {_cell(dra['registered'])}, {_cell(dra['devices'])} devices, "
                      f"{_cell(dra['preparedClaims'])} prepared claims, "
                      f"slice generation {_cell(dra['sliceGeneration'])}, "
                      f"{_cell(dra['healthStreams'])} health streams, {_cell(dra['taintedDevices'])} tainted"]
    return "\n".join(lines)


def _cdi_lines(cdi: Mapping[str, Any]) -> list[str]:
    dirs = ", ".join(str(d) for d in cdi.get("specDirs") or ()) or "-"
    where = ", ".join(str(p) for p in cdi.get("definedIn") or ())
    if cdi.get("resolvable"):
        verdict = f"resolvable (defined in {where})"
    elif cdi.get("conflict"):
        verdict = f"UNRESOLVABLE: defined twice in one directory ({', '.join(map(str, cdi['conflict']))})"
    else:
        verdict = "UNRESOLVABLE: no valid spec defines it; CDI-enabled runtimes (containerd 2.x, CRI-O) refuse " \
                  "containers whose Allocate answer names it"
    lines = [f"cdi: {cdi.get('device')} {verdict}", f"cdi: spec dirs {dirs}; annotation {cdi.get('annotation')}"]
    for refused in cdi.get("refusedSpecs") or ():
        if isinstance(refused, Mapping):
            lines.append(f"cdi: spec refused: {refused.get('path')}: {refused.get('err')}")
    return lines


def gather(run_dir: pathlib.Path, pod_resources_socket: pathlib.Path) -> tuple[dict[str, Any], str | None]:
    """The report, and why supervisord could not be asked (None when it answered)."""
    try:
        programs, supervisord_error = connect(run_dir).programs(), None
    except SupervisorError as exc:
        programs, supervisord_error = None, f"cannot ask supervisord in {run_dir}: {exc}"
    holders, pod_resources_error = None, None
    try:
        holders = device_holders(pod_resources_socket, [r.value for r in Resource])
    except PodResourcesUnavailable as exc:
        pod_resources_error = str(exc)
    report = build_report(programs, process_status.read_status(run_dir, SCANNER),
                          {name: process_status.read_status(run_dir, name) for name in (*WORKERS, WORKER_DRA)},
                          time.monotonic(), holders, pod_resources_error)
    return report, supervisord_error


def run(args: argparse.Namespace) -> int:
    report, supervisord_error = gather(_setting(args, _RUN_DIR), _setting(args, _POD_RESOURCES))
    if supervisord_error:
        print(f"rbln-device-plugin status: {supervisord_error}", file=sys.stderr)
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    return 0 if supervisord_error is None else 1
