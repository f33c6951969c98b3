"""One scan of a node whose sysfs, status files and rbln-smi output are hostile: nothing hangs, nothing is
advertised under a guess, and what cannot be read is named.

Scans run against a simulated node (its rbln-smi stand-in and sysfs tree), damaged by each test."""

import json
import os
import pathlib
import threading

import pytest

from scanner.discovery import ScanResult, scan
from shared.cdi.stale_specs import TRANSIENT_SPEC_PREFIX, remove_stale_specs
from shared.channels.inventory_protocol import MAX_DEVICES
from shared.node.driver_status import UNREADABLE, read_status
from shared.node.rbln_smi import CallResult, RblnSmi
from shared.node.sriov import SriovError, probe_sriov, read_attribute
from shared.resources import Resource
from simulator import hostile
from simulator.node import SimulatedNode, build_node
from simulator.spec import NodeSpec
from tests.support.hostile_files import (
    STATUS_JUNK,
    as_unprivileged,
    bus_link,
    open_to_all,
    replace_with_loop,
)

SCAN_BOUND = 10.0  # a scan that has not returned by then is stuck, not slow


@pytest.fixture
def node(short_tmp) -> SimulatedNode:
    """Two plain PFs (rbln0, rbln1) and a PF in vf1 mode (rbln2, hosting rbln2-0)."""
    return build_node(short_tmp / "node", NodeSpec.parse("2,1:vf1"))


def scan_node(node: SimulatedNode) -> ScanResult:
    """scan() in a thread of its own, so that a scan blocked on a FIFO fails the test instead of hanging it."""
    results: list[ScanResult] = []
    thread = threading.Thread(target=lambda: results.append(scan(RblnSmi(node.rbln_smi), node.sysfs_root)),
                              daemon=True)
    thread.start()
    thread.join(SCAN_BOUND)
    assert results, f"scan did not return within {SCAN_BOUND:g}s"
    return results[0]


def advertised(result: ScanResult) -> dict[str, list[str]]:
    return {r.value: [d.device_id for d in devices] for r, devices in result.inventories.items() if devices}


def excluded(result: ScanResult) -> dict[str, str]:
    return {e.device: e.reason for e in result.excluded}


def device_dir(node: SimulatedNode, device_id: str) -> pathlib.Path:
    return bus_link(node, device_id).resolve()


def test_the_undamaged_node_scans_as_expected(node):
    result = scan_node(node)
    assert result.error is None and not result.excluded
    assert advertised(result) == {"rebellions.ai/npu": ["rbln0", "rbln1"], "rebellions.ai/npu-vf1": ["rbln2-0"]}


# sysfs symlink loops and special files

def test_a_vf_whose_sysfs_entry_is_a_symlink_loop_is_excluded_not_advertised_as_a_pf(node):
    replace_with_loop(bus_link(node, "rbln2-0"))
    result = scan_node(node)
    assert "rbln2-0" not in advertised(result).get("rebellions.ai/npu", [])
    assert "rebellions.ai/npu-vf1" not in advertised(result)
    assert "cannot read" in excluded(result)["rbln2-0"]
    assert advertised(result)["rebellions.ai/npu"] == ["rbln0", "rbln1"]


def test_a_symlink_loop_in_place_of_physfn_or_sriov_numvfs_excludes_only_that_device(node):
    replace_with_loop(device_dir(node, "rbln2-0") / "physfn")
    replace_with_loop(device_dir(node, "rbln1") / "sriov_numvfs")
    result = scan_node(node)
    assert advertised(result) == {"rebellions.ai/npu": ["rbln0"]}
    assert set(excluded(result)) == {"rbln1", "rbln2-0"}


def test_physfn_naming_something_other_than_a_pci_address_is_refused(node):
    physfn = device_dir(node, "rbln2-0") / "physfn"
    physfn.unlink()
    physfn.symlink_to("../..")
    with pytest.raises(SriovError, match="not a PCI address"):
        probe_sriov(node.sysfs_root, node.device("rbln2-0").bus_id)


def test_fifos_in_place_of_sysfs_attributes_never_block_the_scan(node):
    for attribute in (device_dir(node, "rbln1") / "sriov_numvfs", device_dir(node, "rbln0") / "numa_node"):
        attribute.unlink()
        os.mkfifo(attribute)
    result = scan_node(node)
    assert "not a regular file" in excluded(result)["rbln1"]
    (rbln0,) = [d for d in result.inventories[Resource.NPU] if d.device_id == "rbln0"]
    assert rbln0.numa_node == 0  # rbln-smi's value; the FIFO is never opened for a blocking read
    with pytest.raises(OSError, match="not a regular file"):
        read_attribute(device_dir(node, "rbln0") / "numa_node")


# Status files




@pytest.mark.parametrize("junk", sorted(STATUS_JUNK))
def test_a_junk_status_file_reads_as_unreadable_and_the_scan_goes_on(node, junk):
    path = node.status_file("rbln0")
    path.unlink()
    STATUS_JUNK[junk](path)
    result = scan_node(node)
    statuses = {d.device_id: d.status for d in result.inventories[Resource.NPU]}
    assert statuses["rbln0"] == UNREADABLE and statuses["rbln1"].ready


def test_a_status_file_without_read_permission_reads_as_unreadable(node):
    # Root reads a mode-000 file regardless (CAP_DAC_OVERRIDE), so the read is made by an unprivileged child.
    open_to_all(node.root)
    node.status_file("rbln0").chmod(0o000)
    node.status_file("rbln1").chmod(0o444)
    assert as_unprivileged(read_status, node.sysfs_root, "rbln0") == UNREADABLE
    assert as_unprivileged(read_status, node.sysfs_root, "rbln1").ready


