"""What the kubelet's device manager counts: every resource registered with all its devices, and a
device's health reaching allocatable by the next scan, or refusing its Allocate before that."""

from __future__ import annotations

from tests.conformance.kubelet_harness import NPU, VF1, VF4, pod

FAULT, READY = 4, 0


def test_a_mixed_node_registers_every_resource_with_its_device_count(serve):
    counts = {NPU: 2, VF1: 1, VF4: 4}
    serving = serve("2,1:vf1,1:vf4", counts, numa_nodes=2)
    now = serving.kubelet.capacity()
    assert now["capacity"] == now["allocatable"] == counts and now["inactive"] == []
    # Every advertised device reached the kubelet under its own ID, with its NUMA node as TopologyInfo.
    numa = {d.device: [d.numa_node] for d in serving.node.inventory}
    assert now["allocatableDevices"] == {
        NPU: {i: numa[i] for i in ("rbln0", "rbln1")},
        VF1: {"rbln2-0": numa["rbln2-0"]},
        VF4: {f"rbln3-{j}": numa[f"rbln3-{j}"] for j in range(4)},
    }
    assert {n for ids in now["allocatableDevices"].values() for n, in ids.values()} == {0, 1}


def test_a_faulted_device_leaves_allocatable_within_a_scan_and_returns_on_ready(serve):
    scan_seconds = 0.5
    serving = serve("3", {NPU: 3}, scan_interval=f"{scan_seconds * 1000:.0f}ms")
    node, kubelet = serving.node, serving.kubelet
    bound = scan_seconds + 1.0

    node.set_status("rbln1", FAULT)
    faulted = kubelet.wait({NPU: {"capacity": 3, "allocatable": 2}}, timeout=bound)
    assert set(faulted["allocatableDevices"][NPU]) == {"rbln0", "rbln2"}

    node.set_status("rbln1", READY)
    recovered = kubelet.wait_for_counts({NPU: 3}, timeout=bound)
    assert set(recovered["allocatableDevices"][NPU]) == {"rbln0", "rbln1", "rbln2"}


def test_a_fault_after_the_last_scan_fails_the_admission_and_the_next_scan_steers_pods_away(serve):
    scan_seconds = 5
    serving = serve("2", {NPU: 2}, scan_interval=f"{scan_seconds}s")
    node, kubelet, stack = serving.node, serving.kubelet, serving.stack
    # Right after a scan: the next one is a whole interval away.
    scans = len(stack.find("Reconciled device inventory")) + 1
    stack.wait_for_record("Reconciled device inventory", count=scans, timeout=scan_seconds + 2)

    node.set_status("rbln1", FAULT)
    refused = kubelet.admit(pod("both", {"main": {NPU: 2}}))
    assert len(stack.find("Reconciled device inventory")) == scans, "a scan ran before the Allocate: lengthen it"
    # The kubelet still counted rbln1 healthy and asked for it: the plugin's own status check refused.
    assert not refused["admitted"]
    assert "rbln1 is Unhealthy (FAULT)" in refused["message"], refused["message"]
    failed = stack.wait_for_record("Container allocation failed", resourceName=NPU)
    assert failed[0]["deviceIDs"] == ["rbln1"]

    kubelet.wait({NPU: {"capacity": 2, "allocatable": 1}}, timeout=scan_seconds + 2)
    admitted = kubelet.admit(pod("after-the-scan", {"main": {NPU: 1}}))
    assert admitted["admitted"], admitted["message"]
    assert admitted["devices"]["main"] == {NPU: ["rbln0"]}
