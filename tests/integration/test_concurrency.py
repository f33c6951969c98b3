"""Concurrency against the running stack: Allocates on every resource at once are serialised by the RSD flock
across the worker processes, and one worker serves ListAndWatch, GetPreferredAllocation and Allocate
side by side without one call waiting for another."""

from __future__ import annotations

import threading

import grpc

from shared.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from shared.resources import Resource
from tests.support.contract import all_healthy
from tests.support.node_state import change_in_progress, non_default_groups
from tests.support.waiting import wait_until

NPU, VF1, VF4 = (r.value for r in Resource)
# A call that does not wait for the Allocate holding the RSD lock answers well within this.
QUICK_DEADLINE = 3.0
# How long the first Allocate holds the RSD lock: room for every quick call above, one after another.
HOLD_SECONDS = 8.0


def run_in_parallel(calls: dict) -> dict:
    """Start every call at once (behind a barrier); return each one's result or exception by key."""
    barrier = threading.Barrier(len(calls))
    results: dict = {}

    def run(key, call):
        barrier.wait()
        try:
            results[key] = call()
        except Exception as exc:  # collected and asserted on by the caller
            results[key] = exc

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_parallel_allocates_on_every_resource_get_distinct_valid_groups_one_change_at_a_time(make_node, kubelet,
                                                                                            start_stack):
    node = make_node("4,2:vf1,1:vf4")
    start_stack(node)
    resources = {NPU: ["rbln0", "rbln1", "rbln2", "rbln3"], VF1: ["rbln4-0", "rbln5-0"],
                 VF4: ["rbln6-0", "rbln6-1", "rbln6-2", "rbln6-3"]}
    for resource, ids in resources.items():
        kubelet.wait_for_devices(resource, all_healthy(ids), timeout=30)
    # Each group change takes a while, so that changes made without the lock would overlap.
    node.set_smi_fault("slow", ["create", "destroy"], delay=0.1)
    containers = {(NPU, ("rbln0", "rbln3")): None, (NPU, ("rbln1",)): None, (NPU, ("rbln2",)): None,
                  (VF1, ("rbln4-0",)): None, (VF1, ("rbln5-0",)): None,
                  (VF4, ("rbln6-0", "rbln6-1")): None, (VF4, ("rbln6-2",)): None, (VF4, ("rbln6-3",)): None}
    for round_ in range(2):  # the second round replaces every group of the first
        results = run_in_parallel({key: (lambda key=key: kubelet.allocate(key[0], [list(key[1])], timeout=60))
                                   for key in containers})
        groups = non_default_groups(node)
        seen_gids = set()
        for (resource, ids), response in results.items():
            assert isinstance(response, api_pb2.AllocateResponse), (round_, resource, ids, response)
            (container,) = response.container_responses
            rsd, *device_nodes = container.devices
            gid = int(rsd.host_path.removeprefix("/dev/rsd"))
            assert rsd.container_path == "/dev/rsd0" and gid not in seen_gids
            seen_gids.add(gid)
            assert groups[gid] == sorted(node.device(i).npu for i in ids)
            assert [d.host_path for d in device_nodes] == [f"/dev/{i}" for i in sorted(ids)]
            assert (node.dev_root / f"rsd{gid}").exists()
        assert set(groups) == seen_gids
    assert node.lock_violations() == []
    calls = node.smi_calls()
    assert len([c for c in calls if c["command"] == "create" and c["exit"] == 0]) == 2 * len(containers)


def test_list_and_watch_preferred_and_allocate_are_served_while_an_allocate_holds_the_lock(make_node, kubelet,
                                                                                          start_stack):
    node = make_node("4")
    start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1", "rbln2", "rbln3"]), timeout=30)
    node.set_smi_fault("slow", ["create"], delay=HOLD_SECONDS)
    endpoint = node.plugin_dir / kubelet.resources()[NPU].endpoint
    with grpc.insecure_channel(f"unix://{endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        # Three more ListAndWatch streams besides the kubelet's, as a restarting kubelet may leave for a while.
        streams = [stub.ListAndWatch(api_pb2.Empty()) for _ in range(3)]
        first_lists = [next(stream) for stream in streams]
        assert all(len(response.devices) == 4 for response in first_lists)

        slow = {}
        holder = threading.Thread(target=lambda: slow.setdefault("response", kubelet.allocate(
            NPU, [["rbln0"]], timeout=30)))
        holder.start()
        wait_until(lambda: change_in_progress(node), 10, "the first Allocate to hold the RSD lock")
        node.set_smi_fault(None)  # the held change stays slow: its rbln-smi read the fault when it started

        # Served while the lock is held: options, a preferred allocation, a refused Allocate, a health change.
        assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=QUICK_DEADLINE).get_preferred_allocation_available
        preferred = kubelet.preferred_allocation(NPU, ["rbln1", "rbln2", "rbln3"], size=2, timeout=QUICK_DEADLINE)
        assert len(preferred.container_responses[0].deviceIDs) == 2
        try:
            kubelet.allocate(NPU, [["rbln9"]], timeout=QUICK_DEADLINE)
            raise AssertionError("an unknown device was allocated")
        except grpc.RpcError as refused:
            assert refused.code() is grpc.StatusCode.NOT_FOUND
        node.set_status("rbln3", 4)
        kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy", "rbln2": "Healthy",
                                       "rbln3": "Unhealthy"}, timeout=QUICK_DEADLINE + 1)
        updates = [next(stream) for stream in streams]
        assert all({d.ID: d.health for d in u.devices}["rbln3"] == "Unhealthy" for u in updates)
        assert holder.is_alive() and change_in_progress(node)  # all of it while the first Allocate held the lock

        # A second Allocate waits for the lock, not for the first Allocate's thread.
        second = kubelet.allocate(NPU, [["rbln1"]], timeout=30)
        holder.join(timeout=30)
        for stream in streams:
            stream.cancel()
    assert slow["response"].container_responses[0].devices[1].host_path == "/dev/rbln0"
    assert second.container_responses[0].devices[1].host_path == "/dev/rbln1"
    assert sorted(non_default_groups(node).values()) == [[0], [1]]
    assert node.lock_violations() == []
