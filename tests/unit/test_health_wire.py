"""The health service's hand-made protobuf and gRPC framing, held to what protobuf itself encodes and decodes."""

from __future__ import annotations

import pytest
from grpc_health.v1 import health_pb2
from hypothesis import given
from hypothesis import strategies as st

from kubelet_watchdog.health_wire import (
    MalformedMessage,
    ServingStatus,
    frame,
    requested_service,
    status_response,
    unframe,
)


@given(st.text(max_size=300))
def test_the_service_name_is_read_as_protobuf_writes_it(service):
    assert requested_service(health_pb2.HealthCheckRequest(service=service).SerializeToString()) == service


@given(st.lists(st.tuples(st.integers(2, 2**29 - 1), st.sampled_from(["varint", "fixed64", "fixed32", "bytes"]),
                          st.integers(0, 2**64 - 1)), max_size=6), st.lists(st.text(max_size=20), max_size=3))
def test_unknown_fields_are_skipped_and_the_last_service_wins(unknown, services):
    """Built with protobuf's own unknown-field handling: a newer client's fields never break a probe."""
    message = b""
    for number, kind, value in unknown:
        key = {"varint": 0, "fixed64": 1, "bytes": 2, "fixed32": 5}[kind] | number << 3
        if kind == "varint":
            body = _varint(value)
        elif kind == "fixed64":
            body = value.to_bytes(8, "little")
        elif kind == "fixed32":
            body = (value % 2**32).to_bytes(4, "little")
        else:
            payload = value.to_bytes(8, "little")
            body = _varint(len(payload)) + payload
        message += _varint(key) + body
    for service in services:
        message += health_pb2.HealthCheckRequest(service=service).SerializeToString() or b"\x0a\x00"
    assert requested_service(message) == health_pb2.HealthCheckRequest.FromString(message).service


@given(st.binary(max_size=64))
def test_any_bytes_give_a_name_or_a_clear_refusal(data):
    try:
        requested_service(data)
    except MalformedMessage as exc:
        assert str(exc).startswith("the request")


@pytest.mark.parametrize("status", list(ServingStatus))
def test_the_status_is_what_protobuf_reads(status):
    assert health_pb2.HealthCheckResponse.FromString(status_response(status)).status == status.value


@pytest.mark.parametrize(("message", "why"), [
    (b"\x0a", "ends inside a varint"),
    (b"\x0a\x05ab", "ends inside a field"),
    (b"\x0a" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
    (b"\x0b", "wire type 3"),
    (b"\x02\x00", "numbered 0"),
    (b"\x0a\x02\xff\xfe", "not UTF-8"),
])
def test_a_malformed_request_says_what_is_wrong(message, why):
    with pytest.raises(MalformedMessage, match=why):
        requested_service(message)


def test_a_unary_body_is_exactly_one_uncompressed_message():
    message = health_pb2.HealthCheckRequest(service="liveness").SerializeToString()
    assert unframe(frame(message)) == message
    with pytest.raises(MalformedMessage, match="compressed"):
        unframe(b"\x01" + frame(message)[1:])
    with pytest.raises(MalformedMessage, match="exactly one message"):
        unframe(frame(message) + frame(message))
    with pytest.raises(MalformedMessage, match="less than a message frame's header"):
        unframe(b"\x00\x00")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))
