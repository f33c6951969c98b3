"""`rbln-device-plugin status`: what the stack in this pod is doing, for an operator (`kubectl exec`).

Process states come from supervisord over XML-RPC on the run dir's socket; what
each resource looks like comes from the status files the processes keep in the
run dir. A status file counts only if the running instance of its program wrote
it. Exit status: 0 when supervisord answered, 1 when it could not be asked.
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

from kubelet_watchdog.probes import PROGRAMS, SCANNER, current_status
from kubelet_watchdog.supervisor_control import SupervisorError, connect
from shared import runtime_status
from shared.config import OPTIONS
from shared.resources import Resource

_RUN_DIR = next(option for option in OPTIONS if option.field == "run_dir")
_COUNTS = ("deviceCount", "healthyCount", "unhealthyCount")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser.add_argument(_RUN_DIR.flag, dest="run_dir", metavar=_RUN_DIR.env,
                        help=f"the stack's run dir (env {_RUN_DIR.env}, default {_RUN_DIR.default})")


def _age(now: float, then: Any) -> float | None:
    return round(now - float(then), 3) if isinstance(then, (int, float)) else None


def build_report(programs: Mapping[str, Mapping[str, Any]] | None, scanner: Mapping[str, Any] | None,
                 workers: Mapping[str, Mapping[str, Any] | None], now_monotonic: float) -> dict[str, Any]:
    """The report as plain data. `programs` is None when supervisord could not be asked: then no
    status file can be trusted, since nothing says whether the process that wrote it still runs."""
    known = programs or {}
    processes = {name: {"state": known.get(name, {}).get("statename", "UNKNOWN" if programs is None else "ABSENT"),
                        "pid": known.get(name, {}).get("pid") or None,
                        "description": known.get(name, {}).get("description", "")}
                 for name in PROGRAMS}
    scanner = current_status(scanner, known, SCANNER)
    scanned = scanner.get("resources", {}) if scanner else {}
    resources = {}
    for resource in Resource:
        worker = current_status(workers.get(resource.process_name), known, resource.process_name)
        resources[resource.value] = {
            "process": resource.process_name,
            "registered": bool(worker and worker.get("registered")),
            "streams": worker.get("streams", 0) if worker else 0,
            # Without its worker, the scanner still tells how many devices the resource has.
            "deviceCount": worker.get("deviceCount") if worker else scanned.get(resource.value),
            "healthyCount": worker.get("healthyCount") if worker else None,
            "unhealthyCount": worker.get("unhealthyCount") if worker else None,
            "lastScanAgeSeconds": _age(now_monotonic, worker.get("scannedAt")) if worker else None,
        }
    return {
        "processes": processes,
        "resources": resources,
        "scanner": {"lastScanAgeSeconds": _age(now_monotonic, scanner.get("monotonic")) if scanner else None,
                    "discoveryError": scanner.get("discoveryError") if scanner else None},
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
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]


def render_text(report: Mapping[str, Any]) -> str:
    processes = _table(["PROCESS", "STATE", "PID", "DETAIL"],
                       [[name, p["state"], p["pid"], p["description"] or None]
                        for name, p in report["processes"].items()])
    resources = _table(["RESOURCE", "REGISTERED", "STREAMS", "DEVICES", "HEALTHY", "UNHEALTHY", "LAST SCAN"],
                       [[name, r["registered"], r["streams"], r["deviceCount"], r["healthyCount"],
                         r["unhealthyCount"], None if r["lastScanAgeSeconds"] is None
                         else f"{r['lastScanAgeSeconds']:.1f}s ago"]
                        for name, r in report["resources"].items()])
    scanner = report["scanner"]
    lines = [*processes, "", *resources]
    if scanner["lastScanAgeSeconds"] is not None:
        lines += ["", f"scanner: last scan {scanner['lastScanAgeSeconds']:.1f}s ago"
                      + (f", discovery failing: {scanner['discoveryError']}" if scanner["discoveryError"] else "")]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    run_dir = pathlib.Path(args.run_dir or os.environ.get(_RUN_DIR.env) or _RUN_DIR.default)
    try:
        programs = connect(run_dir).programs()
    except SupervisorError as exc:
        print(f"rbln-device-plugin status: cannot ask supervisord in {run_dir}: {exc}", file=sys.stderr)
        programs = None
    report = build_report(programs, runtime_status.read_status(run_dir, SCANNER),
                          {r.process_name: runtime_status.read_status(run_dir, r.process_name) for r in Resource},
                          time.monotonic())
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    return 0 if programs is not None else 1
