"""ResourceSlices as pure functions of the inventory: the Go driver's names and attributes, plus VFs."""

from __future__ import annotations

import dataclasses

import pytest

from dra_worker import slices
from dra_worker.inventory import InventoryState, NodeInventory, ServedDevice
from shared.config import DRA_DRIVER, TaintEffect
from shared.node.device_health import Health
from shared.node.device_record import DeviceRecord
from shared.node.driver_status import StatusReading
from shared.resources import Resource
from tests.support.dra import NODE, feed, simulated_node


def _record(device_id: str, **changes) -> DeviceRecord:
    base = DeviceRecord(device_id=device_id, npu=0, bus_id="0000:3B:00.0", product="RBLN-CA25", sid="S1",
                        numa_node=1, parent_pf=None, pci_path=("pci0000:3a", "0000:3a:00.0", "0000:3b:00.0"),
                        status=StatusReading(0), observed_at_ns=1, uuid="u-1", firmware_version="1.0.17",
                        pci_device_id="0x1250", memory_bytes=16 * 1024**3)
    return dataclasses.replace(base, **changes)


def test_a_whole_npu_has_the_go_driver_s_attributes():
    entry = slices.device_entry(ServedDevice(_record("rbln0"), Resource.NPU, Health.HEALTHY), "1.3.73")
    assert entry == {"name": "rbln0", "attributes": {
        "type": {"string": "npu"}, "productName": {"string": "RBLN-CA25"}, "sid": {"string": "S1"},
        "uuid": {"string": "u-1"}, "pciDeviceID": {"string": "0x1250"}, "firmwareVersion": {"string": "1.0.17"},
        "driverVersion": {"string": "1.3.73"}, "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
        "resource.kubernetes.io/numaNode": {"int": 1}, "dra.net/numaNode": {"int": 1}},
        "capacity": {"memory": {"value": str(16 * 1024**3)}}}


@pytest.mark.parametrize(("resource", "count"), [(Resource.NPU_VF1, 1), (Resource.NPU_VF4, 4)])
def test_a_vf_says_its_card_s_vf_count_and_parent(resource, count):
    record = _record("rbln2-1", parent_pf="0000:3C:00.0", bus_id="0000:3c:00.1")
    attributes = slices.device_entry(ServedDevice(record, resource, Health.HEALTHY), "")["attributes"]
    assert attributes["type"] == {"string": "vf"}
    assert attributes["vfCount"] == {"int": count}
    assert attributes["parentPciBusID"] == {"string": "0000:3c:00.0"}
    assert "driverVersion" not in attributes


def test_what_the_node_does_not_say_is_left_out_rather_than_guessed():
    record = _record("rbln0", numa_node=None, pci_path=None, memory_bytes=None, uuid="", sid="")
    entry = slices.device_entry(ServedDevice(record, Resource.NPU, Health.HEALTHY), "")
    assert "capacity" not in entry
    assert not {"uuid", "sid", "resource.kubernetes.io/numaNode", "dra.net/numaNode",
                "resource.kubernetes.io/pcieRoot"} & set(entry["attributes"])


