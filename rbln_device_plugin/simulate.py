"""`rbln-device-plugin simulate`: the real stack on a simulated node, seen through a simulated kubelet."""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable

from rbln_device_plugin import simulate_dra, status
from scanner import feature_file
from shared.config import ResourceApi
from shared.metrics import PATH
from shared.resources import Resource
from simulator.kubelet import KubeletSimulator
from simulator.node import SimDevice, SimulatedNode, build_node
from simulator.spec import NodeSpec
from simulator.stack import StackProcess

DEFAULT_NODE = "2,1:vf1,1:vf4"
START_TIMEOUT = 60.0
# The watchdog refreshes the state metrics within 50 ms of a status file's change; registering takes longer.
METRICS_TIMEOUT = 10.0
_SHOWN_FAMILIES = ("rbln_device_plugin_registered", "rbln_device_plugin_devices{",
                   "rbln_device_plugin_allocations_total")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", default=DEFAULT_NODE, metavar="SPEC",
                        help="PFs of the node as COUNT[:MODE] groups, MODE none|vf1|vf4|vfN "
                             f"(default {DEFAULT_NODE!r}: 2 plain PFs, one in vf1 mode, one in vf4 mode)")
    parser.add_argument("--numa-nodes", type=int, default=2, help="NUMA nodes the PFs are spread over (default 2)")
    parser.add_argument("--switches", type=int, default=2, help="PCIe switches the PFs hang under (default 2)")
    parser.add_argument("--scan-interval", default="1s", help="DEVICE_SCAN_INTERVAL of the stack (default 1s)")
    parser.add_argument("--resource-api", choices=[api.value for api in ResourceApi],
                        default=ResourceApi.DEVICE_PLUGIN.value,
                        help="device-plugin (default): the workers and a simulated kubelet; dra: worker-dra with "
                             "stand-ins for the API server and the kubelet's DRA side")
    parser.add_argument("--watch", action="store_true",
                        help="keep running and print what the kubelet sees on every change, until Ctrl-C")
    parser.add_argument("--keep", action="store_true", help="keep the node's directory (and its logs) afterwards")


def expected_resources(node: SimulatedNode) -> dict[str, list[str]]:
    """What a correct plugin advertises for this node: resource -> device IDs."""
    expected: dict[str, list[str]] = {}
    for device in node.inventory:
        resource = _resource_of(device)
        if resource is not None:
            expected.setdefault(resource.value, []).append(device.device)
    return expected


def _resource_of(device: SimDevice) -> Resource | None:
    if not device.is_vf:
        return Resource.NPU if device.num_vfs == 0 else None
    return Resource.for_vf_count(device.num_vfs)


def _show_kubelet(kubelet: KubeletSimulator, node: SimulatedNode) -> None:
    by_id = {d.device: d for d in node.inventory}
    for name, view in sorted(kubelet.resources().items()):
        print(f"  {name}: {len(view.devices)} device(s), registered on {view.endpoint}")
        for device_id, device in sorted(view.devices.items()):
            sim = by_id.get(device_id)
            where = f"PCI {sim.bus_id}" + (f", VF of {sim.parent}" if sim and sim.parent else "") if sim else ""
            numa = ",".join(map(str, device.numa_nodes)) or "unknown"
            print(f"    {device_id:<10} {device.health:<9} NUMA {numa:<7} {where}")


def _sample_allocation(kubelet: KubeletSimulator, node: SimulatedNode, resource: str) -> None:
    available = sorted(kubelet.resources()[resource].devices)
    size = min(2, len(available))
    preferred = list(kubelet.preferred_allocation(resource, available, size=size).container_responses[0].deviceIDs)
    chosen = preferred or available[:size]
    response = kubelet.allocate(resource, [chosen]).container_responses[0]
    print(f"  {resource}: GetPreferredAllocation(size {size}) chose {', '.join(preferred) or '(nothing)'}")
    print(f"    Allocate({', '.join(chosen)}) gives the container:")
    for spec in response.devices:
        print(f"      {spec.container_path:<14} <- host {spec.host_path} ({spec.permissions})")
    for key, value in sorted(response.annotations.items()):
        print(f"      annotation {key}: {value}")


def _changed_since(seen: str) -> Callable[[KubeletSimulator], bool]:
    return lambda kubelet: kubelet.describe() != seen


def _metrics_page(port: int, expected: dict[str, list[str]]) -> str:
    """The stack's /metrics, once it shows every expected resource registered."""
    deadline = time.monotonic() + METRICS_TIMEOUT
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{PATH}", timeout=5) as answer:
            page = answer.read().decode()
        if all(f'rbln_device_plugin_registered{{resource="{name}"}} 1.0' in page for name in expected) \
                or time.monotonic() > deadline:
            return page
        time.sleep(0.5)


