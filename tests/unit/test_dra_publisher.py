"""The slice publisher keeps the API server's slices equal to the inventory, whatever happens to either."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from loguru import logger

from dra_worker.inventory import InventoryState
from dra_worker.kube import ApiFailure
from dra_worker.publisher import SlicePublisher
from shared.config import DRA_DRIVER
from tests.support.dra import NODE, feed, simulated_node


class SliceStore:
    """The API server's ResourceSlices, and every change made to them, in order."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.changes: list[tuple[str, str]] = []
        self.fail_next = 0
        self.failure: Exception = ApiFailure("503 ServiceUnavailable", 503)
        self._names = itertools.count()

    def _maybe_fail(self) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise self.failure

    def node_uid(self, node_name: str, timeout: float) -> str:
        return f"uid-of-{node_name}"

    def list_slices(self, node_name: str, timeout: float) -> list[dict[str, Any]]:
        self._maybe_fail()
        return [s for s in self.slices.values() if s["spec"]["nodeName"] == node_name
                and s["spec"]["driver"] == DRA_DRIVER]

    def create_slice(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._maybe_fail()
        name = body["metadata"]["generateName"] + str(next(self._names))
        self.slices[name] = {**body, "metadata": {**body["metadata"], "name": name}}
        self.changes.append(("create", name))
        return self.slices[name]

    def replace_slice(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._maybe_fail()
        self.slices[body["metadata"]["name"]] = body
        self.changes.append(("update", body["metadata"]["name"]))
        return body

    def delete_slice(self, name: str, timeout: float) -> None:
        self._maybe_fail()
        self.slices.pop(name, None)
        self.changes.append(("delete", name))

    def devices(self) -> list[str]:
        return sorted(d["name"] for s in self.slices.values() for d in s["spec"]["devices"])

    def generations(self) -> set[int]:
        return {s["spec"]["pool"]["generation"] for s in self.slices.values()}


@pytest.fixture
def setup(tmp_path):
    node = simulated_node(tmp_path)
    state = InventoryState()
    store = SliceStore()
    publisher = SlicePublisher(store, NODE, state.current, resync_period=3600)
    return node, state, store, publisher


def test_nothing_is_published_before_every_resource_reported(setup):
    _node, _state, store, publisher = setup
    assert publisher.reconcile_once() is False and store.changes == []


def test_the_pool_is_published_once_and_left_alone_while_nothing_changes(setup):
    node, state, store, publisher = setup
    feed(state, node)
    assert publisher.reconcile_once() is True
    (only,) = store.slices.values()
    assert only["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                    "uid": f"uid-of-{NODE}", "controller": True}]
    assert only["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    changes = list(store.changes)
    feed(state, node, seq=2)
    assert publisher.reconcile_once() is False and store.changes == changes


def _taints(store: SliceStore) -> dict[str, list]:
    return {d["name"]: d["taints"] for s in store.slices.values() for d in s["spec"]["devices"] if d.get("taints")}


def test_a_fault_taints_the_device_in_its_one_slice_and_keeps_the_pool_generation(setup):
    node, state, store, publisher = setup
    feed(state, node)
    publisher.reconcile_once()
    changes = len(store.changes)
    node.set_status("rbln0", 4)
    feed(state, node, seq=2)
    assert publisher.reconcile_once() is True
    assert _taints(store) == {"rbln0": [{"key": "npu.rebellions.ai/unhealthy", "value": "FAULT",
                                         "effect": "NoSchedule"}]}
    assert "rbln0" in store.devices() and store.generations() == {1} and publisher.tainted == 1
    assert [kind for kind, _ in store.changes[changes:]] == ["update"]
    node.set_status("rbln0", 0)
    feed(state, node, seq=3)
    publisher.reconcile_once()
    assert _taints(store) == {} and store.generations() == {1} and publisher.tainted == 0


def test_a_change_of_more_than_one_slice_bumps_the_pool_generation(setup):
    node, state, store, publisher = setup
    feed(state, node)
    publisher.reconcile_once()
    spare = {"metadata": {"name": "zz-second"}, "spec": {"driver": DRA_DRIVER, "nodeName": NODE,
                                                         "pool": {"name": NODE, "generation": 1}, "devices": []}}
    store.slices["zz-second"] = spare  # a pool of two slices now, one more than it counts
    feed(state, node, seq=2)
    publisher = SlicePublisher(store, NODE, state.current, resync_period=3600)
    assert publisher.reconcile_once() is True and store.generations() == {2}


class TaintDroppingStore(SliceStore):
    """An API server with DRADeviceTaints off: it stores slices without their devices' taints."""

    def _strip(self, body: dict[str, Any]) -> dict[str, Any]:
        devices = [{k: v for k, v in d.items() if k != "taints"} for d in body["spec"]["devices"]]
        return {**body, "spec": {**body["spec"], "devices": devices}}

    def create_slice(self, body, timeout):
        return super().create_slice(self._strip(body), timeout)

    def replace_slice(self, body, timeout):
        return super().replace_slice(self._strip(body), timeout)


def test_where_the_server_drops_taints_an_unhealthy_device_is_left_out_with_one_warning(tmp_path):
    records: list[dict] = []
    sink = logger.add(lambda message: records.append(message.record), level="WARNING")
    node = simulated_node(tmp_path)
    state = InventoryState()
    store = TaintDroppingStore()
    publisher = SlicePublisher(store, NODE, state.current, resync_period=3600)
    feed(state, node)
    publisher.reconcile_once()
    node.set_status("rbln0", 4)
    feed(state, node, seq=2)
    assert publisher.reconcile_once() is True
    assert "rbln0" not in store.devices() and publisher.tainted == 0
    node.set_status("rbln1", 4)
    feed(state, node, seq=3)
    publisher.reconcile_once()
    assert not {"rbln0", "rbln1"} & set(store.devices())
    node.set_status("rbln0", 0)
    node.set_status("rbln1", 0)
    feed(state, node, seq=4)
    publisher.reconcile_once()
    assert {"rbln0", "rbln1"} <= set(store.devices())
    logger.remove(sink)
    assert [r["message"] for r in records] == [
        "API server drops device taints; Unhealthy devices are left out of the slices"]


def test_slices_deleted_by_someone_come_back_at_the_next_resync(setup):
    node, state, store, _publisher = setup
    publisher = SlicePublisher(store, NODE, state.current, resync_period=0.0)
    feed(state, node)
    publisher.reconcile_once()
    devices = store.devices()
    store.slices.clear()  # the kubelet wiped them
    assert publisher.reconcile_once() is True
    assert store.devices() == devices and store.generations() == {2}


def test_obsolete_slices_are_deleted_before_anything_else(setup):
    node, state, store, publisher = setup
    feed(state, node)
    spare = {"metadata": {"name": "zz-stale"}, "spec": {"driver": DRA_DRIVER, "nodeName": NODE,
                                                        "pool": {"name": NODE, "generation": 5}, "devices": []}}
    store.slices["zz-stale"] = spare
    store.slices["aa-first"] = {**spare, "metadata": {"name": "aa-first"}}
    publisher.reconcile_once()
    assert store.changes[0] == ("delete", "zz-stale")
    assert store.changes[1] == ("update", "aa-first")
    assert store.generations() == {6}, "the generation goes past any the server had"


def test_an_api_failure_is_raised_to_the_loop_and_the_next_try_repairs(setup):
    node, state, store, publisher = setup
    feed(state, node)
    store.fail_next = 1
    with pytest.raises(ApiFailure):
        publisher.reconcile_once()
    assert publisher.reconcile_once() is True and store.devices()


# A KeyError stands for what no one foresaw (a listed slice of another shape): the thread must outlive it.
@pytest.mark.parametrize("failure", [ApiFailure("503 ServiceUnavailable", 503), KeyError("metadata")])
def test_the_thread_publishes_on_wake_and_retries_failures(setup, failure):
    node, state, store, _publisher = setup
    store.failure = failure
    outcomes: list[bool] = []
    published = threading.Event()

    def on_publish(ok: bool) -> None:
        outcomes.append(ok)
        if ok:
            published.set()

    publisher = SlicePublisher(store, NODE, state.current, resync_period=3600, on_publish=on_publish)
    store.fail_next = 1
    publisher.start()
    try:
        feed(state, node)
        publisher.wake()
        assert published.wait(10)
    finally:
        publisher.stop()
    assert outcomes == [False, True] and store.devices()
