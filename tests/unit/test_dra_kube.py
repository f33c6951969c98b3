"""worker-dra's API client against a loopback stand-in of the endpoints it calls, over HTTP/2 as a real API server
is spoken to: the paths, the field selector, the kubeconfig's credentials, which failures are retried, one
connection for the watch and the calls, and what a connection that goes silent or is sent away does."""

from __future__ import annotations

import base64
import json
import time

import pytest

from dra_worker.api_credentials import ConfigError
from dra_worker.kube import ApiFailure, KubeApi
from dra_worker.publisher import SlicePublisher
from shared.kubeapi.protobuf import EncodeError
from simulator.kube_api import FakeKubeApi
from tests.support.certificates import self_signed
from tests.support.dra import NODE, claim, feed, simulated_node


@pytest.fixture
def server():
    api = FakeKubeApi().start()
    api.nodes[NODE] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}}
    yield api
    api.stop()


class FakeTime:
    """A clock that the client's own pauses move, and nothing else."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


@pytest.fixture
def clock():
    return FakeTime()


@pytest.fixture
def client(server, tmp_path, clock):
    api = KubeApi(server.kubeconfig(tmp_path / "kubeconfig"), sleep=clock.sleep, clock=lambda: clock.now)
    api.pauses = clock.pauses  # type: ignore[attr-defined]
    return api


def test_a_claim_is_read_from_its_namespace(server, client):
    body = claim("uid-1", ["rbln0"], name="c1", namespace="team-a")
    server.claims[("team-a", "c1")] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                       **body, "spec": {"devices": {}}}
    got = client.get_claim("team-a", "c1", timeout=5)
    assert got["metadata"]["uid"] == "uid-1"
    assert got["status"]["allocation"]["devices"]["results"][0]["device"] == "rbln0"
    assert server.requests[-1] == ("GET", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/c1")


def test_a_refusal_is_not_retried_and_a_passing_failure_is(server, client):
    with pytest.raises(ApiFailure) as refused:
        client.get_claim("team-a", "missing", timeout=5)
    assert refused.value.status == 404 and client.pauses == []
    server.fail = [503, 503]
    assert client.node_uid(NODE, timeout=5) == "node-uid-1"
    assert client.pauses == [0.1, 0.2]


def test_retries_stop_at_the_deadline(server, client):
    server.fail = [503] * 100
    with pytest.raises(ApiFailure) as failure:
        client.node_uid(NODE, timeout=5)
    assert failure.value.status == 503
    assert client.pauses == [0.1, 0.2, 0.4, 0.8, 1.6] and sum(client.pauses) <= 5, "the next pause would pass it"


def test_an_unreachable_server_is_a_failure_not_a_crash(tmp_path):
    api = FakeKubeApi()
    config = api.kubeconfig(tmp_path / "kubeconfig")
    api.close()  # its port is closed: connections are refused
    clock = FakeTime()
    client = KubeApi(config, sleep=clock.sleep, clock=lambda: clock.now)
    with pytest.raises(ApiFailure) as failure:
        client.node_uid(NODE, timeout=0.2)
    assert failure.value.status is None


def test_the_publisher_through_the_client_keeps_the_server_s_slices(server, client, tmp_path):
    node = simulated_node(tmp_path)
    from dra_worker.inventory import InventoryState

    state = InventoryState()
    feed(state, node)
    publisher = SlicePublisher(client, NODE, state.current)
    publisher.view.replace(client.list_slices(NODE, timeout=5).items)
    assert publisher.reconcile_once() is True
    (published,) = server.slices.values()
    assert published["spec"]["nodeName"] == NODE and published["spec"]["pool"]["generation"] == 1
    assert published["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
    assert ("GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3Dnpu.rebellions.ai%2C"
                   "spec.nodeName%3Dnode-a") in server.requests
    names = {d["name"] for d in published["spec"]["devices"]}
    assert "rbln0" in names


def test_the_watch_names_the_node_s_slices_and_the_version_and_deletes_carry_preconditions(server, client):
    server.put_slice({"metadata": {"name": "s1", "uid": "uid-s1"}, "spec": {"driver": "npu.rebellions.ai",
                                                                         "nodeName": NODE, "devices": []}})
    listing = client.list_slices(NODE, timeout=5)
    events = client.watch_slices(NODE, listing.resource_version, server_timeout=30)
    server.put_slice({**server.slices["s1"]})
    kind, item = next(events)
    assert kind == "MODIFIED" and item["metadata"]["resourceVersion"] == server.slices["s1"]["metadata"][
        "resourceVersion"]
    assert any(method == "GET" and "watch=true" in path and "timeoutSeconds=30" in path
               and f"resourceVersion={listing.resource_version}" in path and "allowWatchBookmarks=true" in path
               and "fieldSelector=spec.driver%3Dnpu.rebellions.ai%2Cspec.nodeName%3Dnode-a" in path
               for method, path in server.requests)
    with pytest.raises(ApiFailure, match="409"):
        client.delete_slice(listing.items[0], timeout=5)  # changed since it was listed
    client.delete_slice(item, timeout=5)
    client.delete_slice(item, timeout=5)  # gone already: what was wanted
    assert "s1" not in server.slices
    server.end_watches()


def test_the_watch_and_the_calls_share_one_connection(server, client):
    events = client.watch_list_slices(NODE, server_timeout=30)
    assert next(events)[0] == "SYNCED"
    created = client.create_slice(_new_slice("s-one"), timeout=5)
    assert next(events) == ("ADDED", created)
    assert client.node_uid(NODE, timeout=5) == "node-uid-1"
    assert server.connections == 1
    server.end_watches()


def test_a_connection_that_goes_silent_is_pinged_and_given_up(server, tmp_path, monkeypatch):
    """A peer gone without a word (here: a stand-in that answers nothing, not even a PING) is given up after
    PING_AFTER + PING_TIMEOUT: the watch tries to resume on a new connection, which the silent server does not
    answer either, and ends; calls go on once the server answers again."""
    monkeypatch.setattr("dra_worker.http2_client.PING_AFTER", 0.3)
    monkeypatch.setattr("dra_worker.http2_client.PING_TIMEOUT", 0.3)
    client = KubeApi(server.kubeconfig(tmp_path / "kubeconfig"), request_timeout=0.5)
    events = client.watch_list_slices(NODE, server_timeout=30)
    assert next(events)[0] == "SYNCED"
    server.unresponsive = True
    with pytest.raises(ApiFailure, match=r"no answer in 0\.5 s") as lost:
        next(events)
    assert lost.value.status is None and server.connections == 2
    server.unresponsive = False
    assert client.node_uid(NODE, timeout=5) == "node-uid-1"
    assert server.connections == 3, "the second connection, silent for good, was pinged and given up too"


def test_a_call_s_timeout_bounds_its_request_too(server, tmp_path):
    """An unanswered request is given up when the call's time is up, not after the client's longer request
    timeout."""
    client = KubeApi(server.kubeconfig(tmp_path / "kubeconfig"), request_timeout=30)
    assert client.node_uid(NODE, timeout=5) == "node-uid-1"
    server.unresponsive = True  # the connection in use answers nothing from now on
    began = time.monotonic()
    with pytest.raises(ApiFailure, match="no answer in"):
        client.node_uid(NODE, timeout=0.5)
    assert time.monotonic() - began < 5


def test_a_watch_sent_away_resumes_from_its_last_version_on_a_new_connection(server, client):
    """A GOAWAY (an API server shutting down, or its --goaway-chance rebalancing clients) ends the connection;
    the watch goes on from the last version it saw, so no change in between is missed and nothing is listed."""
    listing = client.list_slices(NODE, timeout=5)
    events = client.watch_slices(NODE, listing.resource_version, server_timeout=30)
    first = server.put_slice(_new_slice("s-before"))
    assert next(events) == ("ADDED", first)
    server.goaway()
    second = server.put_slice(_new_slice("s-after"))
    assert next(events) == ("ADDED", second)
    resumed = [path for method, path in server.requests if "watch=true" in path][-1]
    assert f"resourceVersion={first['metadata']['resourceVersion']}" in resumed
    assert server.connections == 2
    server.end_watches()


def test_an_answer_over_the_bound_is_given_up_and_the_connection_serves_on(server, client, monkeypatch):
    monkeypatch.setattr("dra_worker.http2_client.MAX_BODY", 1000)
    for index in range(6):
        server.put_slice(_new_slice(f"s-{index}"))
    with pytest.raises(ApiFailure, match="passed 1000 bytes unread"):
        client.list_slices(NODE, timeout=0.5)
    assert client.node_uid(NODE, timeout=5) == "node-uid-1"
    assert server.connections == 1


def _new_slice(name: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "npu.rebellions.ai", "nodeName": NODE,
                     "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}, "devices": []}}


def test_claims_pass_through_whole_fields_the_client_does_not_know(server, client):
    """A newer API server's fields (here made up) are neither dropped nor renamed on the way in: claims are JSON."""
    body = claim("uid-2", ["rbln1"], name="c2", namespace="team-b")
    body["status"]["futureStatus"] = {"someCamelCase": [1, 2]}
    server.claims[("team-b", "c2")] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                       **body, "spec": {"devices": {}, "futureSpec": True}}
    got = client.get_claim("team-b", "c2", timeout=5)
    assert got["status"]["futureStatus"] == {"someCamelCase": [1, 2]} and got["spec"]["futureSpec"] is True


