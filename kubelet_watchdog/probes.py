"""Liveness and readiness of the stack, as plain functions of what supervisord and the status files say
(docs/kubelet.md#health-probes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.channels.status_records import (
    Document,
    DraStatus,
    ScannerStatus,
    StatusRecord,
    WorkerStatus,
    decode,
    decode_scanner,
)
from shared.config import ResourceApi
from shared.programs import SCANNER, WORKER_DRA, expected_programs
from shared.resources import Resource

# The scanner publishes every interval; three missed publications mean it is stuck.
STALE_SCANS = 3


def current_status(document: Document | None, programs: Mapping[str, Mapping[str, Any]],
                   name: str) -> StatusRecord | None:
    """The record of program `name` in `document` (its status file as read) if the running instance wrote it;
    a dead instance's file says nothing."""
    record = decode(name, document)
    if record is None or record.stamp is None or record.stamp.pid != programs.get(name, {}).get("pid"):
        return None
    return record


def needed_programs(api: ResourceApi, scanner: Document | None) -> tuple[str, ...]:
    """The programs that must run (shared.programs.expected_programs) by the scanner's last status file, which
    says which resources the node has (a dead scanner's too: its last word is the best there is)."""
    scan = decode_scanner(scanner)
    return expected_programs(api, [] if scan is None else [name for name, count in scan.resources.items() if count])


def all_running(programs: Mapping[str, Mapping[str, Any]], names: tuple[str, ...]) -> bool:
    return all(programs.get(name, {}).get("statename") == "RUNNING" for name in names)


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str


def liveness(programs: Mapping[str, Mapping[str, Any]], scanner: Document | None,
             now_monotonic: float, scan_interval: float, expected: tuple[str, ...],
             status_writable: bool = True) -> Verdict:
    """`expected`: the programs that must run (`needed_programs`). `status_writable` False: the
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
    deadline = publication_deadline(programs, scanner, scan_interval)
    if deadline is None:
        uptime = info.get("now", 0) - info.get("start", 0)
        if uptime > limit:
            return Verdict(False, f"scanner has published nothing in {uptime:.0f}s")
        return Verdict(True, "scanner starting")
    if now_monotonic > deadline:
        return Verdict(False, f"scanner's last publication is {now_monotonic - deadline + limit:.1f}s old")
    return Verdict(True, "every program running, scanner publishing")


def publication_deadline(programs: Mapping[str, Mapping[str, Any]], scanner: Document | None,
                         scan_interval: float) -> float | None:
    """The monotonic time past which the running scanner's last publication is too old for liveness; None
    when it has published nothing (liveness then goes by its uptime)."""
    current = current_status(scanner, programs, SCANNER)
    if not isinstance(current, ScannerStatus) or current.stamp is None:
        return None
    return (current.stamp.monotonic or 0.0) + STALE_SCANS * scan_interval


def readiness(programs: Mapping[str, Mapping[str, Any]], scanner: Document | None,
              workers: Mapping[str, Document | None]) -> Verdict:
    """`scanner` and `workers`: the status files as read (a scanner's from a dead instance still says which
    resources have devices)."""
    scan = decode_scanner(scanner)
    if scan is None:
        return Verdict(False, "no scan yet")
    if WORKER_DRA in workers:
        dra = current_status(workers[WORKER_DRA], programs, WORKER_DRA)
        if not isinstance(dra, DraStatus) or not dra.registered:
            return Verdict(False, f"{WORKER_DRA} is not registered with the kubelet")
        return Verdict(True, f"{WORKER_DRA} registered")
    for resource in Resource:
        if not scan.resources.get(resource.value):
            continue
        name = resource.process_name
        status = current_status(workers.get(name), programs, name)
        if not isinstance(status, WorkerStatus):
            return Verdict(False, f"{name} has not reported")
        if not status.registered:
            return Verdict(False, f"{resource.value} is not registered")
        if (status.streams or 0) < 1:
            return Verdict(False, f"{resource.value} has no ListAndWatch stream")
    return Verdict(True, "every resource with devices registered and streaming")
