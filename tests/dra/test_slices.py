"""The ResourceSlices the worker publishes, read back from the real API server: the node's inventory as
rbln-smi and sysfs give it, in the names and attributes docs/dra.md documents, following health."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.conformance.kubelet_harness import HarnessError
from tests.dra.dra_harness import DRIVER, RESOURCE_V1, DraKubelet, claim, exactly, pod
from tests.support.waiting import wait_until

MIXED = "2,1:vf1,1:vf4"
MIXED_DEVICES = {"rbln0", "rbln1", "rbln2-0", "rbln3-0", "rbln3-1", "rbln3-2", "rbln3-3"}
FAULT = 4


def _string(value: str) -> dict[str, str]:
    return {"string": value}


def _int(value: int) -> dict[str, int]:
    return {"int": value}


def expected_devices(node) -> dict[str, dict[str, Any]]:
    """Device name -> its attributes and memory capacity, from rbln-smi's own listing and the sysfs tree."""
    listing = json.loads(subprocess.run([str(node.rbln_smi), "-j"], capture_output=True, text=True, check=True).stdout)
    smi = {entry["device"]: entry for entry in listing["devices"]}
    expected = {}
    for device in node.inventory:
        if not device.is_vf and device.num_vfs:
            continue  # a PF hosting VFs is served through its VFs only
        entry = smi[device.device]
        attributes = {"type": _string("vf" if device.is_vf else "npu"), "productName": _string(entry["name"]),
                      "sid": _string(entry["sid"]), "uuid": _string(entry["uuid"]),
                      "pciDeviceID": _string(entry["pci"]["dev"]), "firmwareVersion": _string(entry["fw_ver"]),
                      "driverVersion": _string(listing["KMD_version"]),
                      "resource.kubernetes.io/pciBusID": _string(device.bus_id),
                      "resource.kubernetes.io/pcieRoot": _string(device.pci_path[0])}
        if device.numa_node is not None:
            attributes["resource.kubernetes.io/numaNode"] = attributes["dra.net/numaNode"] = _int(device.numa_node)
        if device.is_vf:
            attributes["vfCount"] = _int(device.num_vfs)
            attributes["parentPciBusID"] = _string(node.device(device.parent).bus_id)
        expected[device.device] = {"attributes": attributes, "memory": int(entry["memory"]["total"])}
    return expected


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity of bytes as the API server writes it back (plain or binary-suffixed)."""
    for suffix, factor in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40)):
        if text.endswith(suffix):
            return int(text[:-2]) * factor
    return int(text)


def test_the_slices_list_every_pf_and_vf_of_the_inventory_with_the_contract_attributes(serve, cluster):
    serving = serve(MIXED, MIXED_DEVICES, numa_nodes=2)
    kubelet, name = serving.kubelet, serving.dra_node.name
    node_object = cluster.admin.list("Node", api_version="v1", field_selector=f"metadata.name={name}")[0]
    node_uid = node_object["metadata"]["uid"]
    slices = kubelet.slices()
    assert slices
    for item in slices:
        spec = item["spec"]
        assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, name, name)
        assert spec["pool"]["resourceSliceCount"] == len(slices)
        assert len(spec["devices"]) <= 128
        assert [(o["kind"], o["name"], o["uid"]) for o in item["metadata"]["ownerReferences"]] == [
            ("Node", name, node_uid)]
    published = kubelet.published_devices()
    expected = expected_devices(serving.node)
    # The PF hosting VFs (rbln2, rbln3) is absent; every other device, PF or VF, is there with its attributes.
    assert set(published) == set(expected) == MIXED_DEVICES
    for device, want in expected.items():
        assert published[device]["attributes"] == want["attributes"], device
        assert quantity_bytes(published[device]["capacity"]["memory"]["value"]) == want["memory"], device


UNHEALTHY = "npu.rebellions.ai/unhealthy"
TOLERATE_UNHEALTHY = {"key": UNHEALTHY, "operator": "Exists", "effect": "NoSchedule"}


def taints(kubelet: DraKubelet) -> dict[str, list[dict[str, Any]]]:
    return {name: device["taints"] for name, device in kubelet.published_devices().items() if device.get("taints")}


def test_an_unhealthy_device_is_tainted_not_allocated_unless_tolerated_and_the_taint_goes_when_it_recovers(serve):
    serving = serve("2", {"rbln0", "rbln1"})
    kubelet, node, namespace = serving.kubelet, serving.node, serving.namespace
    generation = kubelet.slices()[0]["spec"]["pool"]["generation"]

    node.set_status("rbln1", FAULT)
    wait_until(lambda: "rbln1" in taints(kubelet), 30, "rbln1 tainted")
    [taint] = taints(kubelet)["rbln1"]
    assert (taint["key"], taint["value"], taint["effect"]) == (UNHEALTHY, "FAULT", "NoSchedule")
    assert taint["timeAdded"]  # stamped by the API server, which keeps the field: taints are on
    assert set(kubelet.published_devices()) == {"rbln0", "rbln1"}
    # A change of one slice keeps the pool generation (KEP-5055).
    assert kubelet.slices()[0]["spec"]["pool"]["generation"] == generation
    # The scheduler's allocator does not hand out the tainted NPU: a two-NPU claim does not fit, a one-NPU claim
    # gets rbln0, and only a claim tolerating the taint gets rbln1.
    kubelet.apply(claim("two", namespace, [exactly("npus", "npu.rebellions.ai", count=2)]),
                  claim("one", namespace, [exactly("npus", "npu.rebellions.ai")]),
                  claim("intolerant", namespace, [exactly("npus", "npu.rebellions.ai")]),
                  claim("diagnostics", namespace, [exactly("npus", "npu.rebellions.ai",
                                                           tolerations=[TOLERATE_UNHEALTHY])]))
    assert not kubelet.allocate(pod("wants-two", namespace, {"npus": "two"}))["allocated"]
    one = kubelet.allocate(pod("wants-one", namespace, {"npus": "one"}))
    assert [d["device"] for d in one["results"]["one"]] == ["rbln0"]
    assert not kubelet.allocate(pod("intolerant", namespace, {"npus": "intolerant"}))["allocated"]
    diagnostics = kubelet.allocate(pod("diagnostics", namespace, {"npus": "diagnostics"}))
    assert [d["device"] for d in diagnostics["results"]["diagnostics"]] == ["rbln1"]

    node.set_status("rbln1", 0)
    wait_until(lambda: taints(kubelet) == {}, 30, "the taint gone with the recovery")
    assert kubelet.slices()[0]["spec"]["pool"]["generation"] == generation


def test_with_the_effect_none_a_tainted_device_is_still_allocated(serve):
    serving = serve("2", {"rbln0", "rbln1"}, DRA_UNHEALTHY_TAINT_EFFECT="None")
    kubelet, node, namespace = serving.kubelet, serving.node, serving.namespace
    node.set_status("rbln1", FAULT)
    wait_until(lambda: [t["effect"] for t in taints(kubelet).get("rbln1", ())] == ["None"], 30,
               "rbln1 tainted with the effect None")
    kubelet.apply(claim("two", namespace, [exactly("npus", "npu.rebellions.ai", count=2)]))
    assert kubelet.allocate(pod("wants-two", namespace, {"npus": "two"}))["allocated"]


def test_the_worker_reaches_the_api_as_the_charts_service_account_with_only_its_clusterrole(cluster, node_root):
    # RBAC is on: what the worker does above, it does with the rights the chart's ClusterRole grants, no more.
    worker = DraKubelet(cluster.admin.binary, node_root / "worker-client.log", cluster.server.worker_kubeconfig,
                        "none", node_root / "unused", node_root / "unused").start_client()
    try:
        assert isinstance(worker.list("ResourceSlice"), list)
        for kind, api_version in (("ResourceClaim", RESOURCE_V1), ("Pod", "v1"), ("Secret", "v1")):
            with pytest.raises(HarnessError, match=f'forbidden: User "{cluster.server.info["workerUser"]}"'):
                worker.list(kind, api_version=api_version)
    finally:
        worker.close()
