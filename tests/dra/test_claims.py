"""Claims allocated by the scheduler's own allocator against the slices the worker published and the
DeviceClasses the chart renders, then prepared through the kubelet's own DRA manager."""

from __future__ import annotations

import pytest

from tests.dra.dra_harness import claim, exactly, pod

NPU_CLASS, VF1_CLASS, VF4_CLASS = "npu.rebellions.ai", "npu-vf1.rebellions.ai", "npu-vf4.rebellions.ai"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"


def same(attribute: str, requests: list[str]) -> dict:
    return {"requests": requests, "matchAttribute": attribute}


def claim_cdi_ids(claim_uid: str, devices: list[str]) -> list[str]:
    return sorted(f"k8s.npu.rebellions.ai/npu={claim_uid}-{device}" for device in devices)


def allocated(answer: dict, name: str) -> list[str]:
    assert answer["allocated"], f"{name} not allocated"
    return sorted(d["device"] for d in answer["results"][name])


def test_the_chart_renders_the_three_device_classes(cluster):
    assert set(cluster.device_classes) == {NPU_CLASS, VF1_CLASS, VF4_CLASS}


def test_one_and_two_npu_claims_on_one_pcie_root_are_allocated_and_prepared(serve):
    serving = serve("3", {"rbln0", "rbln1", "rbln2"})
    kubelet, namespace = serving.kubelet, serving.namespace
    kubelet.apply(claim("one", namespace, [exactly("npu", NPU_CLASS)]),
                  claim("two", namespace, [exactly("npus", NPU_CLASS, count=2)], [same(PCIE_ROOT, ["npus"])]))
    one_pod, two_pod = pod("one", namespace, {"npu": "one"}), pod("two", namespace, {"npus": "two"})
    one = allocated(kubelet.allocate(one_pod), "one")
    two = allocated(kubelet.allocate(two_pod), "two")
    assert len(one) == 1 and len(two) == 2 and not set(one) & set(two)
    published = kubelet.published_devices()
    assert len({published[d]["attributes"][PCIE_ROOT]["string"] for d in two}) == 1

    for name, devices, spec in (("one", one, one_pod), ("two", two, two_pod)):
        uid = kubelet.claim(namespace, name)["metadata"]["uid"]
        cdi = kubelet.prepare(spec)["main"]
        assert sorted(i for i in cdi if i.startswith("k8s.")) == claim_cdi_ids(uid, devices)


@pytest.mark.parametrize("spec, fits", [("2", False), ("4", True)])
def test_match_attribute_is_a_real_constraint_two_npus_on_one_numa_node(serve, spec, fits):
    # Spread over two NUMA nodes: with two NPUs no two share one; with four, two do.
    count = int(spec)
    serving = serve(spec, {f"rbln{i}" for i in range(count)}, numa_nodes=2)
    kubelet, namespace = serving.kubelet, serving.namespace
    kubelet.apply(claim("pair", namespace, [exactly("npus", NPU_CLASS, count=2)], [same(NUMA_NODE, ["npus"])]))
    answer = kubelet.allocate(pod("pair", namespace, {"npus": "pair"}))
    assert answer["allocated"] is fits
    if fits:
        published = kubelet.published_devices()
        assert len({published[d]["attributes"][NUMA_NODE]["int"] for d in allocated(answer, "pair")}) == 1


def test_vf_claims_get_vfs_of_their_class(serve):
    serving = serve("1:vf1,1:vf4", {"rbln0-0", "rbln1-0", "rbln1-1", "rbln1-2", "rbln1-3"})
    kubelet, namespace = serving.kubelet, serving.namespace
    kubelet.apply(claim("vf4", namespace, [exactly("vf", VF4_CLASS, count=2)]),
                  claim("vf1", namespace, [exactly("vf", VF1_CLASS)]))
    vf4_pod, vf1_pod = pod("vf4", namespace, {"vf": "vf4"}), pod("vf1", namespace, {"vf": "vf1"})
    vf4 = allocated(kubelet.allocate(vf4_pod), "vf4")
    assert allocated(kubelet.allocate(vf1_pod), "vf1") == ["rbln0-0"]
    assert len(vf4) == 2 and all(d.startswith("rbln1-") for d in vf4)
    uid = kubelet.claim(namespace, "vf4")["metadata"]["uid"]
    cdi = kubelet.prepare(vf4_pod)["main"]
    assert sorted(i for i in cdi if i.startswith("k8s.")) == claim_cdi_ids(uid, vf4)


def test_a_pod_asking_for_the_extended_resource_is_served_through_the_npu_device_class(serve):
    # KEP-5004: rebellions.ai/npu: 2 in a container's requests, no claim in the pod spec.
    serving = serve("3", {"rbln0", "rbln1", "rbln2"})
    kubelet, namespace = serving.kubelet, serving.namespace
    spec = pod("legacy", namespace, requests={"main": {"rebellions.ai/npu": 2}, "sidecar": {}})
    answer = kubelet.allocate_extended(spec)
    assert answer["allocated"]
    devices = allocated(answer, answer["claim"])
    assert len(devices) == 2
    assert answer["requestMappings"] == [{"containerName": "main", "resourceName": "rebellions.ai/npu",
                                          "requestName": "container-0-request-0"}]
    uid = kubelet.claim(namespace, answer["claim"])["metadata"]["uid"]
    cdi = kubelet.prepare(spec)
    # The kubelet hands the claim's CDI devices to the container that asked, none to the other.
    assert sorted(i for i in cdi["main"] if i.startswith("k8s.")) == claim_cdi_ids(uid, devices)
    assert cdi["sidecar"] == []


def test_a_claim_shared_by_two_containers_gives_both_the_same_devices(serve):
    serving = serve("2", {"rbln0", "rbln1"})
    kubelet, namespace = serving.kubelet, serving.namespace
    kubelet.apply(claim("shared", namespace, [exactly("npu", NPU_CLASS)]))
    spec = pod("two-containers", namespace, {"npu": "shared"}, containers={"a": ["npu"], "b": ["npu"], "c": []})
    devices = allocated(kubelet.allocate(spec), "shared")
    uid = kubelet.claim(namespace, "shared")["metadata"]["uid"]
    cdi = kubelet.prepare(spec)
    assert sorted(i for i in cdi["a"] if i.startswith("k8s.")) == claim_cdi_ids(uid, devices)
    assert cdi["a"] == cdi["b"] and cdi["c"] == []
    assert len([gid for gid in serving.node.rsd_groups() if gid != 0]) == 1
