"""The slice publisher keeps the API server's slices equal to the inventory, whatever happens to either, through
worker-dra's own client against the loopback stand-in of the API server (simulator/kube_api.py): one watch,
writes only when what is wanted differs from what the watch shows, with preconditions."""

from __future__ import annotations

import pytest
from loguru import logger

from dra_worker.inventory import InventoryState
from dra_worker.kube import ApiFailure, KubeApi
from dra_worker.publisher import DELETED_KEPT, SlicePublisher, SliceView
from shared.config import DRA_DRIVER
from simulator.kube_api import FakeKubeApi
from tests.support.dra import NODE, feed, simulated_node
from tests.support.waiting import wait_until

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture
def server():
    api = FakeKubeApi().start()
    api.nodes[NODE] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": f"uid-of-{NODE}"}}
    yield api
    api.stop()


@pytest.fixture
def setup(tmp_path, server):
    node = simulated_node(tmp_path)
    state = InventoryState()
    client = KubeApi(server.kubeconfig(tmp_path / "kubeconfig"))
    return node, state, client, SlicePublisher(client, NODE, state.current, draw=lambda: 0.0)


def _writes(server) -> list[tuple[str, str]]:
    return [(method, path.split("?")[0]) for method, path in server.requests if method in ("POST", "PUT", "DELETE")]


def _devices(server) -> list[str]:
    return sorted(d["name"] for s in server.slices.values() for d in s["spec"]["devices"])


def _generations(server) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in server.slices.values()}


def _listed(publisher, client) -> None:
    """The view as the watcher fills it at start."""
    publisher.view.replace(client.list_slices(NODE, 5).items)


def test_nothing_is_published_before_every_resource_reported_or_before_the_first_list(setup, server):
    node, state, client, publisher = setup
    _listed(publisher, client)
    assert publisher.reconcile_once() is False
    feed(state, node)
    unlisted = SlicePublisher(client, NODE, state.current)
    assert unlisted.reconcile_once() is False and _writes(server) == []


def test_the_pool_is_published_once_and_left_alone_while_nothing_changes(setup, server):
    node, state, client, publisher = setup
    _listed(publisher, client)
    feed(state, node)
    assert publisher.reconcile_once() is True
    (only,) = server.slices.values()
    assert only["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                    "uid": f"uid-of-{NODE}", "controller": True}]
    assert only["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    requests = list(server.requests)
    feed(state, node, seq=2)
    assert publisher.reconcile_once() is False and server.requests == requests, "no request at all"


def _taints(server) -> dict[str, list]:
    return {d["name"]: [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]
            for s in server.slices.values() for d in s["spec"]["devices"] if d.get("taints")}


def test_a_fault_taints_the_device_in_its_one_slice_and_keeps_the_pool_generation(setup, server):
    node, state, client, publisher = setup
    _listed(publisher, client)
    feed(state, node)
    publisher.reconcile_once()
    writes = len(_writes(server))
    node.set_status("rbln0", 4)
    feed(state, node, seq=2)
    assert publisher.reconcile_once() is True
    assert _taints(server) == {"rbln0": [{"key": "npu.rebellions.ai/unhealthy", "value": "FAULT",
                                          "effect": "NoSchedule"}]}
    assert "rbln0" in _devices(server) and _generations(server) == {1} and publisher.tainted == 1
    assert [method for method, _ in _writes(server)[writes:]] == ["PUT"]
    node.set_status("rbln0", 0)
    feed(state, node, seq=3)
    publisher.reconcile_once()
    assert _taints(server) == {} and _generations(server) == {1} and publisher.tainted == 0


def test_where_the_server_drops_taints_an_unhealthy_device_is_left_out_with_one_warning(setup, server):
    node, state, client, publisher = setup
    server.taints_off = True
    records: list[dict] = []
    sink = logger.add(lambda message: records.append(message.record), level="WARNING")
    try:
        _listed(publisher, client)
        feed(state, node)
        publisher.reconcile_once()
        node.set_status("rbln0", 4)
        feed(state, node, seq=2)
        assert publisher.reconcile_once() is True
        assert "rbln0" not in _devices(server) and publisher.tainted == 0
        node.set_status("rbln1", 4)
        feed(state, node, seq=3)
        publisher.reconcile_once()
        assert not {"rbln0", "rbln1"} & set(_devices(server))
        node.set_status("rbln0", 0)
        node.set_status("rbln1", 0)
        feed(state, node, seq=4)
        publisher.reconcile_once()
        assert {"rbln0", "rbln1"} <= set(_devices(server))
    finally:
        logger.remove(sink)
    assert [r["message"] for r in records] == [
        "API server drops device taints; Unhealthy devices are left out of the slices"]


def test_obsolete_slices_are_deleted_first_with_preconditions(setup, server):
    node, state, client, publisher = setup
    spare = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": "zz-stale", "uid": "uid-zz"},
             "spec": {"driver": DRA_DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 5}, "devices": []}}
    server.put_slice(spare)
    server.put_slice({**spare, "metadata": {"name": "aa-first", "uid": "uid-aa"}})
    _listed(publisher, client)
    server.put_slice({**server.slices["zz-stale"]})  # changed by someone since the watch showed it
    feed(state, node)
    with pytest.raises(ApiFailure, match="409"):
        publisher.reconcile_once()
    assert "zz-stale" in server.slices, "not deleted blindly"
    _listed(publisher, client)  # the watch shows the change
    assert publisher.reconcile_once() is True
    assert _writes(server)[-2:] == [("DELETE", f"{SLICES}/zz-stale"), ("PUT", f"{SLICES}/aa-first")]
    assert _generations(server) == {6}, "the generation goes past any the server had"


