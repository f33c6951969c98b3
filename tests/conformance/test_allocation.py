"""Pod admission through the kubelet's topology manager and device manager: NUMA hints, the plugin's
preferred allocation, Allocate, and what the container runtime is handed."""

from __future__ import annotations

import pytest

from tests.conformance.kubelet_harness import NPU, VF4, pod

CDI_ANNOTATION = {"cdi.k8s.io/rebellions.ai_npu": "rebellions.ai/npu=runtime"}
# Two NUMA nodes with three PFs each; four switches put two PFs of each NUMA node under one switch.
PF_NODE = {"spec": "6", "switches": 4, "devices": 6}
# Two vf4 cards, one per NUMA node: four VFs on each.
VF_NODE = {"spec": "2:vf4", "switches": 2, "devices": 8}


def rsd_group(node, ids: list[str]) -> int:
    """The RSD group holding exactly `ids`."""
    npus = sorted(node.device(i).npu for i in ids)
    (gid,) = [g for g, members in node.rsd_groups().items() if g != 0 and sorted(members) == npus]
    return gid


def assert_run_options(serving, pod_uid: str, ids: list[str], container: str = "main") -> None:
    """The runtime gets the container's RSD group as /dev/rsd0 and each device's own node, nothing else."""
    options = serving.kubelet.run_options(pod_uid, container)
    group = f"/dev/rsd{rsd_group(serving.node, ids)}"
    expected = [{"hostPath": group, "containerPath": "/dev/rsd0", "permissions": "rw"}]
    expected += [{"hostPath": f"/dev/{i}", "containerPath": f"/dev/{i}", "permissions": "rw"} for i in ids]
    assert sorted(options["devices"], key=lambda d: d["containerPath"]) == sorted(
        expected, key=lambda d: d["containerPath"])
    assert options["annotations"] == CDI_ANNOTATION
    assert options["cdiDevices"] == [] and options["envs"] == {} and options["mounts"] == []


def admit_on_one_numa_node(serving, resource: str, uid: str, count: int = 2) -> list[str]:
    """Admit a pod for `count` devices: the device manager's hints prefer single NUMA nodes, the
    topology manager picks one, and the manager allocates what the plugin preferred from it."""
    node, kubelet, stack = serving.node, serving.kubelet, serving.stack
    spec = pod(uid, {"main": {resource: count}})
    hints = kubelet.hints(spec)["main"][resource]
    assert [h for h in hints if h["preferred"]] and all(len(h["numaNodes"]) == 1 for h in hints if h["preferred"])
    preferences = len(stack.find("Preferred allocation", resourceName=resource))

    admitted = kubelet.admit(spec)
    assert admitted["admitted"], admitted["message"]
    affinity = admitted["affinity"]["main"]
    assert affinity["preferred"] and len(affinity["numaNodes"]) == 1
    ids = admitted["devices"]["main"][resource]
    assert len(ids) == count and {node.device(i).numa_node for i in ids} == set(affinity["numaNodes"])
    # The NUMA node has more free devices than the pod needs: the manager asked the plugin, and took its answer.
    (answer,) = stack.wait_for_record("Preferred allocation", count=preferences + 1, resourceName=resource)[
        preferences:]
    assert sorted(answer["deviceIDs"]) == ids and answer["size"] == count
    assert kubelet.devices(uid, "main") == {resource: ids}
    assert_run_options(serving, uid, ids)
    return ids


def card(node, device_id: str) -> tuple[str, ...]:
    """Where a device sits for placement: a VF on its PF, a PF under its PCIe switch."""
    device = node.device(device_id)
    return (device.parent,) if device.is_vf else device.pci_path[:3]


@pytest.mark.parametrize("layout,resource", [(PF_NODE, NPU), (VF_NODE, VF4)], ids=["pf", "vf"])
def test_two_devices_come_from_one_numa_node_as_the_plugin_places_them(serve, layout, resource):
    serving = serve(layout["spec"], {resource: layout["devices"]}, numa_nodes=2, switches=layout["switches"])

    ids = admit_on_one_numa_node(serving, resource, "pod-a")
    # The plugin's choice shows: of the NUMA node's devices it took two on one card or switch.
    assert len({card(serving.node, i) for i in ids}) == 1


def test_a_second_pod_gets_other_devices(serve):
    serving = serve(PF_NODE["spec"], {NPU: PF_NODE["devices"]}, numa_nodes=2, switches=PF_NODE["switches"])

    first = admit_on_one_numa_node(serving, NPU, "pod-a")
    second = admit_on_one_numa_node(serving, NPU, "pod-b")
    assert not set(first) & set(second)
    # Both containers keep their own group: the second allocation did not undo the first.
    assert rsd_group(serving.node, first) != rsd_group(serving.node, second)
    assert_run_options(serving, "pod-a", first)
    assert serving.node.lock_violations() == []


def test_an_app_container_keeps_its_init_containers_devices_through_must_include(serve):
    """The kubelet hands an init container's devices on to the app container: they come to
    GetPreferredAllocation as mustInclude, and the plugin's answer keeps them."""
    serving = serve("8", {NPU: 8}, numa_nodes=2, switches=4)
    node, stack = serving.node, serving.stack

    admitted = serving.kubelet.admit(pod("with-init", {"main": {NPU: 3}}, init_containers={"init": {NPU: 2}}))
    assert admitted["admitted"], admitted["message"]
    init, main = admitted["devices"]["init"][NPU], admitted["devices"]["main"][NPU]
    assert set(init) < set(main) and len(main) == 3 and len({node.device(i).numa_node for i in main}) == 1
    answers = stack.wait_for_record("Preferred allocation", count=2, resourceName=NPU)
    assert [(sorted(a["deviceIDs"]), a["size"]) for a in answers] == [(init, 2), (main, 3)]
    assert_run_options(serving, "with-init", main)
