"""ResourceSlices to and from the API server's protobuf encoding (shared/kubeapi/protobuf.py): every slice the
publisher can make comes back as the same JSON, a watch's events come out whole however its bytes are cut, and
what cannot be encoded or decoded is said by name. tests/dra/test_protobuf.py holds the schema to the real
kube-apiserver."""

from __future__ import annotations

import random
import struct

import pytest

from dra_worker import slices
from shared.config import TaintEffect
from shared.kubeapi import protobuf
from shared.kubeapi.resource.v1 import api_pb2
from simulator.spec import NodeSpec
from tests.support.dra import feed, simulated_node


def _published_slices(tmp_path, seed: int) -> list[dict]:
    """The slices worker-dra publishes for a node generated from `seed`, a few of its devices Unhealthy."""
    from dra_worker.inventory import InventoryState

    draw = random.Random(seed)
    shape = draw.choice(["8", "4:vf1,2", "2:vf4,2", "16", "1"])
    node = simulated_node(tmp_path / str(seed), NodeSpec.parse(shape, numa_nodes=draw.randint(1, 2),
                                                               switches=draw.randint(1, 4)))
    state = InventoryState()
    feed(state, node)
    devices = slices.published_devices(state.current(), TaintEffect.NO_SCHEDULE)
    for device in draw.sample(devices, k=min(len(devices), draw.randint(0, 3))):
        device["taints"] = [{"key": slices.UNHEALTHY_TAINT_KEY, "value": draw.choice(["FAULT", "UNKNOWN-7"]),
                             "effect": "NoSchedule", "timeAdded": f"2026-0{draw.randint(1, 9)}-1{draw.randint(0, 9)}"
                                                                  f"T0{draw.randint(0, 9)}:00:0{draw.randint(0, 9)}Z"}]
    specs = slices.slice_specs("node-a", devices, draw.randint(1, 2 ** 40), draw.choice([8, 64, 128]))
    return [slices.new_slice("node-a", "uid-1", spec, slices.slice_name("node-a")) for spec in specs]


@pytest.mark.parametrize("seed", range(8))
def test_every_slice_the_publisher_makes_comes_back_as_the_same_json(tmp_path, seed):
    for body in _published_slices(tmp_path, seed):
        encoded = protobuf.encode(body)
        assert encoded.startswith(protobuf.MAGIC)
        assert protobuf.decode(encoded) == body


def _event(kind: str, obj: dict) -> bytes:
    frame = api_pb2.WatchEvent(type=kind, object=api_pb2.RawExtension(raw=protobuf.encode(obj))).SerializeToString()
    return struct.pack(">I", len(frame)) + frame


def test_a_watch_s_events_come_out_whole_however_its_bytes_are_cut(tmp_path):
    bodies = _published_slices(tmp_path, 1)[:2]
    bookmark = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"resourceVersion": "42", "annotations": {"k8s.io/initial-events-end": "true"}}}
    data = b"".join([_event("ADDED", bodies[0]), _event("BOOKMARK", bookmark), _event("MODIFIED", bodies[-1])])
    wanted = [("ADDED", bodies[0]), ("BOOKMARK", bookmark), ("MODIFIED", bodies[-1])]
    draw = random.Random(7)
    for _ in range(20):
        stream, got, at = protobuf.WatchStream(), [], 0
        while at < len(data):
            step = draw.choice([1, 2, 3, 5, 100, 4096])
            got += stream.feed(data[at:at + step])
            at += step
        assert got == wanted


def test_an_error_event_carries_the_status():
    status = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 410, "reason": "Expired",
              "message": "too old resource version"}
    ((kind, item),) = protobuf.WatchStream().feed(_event("ERROR", status))
    assert (kind, item) == ("ERROR", status)


@pytest.mark.parametrize(("data", "said"), [
    (b'{"kind": "Status"}', "not an object in the protobuf encoding"),
    (protobuf.MAGIC + b"\xff\xff\xff", "a broken protobuf object"),
    (protobuf.MAGIC + api_pb2.Unknown(typeMeta=api_pb2.TypeMeta(apiVersion="v1", kind="Pod")).SerializeToString(),
     "an object of kind 'Pod' of 'v1', which this client does not read"),
    (protobuf.MAGIC + api_pb2.Unknown(typeMeta=api_pb2.TypeMeta(apiVersion="v1", kind="Status"),
                                      contentEncoding="gzip").SerializeToString(),
     "an object in the content encoding 'gzip'"),
])
def test_what_cannot_be_decoded_is_said(data, said):
    with pytest.raises(protobuf.DecodeError, match=said):
        protobuf.decode(data)


def test_a_watch_event_too_large_or_broken_is_refused():
    with pytest.raises(protobuf.DecodeError, match="a watch event of 4294967295 bytes"):
        list(protobuf.WatchStream().feed(b"\xff\xff\xff\xff"))
    with pytest.raises(protobuf.DecodeError, match="a broken watch event"):
        list(protobuf.WatchStream().feed(struct.pack(">I", 3) + b"\xff\xff\xff"))


def _slice(**spec) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "a"},
            "spec": {"driver": "d", **spec}}


@pytest.mark.parametrize(("obj", "said"), [
    ({"apiVersion": "v1", "kind": "Pod"}, "no protobuf message for kind 'Pod' of 'v1'"),
    (_slice(futureField=1), "ResourceSlice.spec: ResourceSliceSpec has no field 'futureField'"),
    (_slice(devices=[{"name": "x", "attributes": {"a": {"int": "seven"}}}]),
     r"ResourceSlice.spec.devices\[0\].attributes\['a'\].int: "),
    (_slice(devices=[{"name": "x", "taints": [{"key": "k", "timeAdded": "yesterday"}]}]),
     r"ResourceSlice.spec.devices\[0\].taints\[0\].timeAdded: 'yesterday' is not an RFC 3339 time"),
    (_slice(devices=[{"name": "x", "taints": [{"key": "k", "timeAdded": "2026-01-02T03:04:05"}]}]),
     "names no time zone"),
    (_slice(pool="p"), "ResourceSlice.spec.pool: an object is wanted, not str"),
])
def test_what_cannot_be_encoded_is_said_with_where_it_is(obj, said):
    with pytest.raises(protobuf.EncodeError, match=said):
        protobuf.encode(obj)


def test_managed_fields_and_nulls_are_left_to_the_server():
    """An update without managedFields keeps the server's; a JSON null is a field not given."""
    obj = _slice(nodeName=None)
    obj["metadata"]["managedFields"] = [{"manager": "someone", "operation": "Update"}]
    assert protobuf.decode(protobuf.encode(obj)) == {**_slice(), "metadata": {"name": "a"}}
