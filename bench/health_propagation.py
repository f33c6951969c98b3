"""Health propagation: from writing a device's status file to the kubelet simulator seeing its new health.

    python bench/health_propagation.py [--quick]

The status of one device of a 2-device node is flipped between FAULT and READY,
each flip after a random pause so that flips land at every point of the scan cycle,
and timed until the device's new health arrives through ListAndWatch. Full mode
uses the default 5 s scan interval, quick mode 500 ms. Goal: p99 <= interval + 200 ms.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import common
from shared.durations import parse_duration
from shared.resources import Resource
from simulator.kubelet import KubeletSimulator
from simulator.node import SimulatedNode
from simulator.spec import NodeSpec

NPU = Resource.NPU.value
DEVICE = "rbln0"
FULL = ("5s", 40)
QUICK = ("500ms", 20)
GOAL_MARGIN_MS = 200.0
FLIPS = ((4, "Unhealthy"), (0, "Healthy"))


def _flip(node: SimulatedNode, kubelet: KubeletSimulator, status: int, health: str, interval: float) -> float:
    """Write `status`, wait for the kubelet to see `health`; milliseconds in between."""
    started = time.monotonic()
    node.set_status(DEVICE, status)
    kubelet.wait_for(lambda k: k.resources()[NPU].devices[DEVICE].health == health,
                     3 * interval + 10, f"{DEVICE} {health}")
    return (time.monotonic() - started) * 1000


def measure(scan_interval: str, flips: int) -> dict:
    interval = parse_duration(scan_interval)
    rng = random.Random(0)
    with common.temporary_node(NodeSpec.parse("2")) as node, \
            common.running_stack(node, scan_interval) as (kubelet, _stack):
        samples = []
        for index in range(flips):
            # A pause of random length puts the write at a random point of the scan cycle.
            time.sleep(rng.uniform(0, interval))
            samples.append(_flip(node, kubelet, *FLIPS[index % 2], interval))
    goal_ms = interval * 1000 + GOAL_MARGIN_MS
    spread = common.spread(samples)
    return {"benchmark": f"health propagation ({scan_interval} scan)", **spread, "flips": flips,
            "goal": f"<= {goal_ms:g} ms", "met": spread["p99_ms"] <= goal_ms}


def run(quick: bool) -> list[dict]:
    return [measure(*(QUICK if quick else FULL))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK[1]} flips at a {QUICK[0]} scan interval instead of {FULL[1]} at {FULL[0]}")
    for row in run(parser.parse_args().quick):
        print(row)


if __name__ == "__main__":
    main()
