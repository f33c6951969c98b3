"""Idle cost of the whole stack on the 64-device node at the default 5 s scan interval.

    python bench/idle_cost.py [--quick]

The stack runs in its default configuration (health service and metrics endpoint on,
tracing off, log level info, log files on) with the kubelet simulator connected (npu-vf4 registered,
its ListAndWatch stream open) and nothing else happening. After start-up has settled,
/proc/<pid>/stat of supervisord and each of its programs is read at the start and at the
end of the window (60 s; 15 s quick). CPU is utime+stime over the window as a
percentage of one core; "with rbln-smi" adds the reaped children's cutime+cstime,
i.e. the rbln-smi stand-in the scanner runs on every scan (a Python interpreter here,
a native tool on a real node). Memory is Rss and Pss from smaps_rollup at the end.
"""

from __future__ import annotations

import pathlib
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import common
from simulator.smi_state import INVENTORY

SCAN_INTERVAL = "5s"
# The health service and the metrics endpoint are on by default (ports 51515 and 51516); port 0 runs
# each on a free port. Nothing scrapes during the window: a scrape's cost is scrape_cost.py's.
HEALTH_PORT = "0"
METRICS_PORT = "0"
WINDOW_SECONDS = 60.0
QUICK_WINDOW_SECONDS = 15.0
# Start-up (imports, first scans, registration, the first ListAndWatch) is not idle: let it pass.
SETTLE_SECONDS = 6.0
CPU_GOAL_PERCENT = 1.0
RSS_GOAL_MB = 250.0


def _sample(pids: list[int]) -> dict[int, common.CpuTimes]:
    """CPU times of the processes of `pids` that are still alive."""
    sample = {}
    for pid in pids:
        try:
            sample[pid] = common.cpu_times(pid)
        except FileNotFoundError:
            pass  # a process that exited (and its CPU) is reported by the `exited` figure
    return sample


def _mb(kb: int) -> float:
    return round(kb / 1024, 1)


def _percent(ticks: int, seconds: float) -> float:
    return round(100.0 * ticks / common.CLOCK_TICKS / seconds, 3)


def measure(window: float) -> list[dict]:
    with common.temporary_node(common.vf64_spec()) as node, \
            common.running_stack(node, SCAN_INTERVAL, HEALTHCHECK_PORT=HEALTH_PORT,
                                 METRICS_PORT=METRICS_PORT) as (_kubelet, stack):
        time.sleep(SETTLE_SECONDS)
        pids = common.stack_processes(stack.pid)
        names = {pid: common.process_name(pid) for pid in pids}
        started_wall, started = time.time(), time.monotonic()
        before = _sample(pids)
        time.sleep(window)
        after = _sample(pids)
        elapsed = time.monotonic() - started
        ended_wall = time.time()
        pids = [pid for pid in pids if pid in before and pid in after]
        memory = {pid: common.memory(pid) for pid in pids}
        scans = sum(1 for call in node.smi_calls()
                    if call["command"] == INVENTORY and started_wall <= call["start"] <= ended_wall)
        started_meanwhile = len(set(common.stack_processes(stack.pid)) - set(before))

    own = {pid: after[pid].own - before[pid].own for pid in pids}
    children = {pid: after[pid].children - before[pid].children for pid in pids}
    total_own, total_children = sum(own.values()), sum(children.values())
    scanner = [pid for pid in pids if names[pid] == "scanner"]
    rss_total = sum(m.rss_kb for m in memory.values())
    cpu_percent = _percent(total_own, elapsed)
    rows = [{
        "benchmark": "idle/cpu",
        "window_s": round(elapsed, 1),
        "cpu_pct": cpu_percent,
        "cpu_pct_with_smi": _percent(total_own + total_children, elapsed),
        "scans": scans,
        "scanner_cpu_ms_per_scan": (round(sum(own[p] for p in scanner) * 1000 / common.CLOCK_TICKS / scans, 1)
                                    if scans and scanner else None),
        "processes": len(pids),
        "exited": len(before) - len(pids),
        "started": started_meanwhile,
        "goal": f"<= {CPU_GOAL_PERCENT:g}% of one core (without rbln-smi)",
        "met": cpu_percent <= CPU_GOAL_PERCENT,
    }, {
        "benchmark": "idle/memory",
        "rss_mb_total": _mb(rss_total),
        "pss_mb_total": _mb(sum(m.pss_kb for m in memory.values())),
        "goal": f"<= {RSS_GOAL_MB:g} MB resident in total",
        "met": rss_total / 1024 <= RSS_GOAL_MB,
    }]
    for pid in pids:
        rows.append({"benchmark": f"idle/{names[pid]}", "cpu_pct": _percent(own[pid], elapsed),
                     "rss_mb": _mb(memory[pid].rss_kb), "pss_mb": _mb(memory[pid].pss_kb)})
    return rows


def run(quick: bool) -> list[dict]:
    return measure(QUICK_WINDOW_SECONDS if quick else WINDOW_SECONDS)


if __name__ == "__main__":
    common.script_main(__doc__, run, f"a {QUICK_WINDOW_SECONDS:g} s window instead of {WINDOW_SECONDS:g} s")
