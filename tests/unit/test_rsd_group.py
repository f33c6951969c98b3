"""RSD group changes: serialised by the flock, bounded in time, and never overlapping one that outlived its caller."""

import pathlib
import signal
import subprocess
import sys

import pytest

from shared.node.rbln_smi import RblnSmi, RblnSmiError, SmiDevice, SmiListing, run_bounded
from shared.node.rsd_group import RsdGroupError, RsdGroups, held_flock, next_group_id
from simulator.node import SimulatedNode, build_node
from simulator.spec import NodeSpec
from tests.support.inventory import record
from tests.support.node_state import change_in_progress, lock_is_free
from tests.support.waiting import wait_until

# The lock

def test_a_held_lock_makes_a_waiter_give_up_with_a_clear_error(tmp_path):
    lock_file = tmp_path / "rsd.lock"
    with held_flock(lock_file, timeout=1) as fd:
        assert fd >= 0 and not lock_is_free(lock_file)
        with pytest.raises(RsdGroupError, match=f"{lock_file} still held by another process after 0.2s"):
            with held_flock(lock_file, timeout=0.2):
                pass
    assert lock_is_free(lock_file)


def test_the_lock_of_a_killed_holder_is_released_by_the_kernel(tmp_path):
    lock_file = tmp_path / "rsd.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        f"handle = open({str(lock_file)!r}, 'w')\n"
        "fcntl.flock(handle, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    assert not lock_is_free(lock_file)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with held_flock(lock_file, timeout=1):
        pass


def test_a_child_handed_the_lock_keeps_it_after_its_caller_let_go(tmp_path):
    lock_file = tmp_path / "rsd.lock"
    marker = tmp_path / "done"
    with held_flock(lock_file, timeout=1) as fd:
        # The tool is started in a session of its own and outlives a caller killed meanwhile; a
        # caller that gave up (its descriptor closed) stands in for that here.
        child = subprocess.Popen(["/bin/sh", "-c", f"sleep 0.5; touch {marker}"], pass_fds=(fd,),
                                 start_new_session=True)
    assert not lock_is_free(lock_file)  # the caller's descriptor is closed; the child's keeps the lock
    with held_flock(lock_file, timeout=10):
        assert marker.exists()  # the next change starts only once the orphaned one is over
    child.wait()


def test_run_bounded_hands_exactly_the_given_descriptors_to_the_tool(tmp_path):
    lock_file = tmp_path / "rsd.lock"
    with held_flock(lock_file, timeout=1) as fd:
        listed = run_bounded(["/bin/sh", "-c", "ls /proc/self/fd"], timeout=5, pass_fds=(fd,))
        plain = run_bounded(["/bin/sh", "-c", "ls /proc/self/fd"], timeout=5)
    assert str(fd) in listed.output.decode().split()
    assert str(fd) not in plain.output.decode().split()


# recreate() against the simulated node's rbln-smi

@pytest.fixture
def node(short_tmp) -> SimulatedNode:
    return build_node(short_tmp / "node", NodeSpec.parse("3"))


def records(node: SimulatedNode, *ids: str):
    return [record(i, npu=node.device(i).npu, bus_id=node.device(i).bus_id) for i in ids]


def test_recreate_moves_devices_into_a_fresh_group_under_the_lock(node):
    groups = RsdGroups(RblnSmi(node.rbln_smi), node.lock_file)
    first = groups.recreate(records(node, "rbln0", "rbln1"))
    second = groups.recreate(records(node, "rbln2"))
    again = groups.recreate(records(node, "rbln1"))  # takes rbln1 out of the first group by destroying it
    assert [(c.group_id, c.replaced) for c in (first, second, again)] == [(1, ()), (2, ()), (1, (1,))]
    # List and create; list, destroy and create when a group must go: never the original's second listing.
    assert [c.smi.calls for c in (first, second, again)] == [2, 2, 3]
    assert [call["command"] for call in node.smi_calls()][-3:] == ["groups", "destroy", "create"]
    recorded = sum(call["end"] - call["start"] for call in node.smi_calls()[-3:])
    assert again.smi.seconds >= recorded, "the plugin's count includes the tool's whole run"
    assert node.rsd_groups() == {0: [0], 1: [1], 2: [2]}
    assert node.lock_violations() == []
    assert lock_is_free(node.lock_file)