# rbln-smi output

def smi_printing(document: object) -> RblnSmi:
    output = document if isinstance(document, bytes) else json.dumps(document).encode()
    return RblnSmi(pathlib.Path("/bin/true"), runner=lambda argv, timeout, pass_fds=(): CallResult(0, output, 0.0))


def entry(device: str, npu: object = 0, bus_id: str = "0000:01:00.0") -> dict:
    return {"npu": npu, "device": device, "name": "RBLN-CA25", "sid": "s", "pci": {"bus_id": bus_id}}


@pytest.mark.parametrize("name", ["../rbln0", "/dev/rbln0", "rbln0/../../etc", "rbln\x000", "..", ".",
                                  "r" * 64, "rbln 0", "", "rbln0\n"])
def test_device_names_that_could_reach_a_path_are_never_advertised(tmp_path, name):
    result = scan(smi_printing({"devices": [entry(name), entry("rbln1", 1, "0000:02:00.0")]}), tmp_path)
    assert advertised(result) == {"rebellions.ai/npu": ["rbln1"]}
    assert len(result.excluded) == 1


def test_an_npu_index_that_would_widen_a_group_change_is_refused(tmp_path):
    devices = [entry("rbln0", "0,1"), entry("rbln1", -1, "0000:02:00.0"), entry("rbln2", "2", "0000:03:00.0"),
               entry("rbln3", "3\n", "0000:04:00.0")]
    result = scan(smi_printing({"devices": devices}), tmp_path)
    assert advertised(result) == {"rebellions.ai/npu": ["rbln2"]}
    assert len(result.excluded) == 3


def test_a_listing_named_twice_or_larger_than_a_node_can_be_is_not_published(tmp_path):
    twice = scan(smi_printing({"devices": [entry("rbln0"), entry("rbln0")]}), tmp_path)
    assert advertised(twice) == {"rebellions.ai/npu": ["rbln0"]} and excluded(twice) == {
        "rbln0": "listed more than once by rbln-smi"}
    many = [entry(f"rbln{i}", i) for i in range(MAX_DEVICES + 1)]
    too_many = scan(smi_printing({"devices": many}), tmp_path)
    assert too_many.error and str(MAX_DEVICES) in too_many.error and not any(too_many.inventories.values())


@pytest.mark.parametrize("output", [b"[" * 100_000, b'{"devices": ' + b"[" * 100_000, b"\xff\xfe junk",
                                    b'{"devices": [{"device": "rbln0", "npu": 0, "pci": {"bus_id": 7}}]}'])
def test_output_that_cannot_be_used_fails_the_scan_or_the_entry_without_raising(tmp_path, output):
    result = scan(smi_printing(output), tmp_path)
    assert not any(result.inventories.values())
    assert result.error or result.excluded


# CDI root housekeeping

def test_stale_specs_in_a_read_only_cdi_root_are_reported_not_fatal(short_tmp):
    cdi_root = short_tmp / "cdi"
    cdi_root.mkdir()
    stale = cdi_root / f"{TRANSIENT_SPEC_PREFIX}abc.json"
    stale.write_text("{}")
    open_to_all(cdi_root)
    cdi_root.chmod(0o555)  # removing an entry needs write permission on the directory
    try:
        assert as_unprivileged(remove_stale_specs, cdi_root) == []
    finally:
        cdi_root.chmod(0o755)
    assert stale.exists()
    assert remove_stale_specs(cdi_root) == [stale] and not stale.exists()


def test_a_missing_or_non_directory_cdi_root_is_not_fatal(short_tmp):
    assert remove_stale_specs(short_tmp / "absent") == []
    not_a_dir = short_tmp / "file"
    not_a_dir.write_text("")
    assert remove_stale_specs(not_a_dir) == []


# --- Hostile sysfs, as a seeded family (simulator/hostile.py) ----------------------------------------

# Seeds whose families, between them, damage every target the scanner reads in every way (the first 16
# left a FIFO in place of a status or numa_node file untried).
HOSTILE_SEEDS = range(34)


def test_the_seeds_damage_every_target_in_every_way(short_tmp):
    tried = set()
    for seed in HOSTILE_SEEDS:
        node = build_node(short_tmp / f"node-{seed}", hostile.hostile_node_spec())
        tried |= {(h.target, h.kind) for h in hostile.family(node, seed, count=4)}
    assert tried == {(target, kind) for device in node.devices() for target in hostile.targets_of(node, device)
                     for kind in hostile.Kind}


@pytest.mark.parametrize("seed", HOSTILE_SEEDS)
def test_a_seeded_family_of_hostile_sysfs_entries_costs_each_damaged_device_one_named_reason(short_tmp, seed):
    node = build_node(short_tmp / "node", hostile.hostile_node_spec())
    clean = advertised(scan_node(node))
    planted = hostile.family(node, seed, count=4)
    result = scan_node(node)
    out = hostile.expected_out(node, planted)
    # Nothing damaged is advertised under a guess, nothing undamaged is lost, nothing moves resource.
    kept = {r: [d for d in devices if d not in out] for r, devices in clean.items()}
    assert advertised(result) == {r: devices for r, devices in kept.items() if devices}
    # One reason per device, each naming what of it could not be read.
    reasons = [e.device for e in result.excluded]
    warnings = [e.device for e in result.unreadable]
    assert sorted(reasons) == sorted(out)
    assert sorted(warnings) == sorted(hostile.expected_warned(node, planted))
    for exclusion in (*result.excluded, *result.unreadable):
        assert str(node.sysfs_root) in exclusion.reason, exclusion
