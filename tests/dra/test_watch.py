"""What publishing costs the real API server and how it heals: one watch on the node's own slices and nothing
else at rest (the API server's own apiserver_request_total), a slice anyone deletes or edits repaired within a
second of the watch event, and an API server restart recovered."""

from __future__ import annotations

import time
import urllib.parse

from tests.support.node_state import process_pid
from tests.support.ports import connections_to
from tests.support.waiting import wait_until

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
AT_REST = 10.0


def _beyond_watch(counts: dict[str, float]) -> dict[str, float]:
    return {verb: n for verb, n in counts.items() if verb != "WATCH"}


def _timed_until(condition, timeout: float, what: str) -> float:
    started = time.monotonic()
    wait_until(condition, timeout, what, poll=0.02)
    return time.monotonic() - started


def test_at_rest_a_node_costs_the_api_server_its_watch_and_nothing_else(serve, cluster):
    serving = serve("2", {"rbln0", "rbln1"})
    serving.stack.wait_for_record("Published ResourceSlices")
    before = cluster.server.request_counts("resourceslices")
    # Several scans (500 ms each) with nothing to change; the old publisher listed the slices at each.
    wait_until(lambda: len(serving.stack.find("Reconciled device inventory")) >= 3 * 3, 30, "three scans")
    time.sleep(AT_REST)  # the quiet being measured: what would happen in it is what is counted
    after = cluster.server.request_counts("resourceslices")
    assert _beyond_watch(after) == _beyond_watch(before), f"requests at rest: {before} -> {after}"
    # The watch, the slice's write and the Node's read went over one connection (HTTP/2), as client-go's do.
    worker = process_pid(serving.node, "worker-dra")
    assert worker is not None
    assert connections_to(worker, urllib.parse.urlsplit(cluster.server.url).port or 0) == 1


def test_a_slice_deleted_or_edited_by_someone_else_is_repaired_within_a_second(serve, cluster):
    serving = serve("2", {"rbln0", "rbln1"})
    kubelet = serving.kubelet
    (published,) = kubelet.slices()
    name = published["metadata"]["name"]
    cluster.admin.delete("ResourceSlice", name)
    repaired = _timed_until(lambda: set(kubelet.published_devices()) == {"rbln0", "rbln1"}, 1.0,
                            "the deleted slice replaced within 1 s")

    (current,) = kubelet.slices()
    edited = {**current, "spec": {**current["spec"], "devices": current["spec"]["devices"][:1]}}
    answer = cluster.server.request("PUT", f"{SLICES}/{current['metadata']['name']}", body=edited)
    assert answer.status_code == 200, answer.text
    undone = _timed_until(lambda: set(kubelet.published_devices()) == {"rbln0", "rbln1"}, 1.0,
                          "the edit undone within 1 s")
    assert repaired < 1.0 and undone < 1.0
    assert not serving.stack.find("ResourceSlice watch ended; starting it afresh")


def test_an_api_server_restart_is_recovered_from_a_fresh_list(serve, cluster):
    serving = serve("2", {"rbln0", "rbln1"})
    kubelet, stack = serving.kubelet, serving.stack
    cluster.server.restart()
    stack.wait_for_record("ResourceSlice watch ended; starting it afresh", timeout=30)
    wait_until(kubelet.registered, 30, "the kubelet reaches the restarted API server")
    # The watch is back: a deletion after the restart is repaired as before.
    (published,) = kubelet.slices()
    cluster.admin.delete("ResourceSlice", published["metadata"]["name"])
    wait_until(lambda: set(kubelet.published_devices()) == {"rbln0", "rbln1"}, 10, "the slice repaired")
    assert not stack.find("ResourceSlice publish failed; retrying")