def _show_metrics(port: int, expected: dict[str, list[str]]) -> None:
    print(f"Prometheus metrics of the whole stack on http://127.0.0.1:{port}{PATH}, among them:")
    for line in _metrics_page(port, expected).splitlines():
        if line.startswith(_SHOWN_FAMILIES):
            print(f"  {line}")


def _show_node_labels(stack: StackProcess, path: pathlib.Path) -> None:
    """The node-label file the scanner keeps (NFD_FEATURE_FILE), once it has written it."""
    stack.wait_for_record("Node labels updated", timeout=START_TIMEOUT)
    expiry, labels = feature_file.parse(path.read_text())
    print(f"Node labels for Node Feature Discovery's local source, in {path} (expires {expiry:%Y-%m-%dT%H:%M:%SZ}):")
    for name, value in labels.items():
        print(f"  {name}={value}")


def _run(node: SimulatedNode, args: argparse.Namespace) -> int:
    expected = expected_resources(node)
    labels_file = node.root / "features.d" / "rbln-features"
    labels_file.parent.mkdir()
    print(f"Simulated node in {node.root}:")
    for device in node.inventory:
        if not device.is_vf:
            mode = "plain" if device.num_vfs == 0 else f"{device.num_vfs} VFs"
            print(f"  {device.device} PCI {device.bus_id} NUMA {device.numa_node} ({mode})")
    # Metrics on a free port, so that the demo never collides with a plugin running on this machine.
    with KubeletSimulator(node.plugin_dir) as kubelet, \
            StackProcess({**os.environ, **node.env(args.scan_interval), "METRICS_PORT": "0",
                          "NFD_FEATURE_FILE": str(labels_file)}) as stack:
        print(f"Stack started (supervisord pid {stack.pid}); waiting for {', '.join(sorted(expected))} ...")
        kubelet.wait_for(lambda k: all(r in k.resources() and k.resources()[r].connected and
                                       sorted(k.resources()[r].devices) == sorted(ids)
                                       for r, ids in expected.items()),
                         START_TIMEOUT, f"registration of {', '.join(sorted(expected))}")
        print("The kubelet sees:")
        _show_kubelet(kubelet, node)
        _show_node_labels(stack, labels_file)
        print("Sample allocations:")
        for resource in sorted(expected):
            _sample_allocation(kubelet, node, resource)
        groups = {gid: npus for gid, npus in node.rsd_groups().items() if gid != 0}
        print("RSD groups made by the stack (group -> npu indices): "
              + (", ".join(f"{gid} -> {npus}" for gid, npus in sorted(groups.items())) or "none"))
        report, _ = status.gather(node.run_dir, node.pod_resources_socket)
        print("rbln-device-plugin status (which pod holds which device comes from the kubelet's PodResources API):")
        print(textwrap.indent(status.render_text(report), "  "))
        _show_metrics(stack.wait_for_record("Metrics endpoint listening")[0]["port"], expected)
        if args.watch:
            print("Watching; change files under the node (e.g. echo 4 > "
                  f"{node.status_file(node.inventory[0].device)}) and press Ctrl-C to stop.")
            seen = kubelet.describe()
            while True:
                kubelet.wait_for(_changed_since(seen), 3600, "a change")
                seen = kubelet.describe()
                print(textwrap.indent(seen, "  "))
        code = stack.stop()
    print(f"Stack stopped (exit status {code}).")
    return 0 if code == 0 else 1


def simulate(args: argparse.Namespace) -> int:
    try:
        spec = NodeSpec.parse(args.node, numa_nodes=args.numa_nodes, switches=args.switches)
    except ValueError as exc:
        print(f"rbln-device-plugin simulate: {exc}", file=sys.stderr)
        return 2
    # Short path: unix socket names must stay under ~107 characters.
    root = pathlib.Path(tempfile.mkdtemp(prefix="rbln-sim-", dir="/tmp"))
    try:
        node = build_node(root, spec)
        if args.resource_api == ResourceApi.DRA.value:
            return simulate_dra.run(node, args)
        return _run(node, args)
    except KeyboardInterrupt:
        print("\nInterrupted; the stack was stopped.")
        return 130
    except TimeoutError as exc:
        print(f"rbln-device-plugin simulate: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"Node kept in {root} (logs in {root / 'log'}).")
        else:
            shutil.rmtree(root, ignore_errors=True)
