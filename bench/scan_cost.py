"""One scan of the 64-device node: its duration split into rbln-smi and sysfs, and the scanner's own CPU.

    python bench/scan_cost.py [--quick]

Runs scanner.discovery.scan in this process, as the scanner does, against the
simulated node (rbln-smi lists 80 entries: 16 PFs hosting VFs and their 64 VFs).
- duration: wall time of scan(); `smi` is the inventory call (spawn, wait, JSON
  parse), `sysfs` the rest (SR-IOV role, NUMA, PCI path and status of each device).
- own CPU: time.thread_time() of the scanning thread (the parent side of the spawn,
  the parse, the sysfs reads); per thread, so nothing else the runner's process
  does is counted. rbln-smi's own CPU is not in it: it is reported apart, from the
  reaped children's times (a Python stand-in here, a native tool on a real node).
Publishing the result (msgpack over ZeroMQ) is not part of scan(); the idle benchmark
reports the whole scanner process's CPU per scan.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import common
from scanner.discovery import scan
from shared.node.rbln_smi import RblnSmi, SmiListing

SCANS = 200
QUICK_SCANS = 20
WARM_UP = 3
OWN_CPU_GOAL_MS = 20.0


class _MeteredSmi(RblnSmi):
    """RblnSmi whose inventory call also counts this thread's CPU, to split own CPU into rbln-smi and sysfs."""

    cpu_seconds = 0.0

    def inventory(self) -> SmiListing:
        started = time.thread_time()
        try:
            return super().inventory()
        finally:
            self.cpu_seconds += time.thread_time() - started


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def measure(scans: int) -> list[dict]:
    samples: dict[str, list[float]] = {key: [] for key in ("wall", "smi", "sysfs", "cpu", "smi_cpu", "sysfs_cpu",
                                                           "child_cpu")}
    with common.temporary_node(common.vf64_spec()) as node:
        smi = _MeteredSmi(node.rbln_smi)
        for index in range(WARM_UP + scans):
            smi.cpu_seconds = 0.0
            children, cpu, wall = _children_cpu(), time.thread_time(), time.perf_counter()
            result = scan(smi, node.sysfs_root)
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            children = _children_cpu() - children
            if result.error is not None or not any(result.inventories.values()):
                raise RuntimeError(f"scan found no device: {result.error}")
            if index < WARM_UP:
                continue
            for key, seconds in (("wall", wall), ("smi", result.smi_seconds), ("sysfs", wall - result.smi_seconds),
                                 ("cpu", cpu), ("smi_cpu", smi.cpu_seconds), ("sysfs_cpu", cpu - smi.cpu_seconds),
                                 ("child_cpu", children)):
                samples[key].append(seconds * 1000)
        devices = sum(len(d) for d in result.inventories.values())
    own_cpu_p99 = common.percentile(samples["cpu"], 0.99)
    return [{
        "benchmark": "scan/vf64",
        "scans": scans,
        "advertised": devices,
        **common.spread(samples["wall"]),
        "smi_p50_ms": round(common.percentile(samples["smi"], 0.5), 3),
        "sysfs_p50_ms": round(common.percentile(samples["sysfs"], 0.5), 3),
        **common.spread(samples["cpu"], "own_cpu_"),
        "own_cpu_smi_p50_ms": round(common.percentile(samples["smi_cpu"], 0.5), 3),
        "own_cpu_sysfs_p50_ms": round(common.percentile(samples["sysfs_cpu"], 0.5), 3),
        "smi_child_cpu_p50_ms": round(common.percentile(samples["child_cpu"], 0.5), 3),
        "goal": f"own CPU p99 <= {OWN_CPU_GOAL_MS:g} ms per scan",
        "met": own_cpu_p99 <= OWN_CPU_GOAL_MS,
    }]


def run(quick: bool) -> list[dict]:
    return measure(QUICK_SCANS if quick else SCANS)


if __name__ == "__main__":
    common.script_main(__doc__, run, f"{QUICK_SCANS} scans instead of {SCANS}")