def test_the_threads_publish_repair_on_a_watch_event_and_ask_nothing_at_rest(setup, server):
    node, state, client, publisher = setup
    published = []
    publisher = SlicePublisher(client, NODE, state.current, on_publish=published.append, draw=lambda: 0.0)
    publisher.start()
    try:
        feed(state, node)
        publisher.wake()
        wait_until(lambda: _devices(server), 10, "the pool published")
        devices = _devices(server)
        at_rest = len(server.requests)
        for seq in range(2, 6):  # scans that change nothing
            feed(state, node, seq=seq)
        (name,) = server.slices
        server.remove_slice(name)  # the kubelet wiped it
        # The 1 s bound of a repair is shown on the real API server (tests/dra/test_watch.py), not timed here.
        wait_until(lambda: _devices(server) == devices, 10, "the pool repaired")
        (name,) = server.slices
        edited = server.slices[name]
        server.put_slice({**edited, "spec": {**edited["spec"], "devices": []}})  # someone edited it
        wait_until(lambda: _devices(server) == devices, 10, "the edit undone")
        # the server stores a write before it answers: the publisher's count follows the answer
        wait_until(lambda: published == [True, True, True], 10, "the three publishes counted")
        assert [(m, p.split("?")[0]) for m, p in server.requests[at_rest:]] == [
            ("GET", f"/api/v1/nodes/{NODE}"), ("POST", SLICES), ("PUT", f"{SLICES}/{name}")], \
            "only the two repairs (the re-creation asks for the node's UID), no list and no write at rest"
    finally:
        publisher.stop()


def test_a_slice_recreated_after_its_node_registered_again_is_owned_by_the_new_node(setup, server):
    """A Node deleted and registered again by its kubelet has a new UID; the garbage collector deletes the
    slices the old one owned, and the publisher's new ones must name the new UID, or they are collected too."""
    node, state, _client, publisher = setup
    publisher.start()
    try:
        feed(state, node)
        publisher.wake()
        wait_until(lambda: _devices(server), 10, "the pool published")
        server.nodes[NODE] = {**server.nodes[NODE], "metadata": {"name": NODE, "uid": "uid-registered-again"}}
        (name,) = server.slices
        server.remove_slice(name)  # the garbage collector: its owner is gone
        wait_until(lambda: server.slices, 10, "the pool published again")
        (again,) = server.slices.values()
        assert [owner["uid"] for owner in again["metadata"]["ownerReferences"]] == ["uid-registered-again"]
    finally:
        publisher.stop()


def _watch_lists(server) -> list[str]:
    return [p for m, p in server.requests if m == "GET" and p.startswith(SLICES) and "sendInitialEvents=true" in p]


def _lists(server) -> list[str]:
    return [p for m, p in server.requests if m == "GET" and p.startswith(SLICES) and "watch=true" not in p]


