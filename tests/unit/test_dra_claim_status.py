"""A prepared claim's status.devices: what each entry says, and that a failure to write it costs the status only."""

from __future__ import annotations

from loguru import logger

from dra_worker.claim_status import STATUS_WRITE_TIMEOUT, ClaimStatusWriter, device_statuses
from dra_worker.inventory import InventoryState
from dra_worker.kube import ApiFailure
from tests.support.dra import NODE, feed, simulated_node


def test_each_entry_names_the_driver_pool_device_and_the_bus_id_rsd_group_and_health(tmp_path):
    node = simulated_node(tmp_path)
    state = InventoryState()
    node.set_status("rbln1", 4)
    feed(state, node)
    entries = device_statuses(NODE, ["rbln0", "rbln1"], 3, state.current())
    bus = {d.device: d.bus_id.lower() for d in node.inventory}
    assert entries == [
        {"driver": "npu.rebellions.ai", "pool": NODE, "device": "rbln0",
         "data": {"rsdGroup": "/dev/rsd3", "pciBusID": bus["rbln0"], "health": "Healthy"}},
        {"driver": "npu.rebellions.ai", "pool": NODE, "device": "rbln1",
         "data": {"rsdGroup": "/dev/rsd3", "pciBusID": bus["rbln1"], "health": "Unhealthy", "status": "FAULT"}}]
    assert device_statuses(NODE, ["rbln0"], None, state.current())[0]["data"]["rsdGroup"] is None  # admin access


class Api:
    def __init__(self, failure: Exception | None = None):
        self.calls: list[tuple] = []
        self.failure = failure

    def apply_claim_status(self, namespace, name, uid, devices, timeout):
        self.calls.append((namespace, name, uid, [d["device"] for d in devices], timeout))
        if self.failure is not None:
            raise self.failure


def test_a_failed_write_is_one_warning_and_never_raises(tmp_path):
    node = simulated_node(tmp_path)
    state = InventoryState()
    feed(state, node)
    records: list[dict] = []
    sink = logger.add(lambda message: records.append(message.record), level="WARNING")
    try:
        api = Api(ApiFailure("apply the status of ResourceClaim a/b: 403 Forbidden: no", 403))
        ClaimStatusWriter(api, NODE, state.current).write("a", "b", "u1", ["rbln0"], 2)
        broken = Api(KeyError("unforeseen"))
        ClaimStatusWriter(broken, NODE, state.current).write("a", "b", "u1", ["rbln0"], 2)
    finally:
        logger.remove(sink)
    assert api.calls == [("a", "b", "u1", ["rbln0"], STATUS_WRITE_TIMEOUT)]
    assert [(r["message"], r["extra"]["claimUID"]) for r in records] == [
        ("Cannot write the claim's device status; the claim stays prepared", "u1")] * 2
    assert "403 Forbidden" in records[0]["extra"]["err"]