def test_a_slice_field_the_protobuf_schema_lacks_is_refused_by_name_before_anything_is_sent(server, client):
    """Slices travel in protobuf, whose schema is this client's: a field it lacks cannot be sent, and is said."""
    body = _new_slice("node-a-slice")
    sent = len(server.requests)
    with pytest.raises(EncodeError, match=r"ResourceSlice\.spec: ResourceSliceSpec has no field 'futureField'"):
        client.create_slice({**body, "spec": {**body["spec"], "futureField": "x"}}, timeout=5)
    assert len(server.requests) == sent and server.slices == {}


def test_a_server_that_refuses_protobuf_is_written_json_from_then_on(server, client):
    server.protobuf = False
    client.create_slice(_new_slice("node-a-slice"), timeout=5)
    client.create_slice(_new_slice("node-a-other"), timeout=5)
    writes = [m for m, p in server.requests if p.startswith("/apis/resource.k8s.io/v1/resourceslices")]
    assert writes == ["POST", "POST", "POST"], "one refused protobuf create, then JSON only"
    assert sorted(server.slices) == ["node-a-other", "node-a-slice"]


def test_the_server_is_verified_against_the_kubeconfig_s_certificate_authority(tmp_path):
    """As a real API server is reached: HTTPS, its certificate checked against the cluster's CA and nothing else
    (not the system's); another CA's server is a failure, not a crash; a kubeconfig naming no CA is refused
    before anything is sent."""
    api = FakeKubeApi(tls=self_signed(tmp_path, "127.0.0.1")).start()
    api.nodes[NODE] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-tls"}}
    try:
        config = api.kubeconfig(tmp_path / "kubeconfig")
        assert api.url.startswith("https://")
        assert KubeApi(config).node_uid(NODE, timeout=5) == "node-uid-tls"
        document = json.loads(config.read_text())
        (tmp_path / "other").mkdir()
        _, other_ca = self_signed(tmp_path / "other", "127.0.0.1")
        document["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(
            other_ca.read_bytes()).decode()
        config.write_text(json.dumps(document))
        with pytest.raises(ApiFailure, match="CERTIFICATE_VERIFY_FAILED") as refused:
            KubeApi(config).node_uid(NODE, timeout=0.2)
        assert refused.value.status is None
        del document["clusters"][0]["cluster"]["certificate-authority-data"]
        config.write_text(json.dumps(document))
        with pytest.raises(ConfigError, match="names no certificate-authority"):
            KubeApi(config)
    finally:
        api.stop()