@pytest.mark.parametrize("watch_lists", [True, False])
def test_a_failed_watch_is_started_afresh_after_a_backoff_and_what_changed_meanwhile_repaired(
        setup, server, watch_lists):
    """With watch-lists the fresh start is one watch request; a server without them is listed, then watched."""
    node, state, client, _publisher = setup
    server.watch_lists = watch_lists
    restarts = []
    publisher = SlicePublisher(client, NODE, state.current, on_watch_restart=lambda: restarts.append(1),
                               draw=lambda: 0.0)
    feed(state, node)
    publisher.start()
    try:
        wait_until(lambda: _devices(server), 10, "the pool published")
        devices = _devices(server)
        starts = (len(_watch_lists(server)), len(_lists(server)))
        server.fail = [500]  # the resumed watch fails: the server restarted
        server.end_watches()
        (name,) = server.slices
        server.remove_slice(name)
        wait_until(lambda: restarts, 5, "the watch restart counted")
        wait_until(lambda: _devices(server) == devices, 5, "the pool repaired after the fresh list")
        if watch_lists:
            assert (len(_watch_lists(server)), len(_lists(server))) == (starts[0] + 1, 0), "no list request"
        else:
            assert (len(_watch_lists(server)), len(_lists(server))) == (1, starts[1] + 1), "one refused watch-list"
    finally:
        publisher.stop()


def test_an_api_failure_is_raised_to_the_loop_and_the_next_try_repairs(setup, server):
    node, state, client, publisher = setup
    _listed(publisher, client)
    feed(state, node)
    server.fail = [403]
    with pytest.raises(ApiFailure):
        publisher.reconcile_once()
    assert publisher.reconcile_once() is True and _devices(server)


def _slice(name: str, version: str) -> dict:
    return {"metadata": {"name": name, "resourceVersion": version}, "spec": {}}


def test_the_view_says_whether_an_event_changed_it_so_the_echo_of_an_own_write_wakes_nothing():
    view = SliceView()
    view.replace([])
    assert view.apply("MODIFIED", _slice("a", "10")) is True, "a write's answer: new to the view"
    assert view.apply("ADDED", _slice("a", "10")) is False, "the watch's echo of that write"
    assert view.apply("MODIFIED", _slice("a", "9")) is False, "an older state is ignored"
    assert view.apply("MODIFIED", _slice("a", "11")) is True, "another writer's edit"
    assert view.apply("DELETED", _slice("a", "12")) is True
    assert view.apply("DELETED", _slice("a", "12")) is False, "deleted already"
    assert view.snapshot() == []


def test_a_write_answered_after_the_watch_told_of_the_slice_deletion_does_not_bring_it_back():
    """The watch may show a new slice created and at once deleted (its node re-registered, the garbage
    collector) before the publisher has the create's answer in hand."""
    view = SliceView()
    view.replace([])
    assert view.apply("ADDED", _slice("a", "10")) is True
    assert view.apply("DELETED", _slice("a", "11")) is True
    assert view.apply("MODIFIED", _slice("a", "10")) is False, "the create's answer, late"
    assert view.snapshot() == []
    assert view.apply("ADDED", _slice("a", "12")) is True, "made again since"
    assert view.snapshot() == [_slice("a", "12")]


def test_the_view_remembers_only_the_latest_deletions():
    """A worker that runs for months deletes many slices, each of another name: the view keeps DELETED_KEPT."""
    view = SliceView()
    view.replace([])
    for number in range(DELETED_KEPT + 1):
        view.apply("DELETED", _slice(f"s{number}", str(10 + number)))
    assert view.apply("MODIFIED", _slice("s0", "5")) is True, "the oldest deletion let go"
    assert view.apply("MODIFIED", _slice("s1", "5")) is False, "a later one still kept"


def test_a_fresh_list_keeps_what_this_worker_wrote_after_the_version_it_was_listed_at():
    view = SliceView()
    view.replace([_slice("a", "5"), _slice("b", "6")])
    view.apply("MODIFIED", _slice("c", "12"))  # created while a new watch-list was being served
    view.apply("MODIFIED", _slice("a", "11"))  # updated meanwhile
    view.replace([_slice("a", "5"), _slice("b", "6")], listed_at="10")
    assert [(s["metadata"]["name"], s["metadata"]["resourceVersion"]) for s in view.snapshot()] == \
        [("a", "11"), ("b", "6"), ("c", "12")]
    view.replace([_slice("b", "13")], listed_at="13")  # a and c deleted since: the list is the truth
    assert [s["metadata"]["name"] for s in view.snapshot()] == ["b"]
    view.apply("MODIFIED", _slice("d", "14"))
    view.replace([], listed_at="not a number")
    assert view.snapshot() == [], "versions that are not numbers: the list alone"
