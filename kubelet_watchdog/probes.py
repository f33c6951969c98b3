"""Liveness and readiness of the stack, as plain functions of what supervisord and the status files say
(docs/kubelet.md#health-probes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.programs import PROGRAMS, SCANNER, WORKER_DRA
from shared.resources import Resource

# The scanner publishes every interval; three missed publications mean it is stuck.
STALE_SCANS = 3


def current_status(status: Mapping[str, Any] | None, programs: Mapping[str, Mapping[str, Any]],
                   name: str) -> Mapping[str, Any] | None:
    """`status` if the running instance of program `name` wrote it; a dead instance's file says nothing."""
    if status is None or not status.get("pid") or status.get("pid") != programs.get(name, {}).get("pid"):
        return None
    return status


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str


def liveness(programs: Mapping[str, Mapping[str, Any]], scanner: Mapping[str, Any] | None,
             now_monotonic: float, scan_interval: float, expected: tuple[str, ...] = PROGRAMS,
             status_writable: bool = True) -> Verdict:
    """`expected`: the programs of the stack's mode (shared.programs.programs_for). `status_writable` False: the
    run dir is read-only, so no status file can be fresh and the scanner's publications are not judged (a
    read-only run dir costs observability, never the pod)."""
    for name in expected:
        state = programs.get(name, {}).get("statename", "ABSENT")
        if state != "RUNNING":
            return Verdict(False, f"{name} is {state}")
    if not status_writable:
        return Verdict(True, "every program running; run dir read-only, scanner publications not judged")
    limit = STALE_SCANS * scan_interval
    info = programs[SCANNER]
    scanner = current_status(scanner, programs, SCANNER)
    if scanner is None:
        uptime = info.get("now", 0) - info.get("start", 0)
        if uptime > limit:
            return Verdict(False, f"scanner has published nothing in {uptime:.0f}s")
        return Verdict(True, "scanner starting")
    age = now_monotonic - float(scanner.get("monotonic", 0))
    if age > limit:
        return Verdict(False, f"scanner's last publication is {age:.1f}s old")
    return Verdict(True, "every program running, scanner publishing")


def readiness(programs: Mapping[str, Mapping[str, Any]], scanner: Mapping[str, Any] | None,
              workers: Mapping[str, Mapping[str, Any] | None]) -> Verdict:
    if scanner is None:
        return Verdict(False, "no scan yet")
    if WORKER_DRA in workers:
        dra = current_status(workers[WORKER_DRA], programs, WORKER_DRA)
        if dra is None or not dra.get("registered"):
            return Verdict(False, f"{WORKER_DRA} is not registered with the kubelet")
        return Verdict(True, f"{WORKER_DRA} registered")
    counts = scanner.get("resources", {})
    for resource in Resource:
        if not counts.get(resource.value):
            continue
        name = resource.process_name
        status = current_status(workers.get(name), programs, name)
        if status is None:
            return Verdict(False, f"{name} has not reported")
        if not status.get("registered"):
            return Verdict(False, f"{resource.value} is not registered")
        if status.get("streams", 0) < 1:
            return Verdict(False, f"{resource.value} has no ListAndWatch stream")
    return Verdict(True, "every resource with devices registered and streaming")
