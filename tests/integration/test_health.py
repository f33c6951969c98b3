"""Device health end to end: status files on a simulated node -> scanner and Allocate -> the kubelet and the log."""

import contextlib
import os
import signal

import grpc
import pytest

from shared.channels import status_files
from shared.resources import Resource
from simulator import smi_state
from tests.support.contract import assert_contract_response

NPU = Resource.NPU.value
H, U = "Healthy", "Unhealthy"
TIMEOUT = 15


def changes(stack, device):
    """`Device state changed` records of `device`: (previousHealth, previousStatus, health, status, level)."""
    return [(r["previousHealth"], r["previousStatus"], r["health"], r["status"], r["level"])
            for r in stack.find("Device state changed", device=device)]


def recoveries_logged_as_unreadable(stack):
    return [r for r in stack.find("Device state changed")
            if r["previousHealth"] == U and r["health"] == H and r["status"] != "READY"]


def pid_of(node, process):
    return status_files.read_status(node.run_dir, process)["pid"]


@contextlib.contextmanager
def scanner_frozen(node):
    """No scan reads or publishes anything inside the block; the next one runs right after it."""
    pid = pid_of(node, "scanner")
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_scans_bring_status_changes_to_the_kubelet_and_the_log(make_node, kubelet, start_stack):
    node = make_node("3")
    node.set_status("rbln1", 4)
    node.set_status("rbln2", 1)
    stack = start_stack(node)
    # Devices already unusable when the worker starts are announced at warn.
    kubelet.wait_for_devices(NPU, {"rbln0": H, "rbln1": U, "rbln2": U}, timeout=30)
    assert stack.wait_for_record("Device exposed", device="rbln0", level="info", health=H, status="READY")
    assert stack.wait_for_record("Device exposed", device="rbln1", level="warn", health=U, status="FAULT")
    assert stack.wait_for_record("Device exposed", device="rbln2", level="warn", health=U, status="BUSY")

    node.set_status("rbln0", 4)
    kubelet.wait_for_devices(NPU, {"rbln0": U, "rbln1": U, "rbln2": U}, timeout=TIMEOUT)
    (fault,) = stack.wait_for_record("Device state changed", device="rbln0", status="FAULT")
    assert {k: fault[k] for k in ("level", "resourceName", "health", "previousHealth", "previousStatus",
                                  "deviceCount", "healthyCount", "unhealthyCount")} == {
        "level": "warn", "resourceName": NPU, "health": U, "previousHealth": H, "previousStatus": "READY",
        "deviceCount": 3, "healthyCount": 0, "unhealthyCount": 3}

    node.set_status("rbln0", None)  # the status file goes away after the fault
    stack.wait_for_record("Device state changed", device="rbln0", status="UNREADABLE")
    assert kubelet.resources()[NPU].health["rbln0"] == U

    node.set_status("rbln0", 0)
    node.set_status("rbln1", 0)
    node.set_status("rbln2", 9)
    kubelet.wait_for_devices(NPU, {"rbln0": H, "rbln1": H, "rbln2": U}, timeout=TIMEOUT)
    stack.wait_for_record("Device state changed", device="rbln2", status="UNKNOWN(9)")
    assert changes(stack, "rbln0") == [(H, "READY", U, "FAULT", "warn"), (U, "FAULT", U, "UNREADABLE", "warn"),
                                       (U, "UNREADABLE", H, "READY", "info")]
    assert changes(stack, "rbln1") == [(U, "FAULT", H, "READY", "info")]
    assert changes(stack, "rbln2") == [(U, "BUSY", U, "UNKNOWN(9)", "warn")]
    assert recoveries_logged_as_unreadable(stack) == []


