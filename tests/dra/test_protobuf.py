"""The project's protobuf schema of ResourceSlices (protos/resource/v1) against the real kube-apiserver: what is
written in protobuf reads back in JSON field for field, and what the server answers in protobuf (an object, a
list, a watch's events, a refusal) decodes to the JSON the server would have sent."""

from __future__ import annotations

import pytest

from shared.config import DRA_DRIVER
from shared.kubeapi import protobuf

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODE = "protobuf-node"
PROTOBUF = {"content-type": protobuf.MEDIA_TYPE, "accept": protobuf.MEDIA_TYPE}


def _slice(name: str) -> dict:
    """Every field worker-dra writes, and their value kinds: each kind of attribute, a quantity, a taint with
    its time."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "labels": {"team": "a"}, "annotations": {"note": "protobuf"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                              "uid": "5b1c3e0a-0000-4000-8000-000000000001", "controller": True}]},
            "spec": {"driver": DRA_DRIVER, "nodeName": NODE,
                     "pool": {"name": NODE, "generation": 3, "resourceSliceCount": 1},
                     "devices": [{"name": "rbln0",
                                  "attributes": {"type": {"string": "npu"}, "numaNode": {"int": 1},
                                                 "sriov": {"bool": True}, "firmware": {"version": "1.2.3"}},
                                  "capacity": {"memory": {"value": "16Gi"}},
                                  "taints": [{"key": f"{DRA_DRIVER}/unhealthy", "value": "FAULT",
                                              "effect": "NoSchedule", "timeAdded": "2026-01-02T03:04:05Z"}]},
                                 {"name": "rbln1", "attributes": {"type": {"string": "npu"}}}]}}


def _without_managed_fields(obj: dict) -> dict:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}


@pytest.fixture
def admin(cluster):
    with cluster.server.client() as client:
        yield client
        client.delete(SLICES, params={"fieldSelector": f"spec.nodeName={NODE}"})


def test_a_slice_written_in_protobuf_reads_back_in_json_field_for_field(admin):
    sent = _slice("protobuf-written")
    answer = admin.post(SLICES, content=protobuf.encode(sent), headers=PROTOBUF)
    assert answer.status_code == 201, answer.content[:300]
    assert answer.headers["content-type"] == protobuf.MEDIA_TYPE
    created = protobuf.decode(answer.content)
    stored = admin.get(f"{SLICES}/protobuf-written").json()
    assert stored["spec"] == sent["spec"]
    for key in ("labels", "annotations", "ownerReferences"):
        assert stored["metadata"][key] == sent["metadata"][key]
    # ObjectMeta's fields the server always sets in protobuf (empty strings, a zero generation) JSON leaves out
    decoded_meta = {k: v for k, v in created["metadata"].items() if v not in ("", 0)}
    assert {**created, "metadata": decoded_meta} == _without_managed_fields(stored)


def test_a_list_a_watch_and_a_refusal_in_protobuf_decode_as_their_json(admin):
    created = protobuf.decode(admin.post(SLICES, content=protobuf.encode(_slice("protobuf-watched")),
                                         headers=PROTOBUF).content)
    listing = admin.get(SLICES, params={"fieldSelector": f"spec.nodeName={NODE}"}, headers=PROTOBUF)
    listed = protobuf.decode(listing.content)
    assert listed["kind"] == "ResourceSliceList" and listed["items"] == [
        {k: v for k, v in created.items() if k not in ("apiVersion", "kind")}]

    changed = {**created, "spec": {**created["spec"], "devices": created["spec"]["devices"][:1]}}
    version = listed["metadata"]["resourceVersion"]
    events = []
    with admin.stream("GET", SLICES, headers=PROTOBUF, params={
            "fieldSelector": f"spec.nodeName={NODE}", "watch": "true", "resourceVersion": version,
            "timeoutSeconds": "5"}) as watch:
        assert watch.headers["content-type"] == f"{protobuf.MEDIA_TYPE};stream=watch"
        updated = admin.put(f"{SLICES}/protobuf-watched", content=protobuf.encode(changed), headers=PROTOBUF)
        assert updated.status_code == 200, updated.content[:300]
        stream = protobuf.WatchStream()
        for chunk in watch.iter_raw():
            events += stream.feed(chunk)
            if events:
                break
    ((kind, item),) = events
    assert kind == "MODIFIED" and item == protobuf.decode(updated.content)
    assert [d["name"] for d in item["spec"]["devices"]] == ["rbln0"]

    stale = admin.put(f"{SLICES}/protobuf-watched", content=protobuf.encode(changed), headers=PROTOBUF)
    refusal = protobuf.decode(stale.content)
    assert stale.status_code == 409
    assert (refusal["kind"], refusal["code"], refusal["reason"]) == ("Status", 409, "Conflict")