def test_a_failing_or_hung_tool_fails_recreate_within_its_timeouts_and_frees_the_lock(node):
    for fault, commands, fragment in (("exit", ["groups"], "exited with status 1"),
                                      ("garbage", ["groups"], "invalid JSON"),
                                      ("hang", ["groups"], "timed out after 0.5s"),
                                      ("hang", ["create"], "timed out after 0.5s")):
        node.set_smi_fault(fault, commands)
        smi = RblnSmi(node.rbln_smi, list_timeout=0.5, change_timeout=0.5)
        with pytest.raises(RsdGroupError, match=fragment):
            RsdGroups(smi, node.lock_file).recreate(records(node, "rbln0"))
        assert lock_is_free(node.lock_file)
    node.set_smi_fault(None)
    assert node.rsd_groups() == {0: [0, 1, 2]}


def test_a_device_rbln_smi_does_not_list_is_named(node):
    node.remove_device("rbln2")
    with pytest.raises(RsdGroupError, match="does not list rbln2"):
        RsdGroups(RblnSmi(node.rbln_smi), node.lock_file).recreate(records(node, "rbln1", "rbln2"))
    assert not any(call["command"] in ("create", "destroy") for call in node.smi_calls())


def test_a_caller_killed_mid_change_never_lets_another_change_overlap_it(node):
    """The worker dies while `group -c` runs: the orphaned tool finishes its change holding the lock it
    inherited, and the next change waits for it (the stand-in records any overlap)."""
    node.set_smi_fault("slow", ["create"], delay=1.5)
    caller = subprocess.Popen([sys.executable, "-c", (
        "import pathlib, sys\n"
        "from shared.node.rsd_group import RsdGroups\n"
        "from shared.node.rbln_smi import RblnSmi\n"
        "from tests.support.inventory import record\n"
        f"device = record('rbln0', npu=0, bus_id={node.device('rbln0').bus_id!r})\n"
        f"RsdGroups(RblnSmi(pathlib.Path({str(node.rbln_smi)!r})), pathlib.Path({str(node.lock_file)!r}))"
        ".recreate([device])\n")], cwd=pathlib.Path(__file__).resolve().parents[2])
    wait_until(lambda: change_in_progress(node), 10, "group -c to start", poll=0.02)
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    node.set_smi_fault(None)
    RsdGroups(RblnSmi(node.rbln_smi), node.lock_file).recreate(records(node, "rbln0"))
    assert node.lock_violations() == []
    creates = [c for c in node.smi_calls() if c["command"] == "create"]
    assert [c["exit"] for c in creates] == [0, 0]  # the orphan finished its change, then ours ran
    assert creates[1]["start"] >= creates[0]["end"]
    assert [c["command"] for c in node.smi_calls() if c["command"] in ("create", "destroy")] == [
        "create", "destroy", "create"]
    assert node.rsd_groups() == {0: [1, 2], 1: [0]}


def test_next_group_id_is_the_smallest_unused_above_the_default():
    assert next_group_id(set()) == 1
    assert next_group_id({0, 1, 2, 4}) == 3


class _ListingSmi:
    """An RblnSmi whose `-g -j` listing is fixed and whose group changes are recorded."""

    def __init__(self, devices):
        self.listing = SmiListing(tuple(devices), ())
        self.changes: list[tuple] = []

    def counted(self, usage):
        return self

    def groups(self):
        return self.listing

    def destroy_groups(self, group_ids, lock_fd=None):
        self.changes.append(("destroy", list(group_ids), lock_fd is not None))

    def create_group(self, group_id, npus, lock_fd=None):
        self.changes.append(("create", group_id, list(npus), lock_fd is not None))


def test_group_changes_are_handed_the_lock_and_the_default_group_is_never_destroyed(tmp_path):
    listed = [SmiDevice("rbln0", 0, "RBLN-CA25", "s", "0000:03:00.0", "0", 0),
              SmiDevice("rbln1", "1", "RBLN-CA25", "s", "0000:04:00.0", "0", 3),
              SmiDevice("rbln2", 2, "RBLN-CA25", "s", "0000:05:00.0", "0", 1)]
    smi = _ListingSmi(listed)
    wanted = [record("rbln0", bus_id="0000:03:00.0"), record("rbln1", bus_id="0000:04:00.0")]
    assert RsdGroups(smi, tmp_path / "rsd.lock").recreate(wanted).group_id == 2  # 1 is still rbln2's
    assert smi.changes == [("destroy", [3], True), ("create", 2, [0, "1"], True)]


def test_an_unexpected_tool_error_becomes_an_rsd_group_error(tmp_path):
    class Broken(_ListingSmi):
        def groups(self):
            raise RblnSmiError("rbln-smi -g -j exited with status 1: driver gone")

    with pytest.raises(RsdGroupError, match="driver gone"):
        RsdGroups(Broken([]), tmp_path / "rsd.lock").recreate([record()])
