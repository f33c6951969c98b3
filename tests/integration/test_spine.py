"""The whole path, node -> scanner -> ZeroMQ -> workers -> kubelet, on simulated nodes."""


import grpc
import pytest

from shared.channels import status_files
from shared.resources import Resource
from tests.support.contract import HEALTHY, all_healthy, assert_contract_response
from tests.support.supervision import program_info
from tests.support.waiting import wait_until

NPU, VF1, VF4 = (r.value for r in Resource)


def registered(kubelet):
    return {name for name, view in kubelet.resources().items() if view.connected}


def test_pf_only_node_registers_npu_only(make_node, kubelet, start_stack):
    node = make_node("3", numa_nodes=2)
    stack = start_stack(node)
    view = kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1", "rbln2"]), timeout=30)
    assert {d: v.numa_nodes for d, v in view.devices.items()} == {"rbln0": (0,), "rbln1": (0,), "rbln2": (1,)}
    assert view.options.get_preferred_allocation_available and not view.options.pre_start_required
    assert registered(kubelet) == {NPU}
    request = next(r.request for r in kubelet.registrations if r.request.resource_name == NPU)
    assert request.version == "v1beta1" and request.options == view.options
    assert request.endpoint.startswith("rbln-device-plugin-rebellions-ai-npu-") and request.endpoint.endswith(".sock")
    stack.wait_for_record("Device exposed", device="rbln2", health=HEALTHY, status="READY")
    # Only the served resource's worker runs: the node lacks the others' devices.
    assert "cygrpc" in loaded_libraries(node, "worker-npu")
    assert set(program_info(node)) == {"scanner", "worker-npu", "watchdog"}




def loaded_libraries(node, process: str, timeout: float = 20.0) -> str:
    """The file names mapped into `process` (its pid from the status file it writes once it runs)."""
    status = wait_until(lambda: status_files.read_status(node.run_dir, process), timeout,
                        f"{process} to write its status file")
    pid = status["pid"]
    with open(f"/proc/{pid}/maps") as maps:
        return "".join(line.rsplit("/", 1)[-1] for line in maps if "/" in line)


@pytest.mark.parametrize("spec,resource,ids", [
    ("2:vf1", VF1, ["rbln0-0", "rbln1-0"]),
    ("1:vf4", VF4, ["rbln0-0", "rbln0-1", "rbln0-2", "rbln0-3"]),
])
def test_vf_nodes_advertise_vfs_and_hide_their_pfs(make_node, kubelet, start_stack, spec, resource, ids):
    node = make_node(spec)
    start_stack(node)
    kubelet.wait_for_devices(resource, all_healthy(ids), timeout=30)
    assert registered(kubelet) == {resource}


def test_mixed_node_advertises_every_resource(make_node, kubelet, start_stack):
    node = make_node("1,1:vf1,1:vf4")
    start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0"]), timeout=30)
    kubelet.wait_for_devices(VF1, all_healthy(["rbln1-0"]), timeout=30)
    kubelet.wait_for_devices(VF4, all_healthy(["rbln2-0", "rbln2-1", "rbln2-2", "rbln2-3"]), timeout=30)


def test_unsupported_vf_count_is_excluded_and_logged(make_node, kubelet, start_stack):
    node = make_node("1,1:vf2")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0"]), timeout=30)
    excluded = stack.wait_for_record("Device excluded from advertisement", count=2)
    assert {r["device"] for r in excluded} == {"rbln1-0", "rbln1-1"}
    assert all(r["level"] == "error" and "2 VFs" in r["err"] for r in excluded)
    assert registered(kubelet) == {NPU}


def test_allocate_for_a_pf_and_a_vf(make_node, kubelet, start_stack):
    node = make_node("2,1:vf4")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=30)
    kubelet.wait_for_devices(VF4, lambda v: v.connected and len(v.devices) == 4, timeout=30)

    pf_group = assert_contract_response(kubelet.allocate(NPU, [["rbln1", "rbln0"]]), ["rbln0", "rbln1"], node)
    vf_group = assert_contract_response(kubelet.allocate(VF4, [["rbln2-1"]]), ["rbln2-1"], node)
    assert pf_group != vf_group and 0 not in (pf_group, vf_group)
    assert node.lock_violations() == []
    completed = stack.wait_for_record("Completed container allocation", resourceName=NPU)
    assert completed[0]["deviceIDs"] == ["rbln0", "rbln1"] and completed[0]["busIDs"]
    assert isinstance(completed[0]["durationMs"], (int, float))