@pytest.mark.parametrize("count", [0, 1, 63, 64, 65, 127, 128, 129, 300])
@pytest.mark.parametrize("per_slice", [slices.MAX_DEVICES_PER_TAINTED_SLICE, slices.MAX_DEVICES_PER_SLICE])
def test_slices_hold_at_most_their_bound_of_devices_and_count_themselves(count, per_slice):
    devices = [{"name": f"rbln{i}"} for i in range(count)]
    specs = slices.slice_specs(NODE, devices, 7, per_slice)
    assert [d for s in specs for d in s["devices"]] == devices
    assert all(len(s["devices"]) <= per_slice for s in specs)
    assert len(specs) == max(1, -(-count // per_slice))
    assert {(s["driver"], s["nodeName"], s["pool"]["name"], s["pool"]["generation"], s["pool"]["resourceSliceCount"])
            for s in specs} == {(DRA_DRIVER, NODE, NODE, 7, len(specs))}


def test_the_simulated_node_s_pool_is_its_pfs_and_vfs_never_a_pf_hosting_vfs(tmp_path):
    node = simulated_node(tmp_path)
    state = InventoryState()
    feed(state, node)
    inventory = state.current()
    assert inventory.complete
    names = [d["name"] for d in slices.published_devices(inventory, TaintEffect.NO_SCHEDULE)]
    hosting = [d.device for d in node.inventory if not d.is_vf and d.num_vfs]
    assert names == sorted(d.device for d in node.inventory if d.device not in hosting)
    assert hosting and not set(hosting) & set(names)
    types = {d["name"]: d["attributes"]["type"]["string"]
             for d in slices.published_devices(inventory, TaintEffect.NO_SCHEDULE)}
    assert {t for n, t in types.items() if "-" in n} == {"vf"}
    assert {t for n, t in types.items() if "-" not in n} == {"npu"}


@pytest.mark.parametrize("effect", list(TaintEffect))
def test_an_unhealthy_device_stays_tainted_with_its_status_and_the_taint_goes_when_it_recovers(tmp_path, effect):
    node = simulated_node(tmp_path)
    state = InventoryState()
    feed(state, node)
    node.set_status("rbln0", 4)
    node.set_status("rbln1", 7)
    feed(state, node, seq=2)
    published = {d["name"]: d for d in slices.published_devices(state.current(), effect)}
    assert published["rbln0"]["taints"] == [{"key": "npu.rebellions.ai/unhealthy", "value": "FAULT",
                                             "effect": effect.value}]
    assert published["rbln1"]["taints"][0]["value"] == "UNKNOWN-7"  # a label value has no parentheses
    assert slices.tainted(list(published.values())) == 2
    node.set_status("rbln0", 0)
    feed(state, node, seq=3)
    assert "taints" not in {d["name"]: d for d in slices.published_devices(state.current(), effect)}["rbln0"]


def test_without_taints_an_unhealthy_device_leaves_the_pool_and_comes_back_when_it_recovers(tmp_path):
    node = simulated_node(tmp_path)
    state = InventoryState()
    feed(state, node)
    node.set_status("rbln0", 4)
    feed(state, node, seq=2)
    assert "rbln0" not in [d["name"] for d in slices.published_devices(state.current(), None)]
    node.set_status("rbln0", 0)
    feed(state, node, seq=3)
    assert "rbln0" in [d["name"] for d in slices.published_devices(state.current(), None)]


def test_a_taint_keeps_the_time_the_server_gave_it_and_a_dropped_taint_is_noticed():
    taint = {"key": slices.UNHEALTHY_TAINT_KEY, "value": "FAULT", "effect": "NoSchedule"}
    spec = slices.slice_specs(NODE, [{"name": "rbln0", "taints": [taint]}, {"name": "rbln1"}], 1, 64)[0]
    stored = {**spec, "devices": [{"name": "rbln0", "taints": [{**taint, "timeAdded": "2026-12-06T19:00:00Z"}]},
                                  {"name": "rbln1"}]}
    assert slices.content(stored) == slices.content(spec)
    assert slices.keep_time_added(spec, stored)["devices"] == stored["devices"]
    moved_on = {**taint, "value": "BUSY"}
    assert slices.keep_time_added({**spec, "devices": [{"name": "rbln0", "taints": [moved_on]}]}, stored)[
        "devices"] == [{"name": "rbln0", "taints": [moved_on]}]  # another status: a new taint, a new time
    assert not slices.taints_dropped(spec, stored)
    assert slices.taints_dropped(spec, {**spec, "devices": [{"name": "rbln0"}, {"name": "rbln1"}]})


def test_content_ignores_the_generation_only():
    spec = slices.slice_specs(NODE, [{"name": "rbln0"}], 1, 64)[0]
    assert slices.content(spec) == slices.content(slices.slice_specs(NODE, [{"name": "rbln0"}], 9, 64)[0])
    assert slices.content(spec) != slices.content(slices.slice_specs(NODE, [{"name": "rbln1"}], 1, 64)[0])


def test_an_inventory_before_every_resource_reported_is_incomplete():
    assert not NodeInventory({}, synced=frozenset({Resource.NPU})).complete


def test_what_the_api_server_would_refuse_the_whole_slice_for_is_left_out():
    long_product = _record("rbln0", product="RBLN-" + "X" * 70)
    attributes = slices.device_entry(ServedDevice(long_product, Resource.NPU, Health.HEALTHY), "")["attributes"]
    assert "productName" not in attributes
    assert [slices.publishable(name) for name in ("rbln0", "rbln0-3", "RBLN0", "rbln_0", "rbln.0", "x" * 64)] == [
        True, True, False, False, False, False]


def test_a_new_slice_s_name_is_shaped_as_the_api_server_generates_them():
    names = {slices.slice_name("n" * 80) for _ in range(50)}
    assert len(names) > 1, "drawn afresh for each slice"
    for name in names:
        assert len(name) == 63 and name.startswith("n" * 58)
        assert set(name[58:]) <= set("bcdfghjklmnpqrstvwxz2456789")
    assert slices.slice_name("node-a", draw=lambda alphabet: alphabet[0]) == "node-a-npu.rebellions.ai-bbbbb"
