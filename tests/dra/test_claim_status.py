"""A prepared claim's status.devices (KEP-4817), written by the worker with the chart's RBAC (a token bound to a
pod of the node, as the kubelet gives one) and read back from the real API server."""

from __future__ import annotations

from tests.dra.dra_harness import claim, exactly, pod

NPU_CLASS = "npu.rebellions.ai"


def test_a_prepared_claim_s_status_names_each_device_s_bus_id_rsd_group_and_health(serve):
    serving = serve("3", {"rbln0", "rbln1", "rbln2"})
    kubelet, node, namespace = serving.kubelet, serving.node, serving.namespace
    kubelet.apply(claim("watched", namespace, [exactly("npus", NPU_CLASS, count=2)]))
    spec = pod("watched", namespace, {"npus": "watched"})
    devices = sorted(d["device"] for d in kubelet.allocate(spec)["results"]["watched"])
    assert kubelet.claim(namespace, "watched")["status"].get("devices") is None
    kubelet.prepare(spec)

    [group] = [gid for gid in node.rsd_groups() if gid != 0]
    bus_ids = {d.device: d.bus_id.lower() for d in node.inventory}
    stored = kubelet.claim(namespace, "watched")
    # (The API server writes the conditions nobody set as null.)
    entries = [{key: value for key, value in entry.items() if value is not None}
               for entry in stored["status"]["devices"]]
    assert sorted(entries, key=lambda d: d["device"]) == [
        {"driver": "npu.rebellions.ai", "pool": serving.dra_node.name, "device": device,
         "data": {"rsdGroup": f"/dev/rsd{group}", "pciBusID": bus_ids[device], "health": "Healthy"}}
        for device in devices]
    managers = {(m["manager"], m.get("subresource")) for m in stored["metadata"]["managedFields"]}
    assert ("npu.rebellions.ai", "status") in managers
    assert not serving.stack.find("Cannot write the claim's device status; the claim stays prepared")
