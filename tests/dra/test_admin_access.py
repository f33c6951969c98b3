"""Admin access (KEP-5018): a monitoring claim on a device a workload's claim holds, allocated by the scheduler's
allocator in a namespace labelled for it, prepared through the kubelet's own DRA manager next to the workload."""

from __future__ import annotations

import json

from tests.dra.dra_harness import claim, exactly, pod

NPU_CLASS = "npu.rebellions.ai"
ADMIN_LABEL = "resource.kubernetes.io/admin-access"


def test_an_admin_claim_next_to_a_workload_claim_gets_the_device_s_nodes_and_leaves_its_rsd_group(serve, cluster):
    serving = serve("2", {"rbln0", "rbln1"})
    kubelet, node, namespace = serving.kubelet, serving.node, serving.namespace
    cluster.admin.apply({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": namespace, "labels": {ADMIN_LABEL: "true"}}})
    kubelet.apply(claim("work", namespace, [exactly("npu", NPU_CLASS)]))
    work_pod = pod("work", namespace, {"npu": "work"})
    [device] = [d["device"] for d in kubelet.allocate(work_pod)["results"]["work"]]
    bus_id = kubelet.published_devices()[device]["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
    kubelet.apply(claim("monitor", namespace, [exactly(
        "npu", NPU_CLASS, admin_access=True,
        selectors=[f'device.attributes["resource.kubernetes.io"].pciBusID == "{bus_id}"'])]))
    monitor_pod = pod("monitor", namespace, {"npu": "monitor"})
    # The allocator gives the monitoring claim the device the workload's claim holds.
    assert [d["device"] for d in kubelet.allocate(monitor_pod)["results"]["monitor"]] == [device]
    assert kubelet.claim(namespace, "monitor")["status"]["allocation"]["devices"]["results"][0]["adminAccess"]

    work_uid = kubelet.claim(namespace, "work")["metadata"]["uid"]
    monitor_uid = kubelet.claim(namespace, "monitor")["metadata"]["uid"]
    kubelet.prepare(work_pod)
    groups = {gid: members for gid, members in node.rsd_groups().items() if gid != 0}
    assert len(groups) == 1
    monitor_cdi = kubelet.prepare(monitor_pod)["main"]
    assert f"k8s.npu.rebellions.ai/npu={monitor_uid}-{device}" in monitor_cdi
    assert {gid: members for gid, members in node.rsd_groups().items() if gid != 0} == groups
    spec = json.loads((node.cdi_root / f"k8s.npu.rebellions.ai-npu_{monitor_uid}.json").read_text())
    assert [(n["path"], n.get("hostPath", n["path"])) for d in spec["devices"]
            for n in d["containerEdits"]["deviceNodes"]] == [(f"/dev/{device}", f"/dev/{device}")]

    kubelet.unprepare(monitor_pod["metadata"]["uid"])
    assert {gid: members for gid, members in node.rsd_groups().items() if gid != 0} == groups
    assert (node.cdi_root / f"k8s.npu.rebellions.ai-npu_{work_uid}.json").exists()
