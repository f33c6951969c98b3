"""`rbln-device-plugin topology` against a simulated node, as an operator runs it."""

import json
import subprocess
import sys

from simulator.node import build_node
from simulator.spec import NodeSpec


def topology(node, *args):
    env = {"PATH": "/usr/bin:/bin", **node.env()}
    return subprocess.run([sys.executable, "-c", "from rbln_device_plugin.cli import main; main()", "topology", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_tree_shows_shared_bridges_and_every_annotation(short_tmp):
    node = build_node(short_tmp, NodeSpec.parse("2,1:vf4,1:vf2", numa_nodes=2))
    node.set_status("rbln1", 4)
    result = topology(node)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "pci0000:00"
    rbln1 = next(line for line in lines if "[rbln1 " in line)
    assert "rebellions.ai/npu" in rbln1 and "NUMA 0" in rbln1 and "Unhealthy (FAULT)" in rbln1
    vf = next(line for line in lines if "[rbln2-3 " in line)
    assert "rebellions.ai/npu-vf4" in vf and "VF of 0000:" in vf and "NUMA 1" in vf
    assert any("rbln3-0" in line and "2 VFs" in line for line in lines)


def test_json_forest_nests_devices_under_their_bridges(short_tmp):
    node = build_node(short_tmp, NodeSpec.parse("2"))
    result = topology(node, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    devices = []

    def walk(level, path):
        for segment, child in level.items():
            devices.extend((d["device"], path + [segment]) for d in child["devices"])
            walk(child["children"], path + [segment])

    walk(document["forest"], [])
    assert sorted(d for d, _ in devices) == ["rbln0", "rbln1"]
    assert all(path == node.device(d).pci_path for d, path in ((d, tuple(p)) for d, p in devices))
    assert document["unreadablePciPath"] == [] and document["excluded"] == []


def test_failed_discovery_is_a_clear_error(short_tmp):
    node = build_node(short_tmp, NodeSpec.parse("1"))
    node.set_smi_fault("garbage")
    result = topology(node)
    assert result.returncode == 1 and "device discovery failed" in result.stderr
