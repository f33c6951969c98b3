"""Preferred-allocation search time on two nodes, every size, with 0-3 mandatory devices.

    python bench/placement_bench.py [--quick]

In-process calls of resource_worker.placement.preferred_allocation, no stack. Both nodes
have two NUMA nodes, one PCI root per NUMA node and two PCIe switches per root (root port,
switch upstream port, downstream ports):

- `placement/vf64`: 16 PFs in vf4 mode, 4 per switch; the 64 VFs sit next to their PF
  below its downstream port and group by parent PF (one card per PF).
- `placement/pf32`: 32 single-device cards, 8 per switch.

Every call offers the whole node; for each size 1..N it runs once without mandatory
devices and three times with 1, 2 and 3 mandatory devices drawn by a seeded RNG (quick:
every third size, once each). `p50/p99/max ms` are wall-clock per call; `cpu_*` the
thread's CPU time for the same calls, which other load on the machine does not inflate.

The search keeps the tables it builds from a pool of offered devices for the next
requests on that pool. `placement/vf64-changing` offers the vf64 node less one device
drawn per call, so most calls build their tables anew, as after each allocation.
"""

from __future__ import annotations

import pathlib
import random
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from resource_worker.placement import Candidate, preferred_allocation  # noqa: E402

P99_GOAL_MS = 5.0
MAX_GOAL_MS = 25.0
MANDATORY_DRAWS = 3


def _port_path(switch: int, port: int) -> tuple[str, ...]:
    """Segments down to a downstream port; switches 0-1 hang off NUMA 0's root, 2-3 off NUMA 1's."""
    root_bus = 0x00 if switch < 2 else 0x80
    upstream_bus = root_bus + 1 + switch % 2 * 0x20
    return (f"pci0000:{root_bus:02x}", f"0000:{root_bus:02x}:{1 + switch % 2:02x}.0",
            f"0000:{upstream_bus:02x}:00.0", f"0000:{upstream_bus + 1:02x}:{port:02x}.0")


def _device_bus(port_path: tuple[str, ...], port: int) -> int:
    return int(port_path[-1][5:7], 16) + 1 + port


def vf_node() -> dict[str, Candidate]:
    node = {}
    for pf in range(16):
        switch, port = divmod(pf, 4)
        port_path = _port_path(switch, port)
        bus = _device_bus(port_path, port)
        for vf in range(4):
            device_id = f"rbln{pf}-{vf}"
            node[device_id] = Candidate(device_id, switch // 2, f"pf:0000:{bus:02x}:00.0",
                                        port_path + (f"0000:{bus:02x}:00.{vf + 1}",))
    return node


def pf_node() -> dict[str, Candidate]:
    node = {}
    for pf in range(32):
        switch, port = divmod(pf, 8)
        port_path = _port_path(switch, port)
        bus = _device_bus(port_path, port)
        device_id = f"rbln{pf}"
        node[device_id] = Candidate(device_id, switch // 2, f"sid:SN{pf:04d}", port_path + (f"0000:{bus:02x}:00.0",))
    return node


def _time_node(name: str, node: dict[str, Candidate], quick: bool, changing: bool = False) -> dict:
    rng = random.Random(name)
    ids = sorted(node)
    wall, cpu = [], []
    for size in range(1, len(ids) + (0 if changing else 1), 3 if quick else 1):
        for mandatory_count in range(min(3, size) + 1):
            for _ in range(1 if quick or mandatory_count == 0 else MANDATORY_DRAWS):
                mandatory = rng.sample(ids, mandatory_count)
                available = ids
                if changing:
                    gone = rng.choice([i for i in ids if i not in mandatory])
                    available = [i for i in ids if i != gone]
                started, started_cpu = time.perf_counter(), time.thread_time()
                preferred_allocation(node, available, mandatory, size)
                wall.append((time.perf_counter() - started) * 1000)
                cpu.append((time.thread_time() - started_cpu) * 1000)
    row = {"benchmark": f"placement/{name}", **common.spread(wall), **common.spread(cpu, "cpu_"),
           "calls": len(wall), "goal": f"p99 <= {P99_GOAL_MS:g} ms, max <= {MAX_GOAL_MS:g} ms"}
    row["met"] = row["p99_ms"] <= P99_GOAL_MS and row["max_ms"] <= MAX_GOAL_MS
    return row


def run(quick: bool) -> list[dict]:
    return [_time_node("vf64", vf_node(), quick), _time_node("pf32", pf_node(), quick),
            _time_node("vf64-changing", vf_node(), quick, changing=True)]


if __name__ == "__main__":
    common.script_main(__doc__, run, "every third size, one mandatory draw per count")
