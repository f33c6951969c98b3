"""Device health as the kubelet's own DRA manager gets it from the worker's health stream and writes it into a
pod's status.containerStatuses[].allocatedResourcesStatus."""

from __future__ import annotations

from tests.dra.dra_harness import claim, exactly, pod
from tests.support.waiting import wait_until

NPU_CLASS = "npu.rebellions.ai"
FAULT, READY = 4, 0


def test_the_pod_status_says_the_device_s_health_and_follows_a_fault_and_the_recovery(serve):
    serving = serve("2", {"rbln0", "rbln1"})
    kubelet, node, namespace = serving.kubelet, serving.node, serving.namespace
    kubelet.apply(claim("watched", namespace, [exactly("npu", NPU_CLASS)]))
    spec = pod("watched", namespace, {"npu": "watched"}, containers={"main": ["npu"], "sidecar": []})
    answer = kubelet.allocate(spec)
    [device] = [d["device"] for d in answer["results"]["watched"]]
    uid = kubelet.claim(namespace, "watched")["metadata"]["uid"]
    kubelet.prepare(spec)
    resource_id = f"k8s.npu.rebellions.ai/npu={uid}-{device}"

    def status() -> dict:
        return kubelet.pod_health(spec)

    def health() -> list[tuple[str, str, str, str | None]]:
        return [(entry["name"], r["resourceID"], r["health"], r.get("message"))
                for entry in status()["main"] for r in entry["resources"]]

    wait_until(lambda: health() == [("claim:npu", resource_id, "Healthy", None)], 30,
               "the pod status says the device is Healthy")
    assert status()["sidecar"] == []  # a container without the claim has no entry

    node.set_status(device, FAULT)
    wait_until(lambda: health() == [("claim:npu", resource_id, "Unhealthy", "FAULT")], 30,
               "the pod status follows the FAULT")
    node.set_status(device, READY)
    wait_until(lambda: health() == [("claim:npu", resource_id, "Healthy", None)], 30,
               "the pod status follows the recovery")
    assert kubelet.log_lines("Successfully started WatchResources health stream")
