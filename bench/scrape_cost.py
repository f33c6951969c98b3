"""What a Prometheus scrape of /metrics costs the stack on the 64-device node.

    python bench/scrape_cost.py [--quick]

The stack runs with metrics on (a free port) and the kubelet simulator connected; a few
Allocates and GetPreferredAllocations first give the npu-vf4 worker's histograms their
series, so that a scrape reads every process's files as on a node in use. Then 300 scrapes
(50 quick) are made one after the other, each asking as Prometheus does (OpenMetrics, gzip).

- p50/p99/max ms: one scrape's round trip, request to the last byte of the answer.
- serving_cpu_ms_per_scrape: CPU (utime+stime) of the serving process (the watchdog) over
  the scrapes, per scrape, less its idle background measured over a window of the same length
  just before: what a scrape costs, whatever else the machine is doing. Goal: <= 10 ms.
- serving_cpu_idle_ms_per_s: that background (its checks every 2 s), for the record.
- series, body_bytes, gzip_bytes: the size of one answer.
"""

from __future__ import annotations

import gzip
import pathlib
import sys
import time
import urllib.request

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import common
from shared.observability.metrics import PATH

SCRAPES = 300
QUICK_SCRAPES = 50
WARM_UP = 5
WORK_CALLS = 20
GOAL_MS = 10.0
# What Prometheus 2.x sends.
HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                     "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
           "Accept-Encoding": "gzip"}


def _scrape(url: str) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=HEADERS), timeout=10) as answer:
        return answer.read()


def _watchdog_pid(stack) -> int:
    return next(pid for pid in common.stack_processes(stack.pid) if common.process_name(pid) == "watchdog")


def _cpu_ms(pid: int) -> float:
    return common.cpu_times(pid).own * 1000 / common.CLOCK_TICKS


def measure(scrapes: int) -> list[dict]:
    with common.temporary_node(common.vf64_spec()) as node, \
            common.running_stack(node, "5s", METRICS_PORT="0") as (kubelet, stack):
        port = stack.wait_for_record("Metrics endpoint listening")[0]["port"]
        url = f"http://127.0.0.1:{port}{PATH}"
        devices = sorted(kubelet.resources()[common.VF64_RESOURCE].devices)
        for index in range(WORK_CALLS):
            kubelet.preferred_allocation(common.VF64_RESOURCE, devices, size=4)
            kubelet.allocate(common.VF64_RESOURCE, [devices[index % 16 * 4:index % 16 * 4 + 4]])
        # Every device's status series is there once the watchdog's check has seen the worker's file.
        deadline = time.monotonic() + 30
        while gzip.decompress(_scrape(url)).count(b"rbln_device_plugin_device_status{") < len(devices):
            if time.monotonic() > deadline:
                raise TimeoutError("the device status series did not appear")
            time.sleep(0.5)
        for _ in range(WARM_UP):
            _scrape(url)
        watchdog = _watchdog_pid(stack)

        windows = []
        cpu_before, started = _cpu_ms(watchdog), time.monotonic()
        for _ in range(scrapes):
            begun = time.perf_counter()
            body = _scrape(url)
            windows.append((time.perf_counter() - begun) * 1000)
        elapsed = time.monotonic() - started
        busy_cpu_ms = _cpu_ms(watchdog) - cpu_before
        # The background over a window as long, with no scrape.
        idle_before = _cpu_ms(watchdog)
        time.sleep(max(elapsed, 2.0))
        idle_per_s = (_cpu_ms(watchdog) - idle_before) / max(elapsed, 2.0)

    text = gzip.decompress(body)
    per_scrape = (busy_cpu_ms - idle_per_s * elapsed) / scrapes
    return [{"benchmark": "scrape/vf64", "scrapes": scrapes, **common.spread(windows),
             "serving_cpu_ms_per_scrape": round(per_scrape, 2),
             "serving_cpu_idle_ms_per_s": round(idle_per_s, 2),
             "series": sum(1 for line in text.splitlines() if line and not line.startswith(b"#")),
             "body_bytes": len(text), "gzip_bytes": len(body),
             "goal": f"<= {GOAL_MS:g} ms CPU of the serving process per scrape; p99 <= {GOAL_MS:g} ms",
             "met": per_scrape <= GOAL_MS and common.percentile(windows, 0.99) <= GOAL_MS}]


def run(quick: bool) -> list[dict]:
    return measure(QUICK_SCRAPES if quick else SCRAPES)


if __name__ == "__main__":
    common.script_main(__doc__, run, f"{QUICK_SCRAPES} scrapes instead of {SCRAPES}")
