"""Faults against the running stack on a simulated node: a broken rbln-smi, junk status files, sysfs symlink
loops, missing device nodes, a worker killed inside an Allocate, IPC sockets deleted, a missing or unusable
CDI root, and the same Allocate twice. Each fault must end in a clear error or be ridden out, and the stack
must serve correctly once it is gone."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import threading
from collections.abc import Callable

import grpc
import pytest

from rbln_device_plugin.simulate import expected_resources
from resource_worker.allocation import DEVICE_NODE_TIMEOUT
from shared.channels import inventory_protocol
from shared.node.rbln_smi import LIST_TIMEOUT
from shared.resources import Resource
from simulator import hostile
from simulator.smi_state import GROUP_CHANGES
from tests.support.contract import all_healthy
from tests.support.hostile_files import STATUS_JUNK, bus_link, replace_with_loop
from tests.support.node_state import await_scans, change_in_progress, non_default_groups, process_pid
from tests.support.waiting import wait_until

NPU, VF1, VF4 = (r.value for r in Resource)
DISCOVERY_FAILED = "Device discovery failed; reporting zero devices until it recovers"
# An Allocate whose rbln-smi hangs fails after the call's own timeout; this is the margin for the rest.
ALLOCATE_MARGIN = 3.0


# Helpers shared by the reliability tests



def group_changes(node) -> list[dict]:
    return [call for call in node.smi_calls() if call["command"] in GROUP_CHANGES]


def registrations(kubelet, resource: str) -> int:
    view = kubelet.resources().get(resource)
    return view.registrations if view else 0


def await_reregistration(kubelet, resource: str, before: int, expected: dict[str, str], timeout: float = 30.0):
    """Wait for a Register newer than the `before`-th whose stream delivered exactly `expected`."""
    return kubelet.wait_for_devices(resource, lambda view: view.registrations > before and view.connected
                                    and view.updates > 0 and view.health == expected, timeout=timeout)


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value


def container_shape(response) -> list[tuple]:
    (container,) = response.container_responses
    return [(d.container_path, d.host_path, d.permissions) for d in container.devices] + sorted(
        container.annotations.items())


# rbln-smi

def test_rbln_smi_faults_fail_discovery_and_the_stack_recovers_from_each(make_node, kubelet, start_stack):
    node = make_node("2")
    stack = start_stack(node)
    healthy = all_healthy(["rbln0", "rbln1"])
    kubelet.wait_for_devices(NPU, healthy, timeout=30)
    scanner_pid = process_pid(node, "scanner")
    hidden = node.rbln_smi.with_name("rbln-smi.hidden")

    def inject(fault):
        return lambda: node.set_smi_fault(fault, ["inventory"])

    faults = [
        ("garbage", inject("garbage"), lambda: node.set_smi_fault(None), "printed invalid JSON"),
        ("truncated JSON", inject("truncated"), lambda: node.set_smi_fault(None), "printed invalid JSON"),
        ("non-zero exit", inject("exit"), lambda: node.set_smi_fault(None), "exited with status 1"),
        ("hang", inject("hang"), lambda: node.set_smi_fault(None), f"timed out after {LIST_TIMEOUT:g}s"),
        ("missing binary", lambda: node.rbln_smi.rename(hidden), lambda: hidden.rename(node.rbln_smi),
         "is not an executable file"),
        ("not executable", lambda: node.rbln_smi.chmod(0o644), lambda: node.rbln_smi.chmod(0o755),
         "is not an executable file"),
    ]
    for name, inject_fault, clear, fragment in faults:
        already = len(stack.find(DISCOVERY_FAILED))
        inject_fault()
        # A hung rbln-smi is killed at its timeout: the failure is reported within it plus a scan interval.
        wait_until(lambda fragment=fragment, already=already: any(
                       fragment in r["err"] for r in stack.find(DISCOVERY_FAILED)[already:]),
                   LIST_TIMEOUT + 5, f"discovery to fail on {name}")
        kubelet.wait_for_devices(NPU, lambda view: not view.connected, timeout=10)
        recovered = len(stack.find("Device discovery recovered"))
        clear()
        kubelet.wait_for_devices(NPU, healthy, timeout=20)
        stack.wait_for_record("Device discovery recovered", count=recovered + 1)
    assert process_pid(node, "scanner") == scanner_pid


def test_rbln_smi_faults_and_a_missing_device_node_fail_allocate_in_bounded_time(make_node, kubelet, start_stack):
    node = make_node("2")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=30)
    for fault, commands, fragment in [("exit", ["groups"], "exited with status 1"),
                                      ("garbage", ["groups"], "printed invalid JSON"),
                                      ("truncated", ["groups"], "printed invalid JSON"),
                                      ("hang", ["groups"], f"timed out after {LIST_TIMEOUT:g}s"),
                                      ("exit", ["create"], "exited with status 1")]:
        node.set_smi_fault(fault, commands)
        # The deadline is the stated bound: a hung `-g -j` fails the Allocate after LIST_TIMEOUT, it never
        # leaves it hanging (that would surface here as DEADLINE_EXCEEDED).
        failed = rpc_error(lambda: kubelet.allocate(NPU, [["rbln0"]], timeout=LIST_TIMEOUT + ALLOCATE_MARGIN))
        assert failed.code() is grpc.StatusCode.INTERNAL, (fault, commands, failed)
        assert failed.details().startswith("RSD group for rbln0 failed: ") and fragment in failed.details()
        node.set_smi_fault(None)
        assert non_default_groups(node) == {}
    # stdout lags behind the gRPC answers: wait for the records, then check there are no more.
    assert len(stack.wait_for_record("Container allocation failed", count=5, resourceName=NPU)) == 5

    (node.dev_root / "rbln1").unlink()
    changes = len(group_changes(node))
    failed = rpc_error(lambda: kubelet.allocate(NPU, [["rbln1"]], timeout=DEVICE_NODE_TIMEOUT + ALLOCATE_MARGIN))
    assert failed.code() is grpc.StatusCode.INTERNAL
    assert failed.details() == (f"device node /dev/rbln1 for rbln1 did not appear under {node.dev_root} "
                                f"within {DEVICE_NODE_TIMEOUT:g}s")
    assert len(group_changes(node)) == changes  # refused before any RSD change
    (node.dev_root / "rbln1").touch()

    kubelet.allocate(NPU, [["rbln0"]])
    kubelet.allocate(NPU, [["rbln1"]])
    assert sorted(non_default_groups(node).values()) == [[0], [1]]
    assert node.lock_violations() == []


# Status files and sysfs

def replace_status(node, device_id: str, make: Callable) -> None:
    path = node.status_file(device_id)
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    make(path)


def test_junk_status_files_keep_a_fault_and_a_healthy_device_as_they_were(make_node, kubelet, start_stack):
    node = make_node("2,1:vf1")
    stack = start_stack(node)
    kubelet.wait_for_devices(VF1, all_healthy(["rbln2-0"]), timeout=30)
    node.set_status("rbln0", 4)
    expected = {"rbln0": "Unhealthy", "rbln1": "Healthy"}
    kubelet.wait_for_devices(NPU, expected, timeout=10)
    scanner_pid = process_pid(node, "scanner")
    for junk in sorted(STATUS_JUNK):
        for device_id in ("rbln0", "rbln1"):
            replace_status(node, device_id, STATUS_JUNK[junk])
        await_scans(node)
        assert kubelet.resources()[NPU].health == expected, junk
        unhealthy = rpc_error(lambda: kubelet.allocate(NPU, [["rbln0"]]))
        assert unhealthy.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert unhealthy.details() == "cannot allocate unhealthy devices: rbln0 is Unhealthy (UNREADABLE)", junk
        kubelet.allocate(NPU, [["rbln1"]])  # no unresolved fault: an unreadable status keeps it Healthy
    # An unreadable status is never logged as a recovery.
    assert not stack.find("Device state changed", device="rbln0", health="Healthy")
    assert process_pid(node, "scanner") == scanner_pid

    node.set_status("rbln0", 0)
    node.set_status("rbln1", 0)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=10)

    # A symlink loop where the VF's sysfs entry should be: its role is unknown, so it is advertised nowhere.
    link = bus_link(node, "rbln2-0")
    target = os.readlink(link)
    replace_with_loop(link)
    excluded = stack.wait_for_record("Device excluded from advertisement", device="rbln2-0")
    assert excluded[0]["level"] == "error" and "cannot read" in excluded[0]["err"]
    stack.wait_for_record("Stopped device plugin for absent resource", resourceName=VF1)
    assert set(kubelet.resources()[NPU].devices) == {"rbln0", "rbln1"}
    link.unlink()
    link.symlink_to(target)
    before = registrations(kubelet, VF1)
    await_reregistration(kubelet, VF1, before, all_healthy(["rbln2-0"]))


# Seeds whose families hold every kind of damage between them (the unit family covers every target).
@pytest.mark.parametrize("seed", [2, 6])
def test_a_seeded_family_of_hostile_sysfs_entries_costs_each_bad_device_one_clear_error_and_nothing_else(
        make_node, kubelet, start_stack, seed):
    """Link loops, enormous files, non-UTF-8 names and FIFOs in a running node's sysfs: no scan hangs, no
    process dies, and each damaged device gets one record naming it, every scan after."""
    node = make_node(hostile.hostile_node_spec())
    clean = {resource: set(ids) for resource, ids in expected_resources(node).items()}
    planted = hostile.family(node, seed, count=4)
    out = hostile.expected_out(node, planted)
    kept = {resource: ids - out for resource, ids in clean.items() if ids - out}
    stack = start_stack(node)
    for resource, ids in kept.items():
        kubelet.wait_for_devices(resource, lambda view, ids=ids: view.connected and set(view.devices) == ids,
                                 timeout=30)
    scanner_pid = process_pid(node, "scanner")
    await_scans(node, count=10)
    for resource in set(clean) - set(kept):
        assert resource not in kubelet.resources() or not kubelet.resources()[resource].devices, resource
    for device in out:
        (record,) = stack.find("Device excluded from advertisement", device=device)
        assert record["level"] == "error" and str(node.sysfs_root) in record["err"]
    for device in hostile.expected_warned(node, planted):
        (record,) = stack.find("Device attribute cannot be read; advertising the device without it", device=device)
        assert record["level"] == "warn" and str(node.sysfs_root) in record["err"]
    assert process_pid(node, "scanner") == scanner_pid
    assert not [line for line in stack.stderr_lines if "exited:" in line and "not expected" in line]


# A worker killed inside an Allocate

def test_a_worker_killed_inside_an_allocate_leaves_the_lock_free_and_no_half_made_group(make_node, kubelet,
                                                                                        start_stack):
    node = make_node("2")
    start_stack(node)
    healthy = all_healthy(["rbln0", "rbln1"])
    kubelet.wait_for_devices(NPU, healthy, timeout=30)
    # The group change outlives the worker by longer than the worker takes to come back and serve again.
    node.set_smi_fault("slow", ["create"], delay=6)
    errors: list[grpc.RpcError] = []

    def doomed_allocate():
        try:
            kubelet.allocate(NPU, [["rbln0"]], timeout=30)
        except grpc.RpcError as exc:
            errors.append(exc)

    allocating = threading.Thread(target=doomed_allocate)
    allocating.start()
    wait_until(lambda: change_in_progress(node), 10, "the Allocate to reach `group -c` inside the lock")
    worker = process_pid(node, "worker-npu")
    before = registrations(kubelet, NPU)
    os.kill(worker, signal.SIGKILL)
    node.set_smi_fault(None)
    allocating.join(timeout=30)
    assert [e.code() for e in errors] == [grpc.StatusCode.UNAVAILABLE]

    await_reregistration(kubelet, NPU, before, healthy)
    assert process_pid(node, "worker-npu") != worker
    response = kubelet.allocate(NPU, [["rbln0"]], timeout=30)  # waits for the orphaned change, then makes its own
    (gid,) = non_default_groups(node)
    assert non_default_groups(node) == {gid: [0]}
    assert response.container_responses[0].devices[0].host_path == f"/dev/rsd{gid}"
    assert node.lock_violations() == []
    assert [(c["command"], c["exit"]) for c in group_changes(node)] == [("create", 0), ("destroy", 0), ("create", 0)]
    assert (node.dev_root / f"rsd{gid}").exists() and sorted(p.name for p in node.dev_root.glob("rsd*")) == [
        "rsd0", f"rsd{gid}"]


# The run dir's IPC sockets

def test_deleted_ipc_sockets_are_bound_again_and_a_restarted_worker_resyncs(make_node, kubelet, start_stack):
    node = make_node("2")
    stack = start_stack(node)
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=30)
    paths = [pathlib.Path(endpoint.removeprefix("ipc://")) for endpoint in inventory_protocol.endpoints(node.run_dir)]
    for path in paths:
        path.unlink()
    rebound = stack.wait_for_record("IPC socket file was removed or replaced; binding it again", count=2)
    assert {r["path"] for r in rebound} == {str(p) for p in paths} and all(r["level"] == "warn" for r in rebound)
    # ZeroMQ binds with the process's umask and the publisher narrows the file to 0600 just after (the
    # run dir around it is 0700 throughout), so the final mode is awaited, not the first instant's.
    wait_until(lambda: all(p.exists() and p.stat().st_mode & 0o777 == 0o600 for p in paths), 10,
               "the socket files to be back, owner-only")

    # Workers that were connected follow again (ZeroMQ reconnects them to the new files).
    node.set_status("rbln1", 4)
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Unhealthy"}, timeout=15)
    # A worker that starts now reaches the scanner through the new files.
    before = registrations(kubelet, NPU)
    os.kill(process_pid(node, "worker-npu"), signal.SIGKILL)
    await_reregistration(kubelet, NPU, before, {"rbln0": "Healthy", "rbln1": "Unhealthy"})


# CDI root, the scanner restarting, the same Allocate twice

def test_same_ids_twice_and_across_a_kubelet_restart_answer_alike_without_a_cdi_root(make_node, kubelet,
                                                                                      start_stack):
    node = make_node("3")
    node.cdi_root.rmdir()
    stack = start_stack(node)
    healthy = all_healthy(["rbln0", "rbln1", "rbln2"])
    kubelet.wait_for_devices(NPU, healthy, timeout=30)
    first = kubelet.allocate(NPU, [["rbln2", "rbln0"]])
    second = kubelet.allocate(NPU, [["rbln2", "rbln0"]])
    before = registrations(kubelet, NPU)
    kubelet.restart()  # after a restart (or a node reboot) the kubelet sends the IDs it had handed out again
    await_reregistration(kubelet, NPU, before, healthy)
    third = kubelet.allocate(NPU, [["rbln2", "rbln0"]])
    assert container_shape(first) == container_shape(second) == container_shape(third)
    assert non_default_groups(node) == {1: [0, 2]}
    assert [c["command"] for c in group_changes(node)] == ["create", "destroy", "create", "destroy", "create"]
    assert node.lock_violations() == []
    assert not node.cdi_root.exists() and not stack.find("Cannot list the CDI spec directory")


def test_an_unusable_cdi_root_is_reported_and_a_restarted_scanner_changes_nothing_served(make_node, kubelet,
                                                                                        start_stack):
    node = make_node("2")
    stack = start_stack(node)
    healthy = all_healthy(["rbln0", "rbln1"])
    kubelet.wait_for_devices(NPU, healthy, timeout=30)
    shutil.rmtree(node.cdi_root)
    node.cdi_root.write_text("not a directory")
    before = registrations(kubelet, NPU)
    scanner = process_pid(node, "scanner")
    os.kill(scanner, signal.SIGKILL)  # housekeeping runs when the scanner starts
    warning = stack.wait_for_record("Cannot list the CDI spec directory")
    assert warning[0]["level"] == "warn" and warning[0]["path"] == str(node.cdi_root)
    wait_until(lambda: process_pid(node, "scanner") not in (None, scanner), 20, "the new scanner's first scan")
    node.set_status("rbln1", 4)  # followed through the new scanner
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Unhealthy"}, timeout=15)
    assert registrations(kubelet, NPU) == before  # the workers kept serving throughout
    kubelet.allocate(NPU, [["rbln0"]])