def test_allocate_checks_the_status_read_since_the_last_scan(make_node, kubelet, start_stack):
    node = make_node("3")
    node.set_status("rbln2", 4)
    stack = start_stack(node, scan_interval="3s")
    kubelet.wait_for_devices(NPU, {"rbln0": H, "rbln1": H, "rbln2": U}, timeout=30)
    with scanner_frozen(node):
        node.set_status("rbln1", 4)
        calls_before = len(node.smi_calls())
        with pytest.raises(grpc.RpcError) as rejected:
            kubelet.allocate(NPU, [["rbln0", "rbln1"]])
        assert rejected.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "rbln1 is Unhealthy (FAULT)" in rejected.value.details()
        assert "rbln0 is" not in rejected.value.details()
        # Refused before any RSD group work, and seen by Allocate alone: no scan has read the fault.
        assert list(node.rsd_groups()) == [0]
        assert [c for c in node.smi_calls()[calls_before:] if c["command"] != smi_state.INVENTORY] == []
        assert kubelet.resources()[NPU].health["rbln1"] == H
        (failed,) = stack.wait_for_record("Container allocation failed")
        assert failed["deviceIDs"] == ["rbln1"] and "FAULT" in failed["err"]

        node.set_status("rbln2", 0)  # recovered since the last scan, which saw it faulted
        assert_contract_response(kubelet.allocate(NPU, [["rbln2"]]), ["rbln2"], node)
        # One device named twice: one check (proved in test_device_table), one device node.
        assert_contract_response(kubelet.allocate(NPU, [["rbln0", "rbln0"]]), ["rbln0"], node)
        groups = dict(node.rsd_groups())

        # Without the Allocate observations, the next scan would conclude the opposite for both.
        node.set_status("rbln1", None)
        node.set_status("rbln2", None)
        node.set_status("rbln0", 4)  # a device in use faults
        calls_before = len(node.smi_calls())
    kubelet.wait_for_devices(NPU, {"rbln0": U, "rbln1": U, "rbln2": H}, timeout=TIMEOUT)
    stack.wait_for_record("Device state changed", device="rbln1", status="UNREADABLE")
    stack.wait_for_record("Device state changed", device="rbln2", status="UNREADABLE")
    assert changes(stack, "rbln1") == [(H, "READY", U, "FAULT", "warn"), (U, "FAULT", U, "UNREADABLE", "warn")]
    assert changes(stack, "rbln2") == [(U, "FAULT", H, "READY", "info"), (H, "READY", H, "UNREADABLE", "info")]
    assert recoveries_logged_as_unreadable(stack) == []
    # Health changes affect new allocations only: the faulted device keeps its RSD group.
    assert node.rsd_groups() == groups
    assert [c for c in node.smi_calls()[calls_before:] if c["command"] in smi_state.GROUP_CHANGES] == []


def test_health_history_lives_as_long_as_the_resource_plugin(make_node, kubelet, start_stack):
    node = make_node("2")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, {"rbln0": H, "rbln1": H}, timeout=30)
    node.set_status("rbln0", 4)
    kubelet.wait_for_devices(NPU, {"rbln0": U, "rbln1": H}, timeout=TIMEOUT)

    # Gone and back while the plugin serves: the unresolved fault comes back with it.
    node.remove_device("rbln0")
    kubelet.wait_for_devices(NPU, {"rbln1": H}, timeout=TIMEOUT)
    node.set_status("rbln0", None)
    node.restore_device("rbln0")
    kubelet.wait_for_devices(NPU, {"rbln0": U, "rbln1": H}, timeout=TIMEOUT)
    stack.wait_for_record("Device appeared in inventory", device="rbln0", level="warn", health=U,
                          status="UNREADABLE")

    # The resource goes away and the plugin stops; the one serving it again starts with no history.
    registrations = kubelet.resources()[NPU].registrations
    node.remove_device("rbln0")
    node.remove_device("rbln1")
    stack.wait_for_record("Stopped device plugin for absent resource", resourceName=NPU)
    node.restore_device("rbln0")
    node.restore_device("rbln1")
    kubelet.wait_for_devices(NPU, lambda v: v.registrations > registrations and v.connected and v.updates > 0
                             and v.health == {"rbln0": H, "rbln1": H}, timeout=TIMEOUT)
    stack.wait_for_record("Device exposed", device="rbln0", level="info", health=H, status="UNREADABLE")

    # A new worker process starts with no history either.
    node.set_status("rbln0", 4)
    kubelet.wait_for_devices(NPU, {"rbln0": U, "rbln1": H}, timeout=TIMEOUT)
    node.set_status("rbln0", None)
    stack.wait_for_record("Device state changed", device="rbln0", status="UNREADABLE", health=U)
    registrations = kubelet.resources()[NPU].registrations
    old_worker = pid_of(node, "worker-npu")
    os.kill(old_worker, signal.SIGKILL)  # supervisord starts a new one
    kubelet.wait_for_devices(NPU, lambda v: v.registrations > registrations and v.connected and v.updates > 0
                             and v.health == {"rbln0": H, "rbln1": H}, timeout=30)
    assert pid_of(node, "worker-npu") != old_worker
    assert recoveries_logged_as_unreadable(stack) == []