def test_allocating_the_same_ids_again_leaves_one_group(make_node, kubelet, start_stack):
    node = make_node("2")
    start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=30)
    first = assert_contract_response(kubelet.allocate(NPU, [["rbln0"]]), ["rbln0"], node)
    second = assert_contract_response(kubelet.allocate(NPU, [["rbln0"]]), ["rbln0"], node)
    assert {gid for gid in node.rsd_groups() if gid != 0} == {second}
    assert first == second  # the freed id is the smallest free one again


def test_containers_naming_the_same_devices_share_a_group_and_partial_overlaps_are_refused(make_node, kubelet,
                                                                                          start_stack):
    node = make_node("3")
    start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1", "rbln2"]), timeout=30)
    changes_before = len([c for c in node.smi_calls() if c["command"] == "create"])
    response = kubelet.allocate(NPU, [["rbln0", "rbln1"], ["rbln2"], ["rbln1", "rbln0"]])
    first, other, same = ([d.host_path for d in c.devices] for c in response.container_responses)
    assert first == same and first[0] != other[0]
    assert {gid: sorted(npus) for gid, npus in node.rsd_groups().items() if gid != 0} == {
        int(first[0].removeprefix("/dev/rsd")): [0, 1], int(other[0].removeprefix("/dev/rsd")): [2]}
    assert len([c for c in node.smi_calls() if c["command"] == "create"]) == changes_before + 2
    groups = node.rsd_groups()
    with pytest.raises(grpc.RpcError) as overlap:
        kubelet.allocate(NPU, [["rbln0", "rbln1"], ["rbln1"]])
    assert overlap.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "'rbln1' is requested by containers 0 and 1 with different devices" in overlap.value.details()
    assert node.rsd_groups() == groups


def test_allocate_rejects_unknown_and_empty_requests_and_keeps_serving(make_node, kubelet, start_stack):
    node = make_node("1")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0"]), timeout=30)
    with pytest.raises(grpc.RpcError) as unknown:
        kubelet.allocate(NPU, [["rbln9"]])
    assert unknown.value.code() is grpc.StatusCode.NOT_FOUND and "rbln9" in unknown.value.details()
    with pytest.raises(grpc.RpcError) as empty:
        kubelet.allocate(NPU, [[]])
    assert empty.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    failed = stack.wait_for_record("Container allocation failed", count=2)
    assert all(r["level"] == "error" and "durationMs" in r and "err" in r for r in failed)
    assert_contract_response(kubelet.allocate(NPU, [["rbln0"]]), ["rbln0"], node)


def test_device_disappearing_and_reappearing(make_node, kubelet, start_stack):
    node = make_node("2")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=30)
    node.remove_device("rbln1")
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0"]), timeout=10)
    gone = stack.wait_for_record("Device disappeared from inventory", device="rbln1")
    assert gone[0]["level"] == "warn" and gone[0]["deviceCount"] == 1
    node.restore_device("rbln1")
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=10)
    stack.wait_for_record("Device appeared in inventory", device="rbln1")


def test_discovery_failing_and_recovering(make_node, kubelet, start_stack):
    node = make_node("2")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=30)
    node.set_smi_fault("exit", commands=["inventory"])
    kubelet.wait_for_devices(NPU, lambda view: not view.connected, timeout=15)
    failures = stack.wait_for_record("Device discovery failed; reporting zero devices until it recovers", count=2)
    assert all(r["level"] == "error" and r["process"] == "scanner" and r["err"] for r in failures)
    stack.wait_for_record("Stopped device plugin for absent resource", resourceName=NPU)
    node.set_smi_fault(None)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=15)


def test_every_stdout_line_is_a_json_record_with_the_contract_keys(make_node, kubelet, start_stack):
    node = make_node("1,1:vf4")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0"]), timeout=30)
    kubelet.allocate(NPU, [["rbln0"]])
    # The watchdog starts last and serves nothing the kubelet waits for: on a busy machine it may not
    # have logged its start yet, and a stop before that would end it unstarted.
    stack.wait_for_record("Starting rbln-device-plugin", count=4)  # scanner, worker-npu and -vf4, watchdog
    stack.stop()
    assert stack.raw_lines and len(stack.records) == len(stack.raw_lines)
    for record in stack.records:
        assert list(record)[:4] == ["ts", "level", "msg", "process"]
        assert record["ts"].endswith("Z") and record["level"] in ("error", "warn", "info", "debug")
    starts = {r["process"] for r in stack.find("Starting rbln-device-plugin")}
    assert starts == {"scanner", "watchdog", "worker-npu", "worker-npu-vf4"}  # the node has no npu-vf1
    assert all("version" in r and "kubeletDevicePluginPath" in r for r in stack.find("Starting rbln-device-plugin"))
    shutdowns = {r["process"] for r in stack.find("Shutdown")}
    assert shutdowns == starts