def test_a_claim_s_device_status_is_applied_to_the_status_subresource_with_the_claim_s_uid(tmp_path):
    server = FakeKubeApi().start()
    try:
        server.claims[("team-c", "c3")] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                           "metadata": {"name": "c3", "namespace": "team-c", "uid": "u3"}}
        client = KubeApi(server.kubeconfig(tmp_path / "kubeconfig"))
        entry = {"driver": "npu.rebellions.ai", "pool": NODE, "device": "rbln0", "data": {"health": "Healthy"}}
        client.apply_claim_status("team-c", "c3", "u3", [entry], timeout=5)
        assert server.claims[("team-c", "c3")]["status"]["devices"] == [entry]
        assert server.requests[-1][0] == "PATCH"
        assert server.requests[-1][1].startswith("/apis/resource.k8s.io/v1/namespaces/team-c/resourceclaims/c3/status")
        assert "fieldManager=npu.rebellions.ai" in server.requests[-1][1]
        with pytest.raises(ApiFailure):
            client.apply_claim_status("team-c", "c3", "replaced", [entry], timeout=5)
    finally:
        server.stop()


def test_a_create_whose_answer_was_lost_is_retried_and_finds_its_slice_instead_of_making_a_second(server, client):
    server.lose_answers = 1  # carried out, the connection closed before the answer
    created = client.create_slice(_new_slice("node-a-npu.rebellions.ai-x2b4c"), timeout=5)
    assert list(server.slices) == ["node-a-npu.rebellions.ai-x2b4c"]
    assert created["metadata"]["uid"] == server.slices["node-a-npu.rebellions.ai-x2b4c"]["metadata"]["uid"]
    assert [method for method, _ in server.requests] == ["POST", "POST", "GET"]


def test_a_name_taken_at_the_first_try_is_another_s_slice_and_a_conflict(server, client):
    client.create_slice(_new_slice("taken"), timeout=5)
    with pytest.raises(ApiFailure) as refused:
        client.create_slice(_new_slice("taken"), timeout=5)
    assert refused.value.status == 409
