"""The bytes of a `grpc.health.v1` Check: gRPC's length-prefixed message frame, the request's service name
and the response's status, as protobuf encodes them.

Two messages of one field each do not need the protobuf runtime, which would cost the watchdog 6 MiB of
resident memory for them (measured: `from grpc_health.v1 import health_pb2` in a bare interpreter). The
decoder follows protobuf's rules where a client may lean on them: fields it does not know are skipped, the
last occurrence of a field wins. Anything malformed raises MalformedMessage, naming what was wrong.
"""

from __future__ import annotations

import enum

# gRPC's message frame: a compressed flag (one byte) and the message's length (four, big-endian).
FRAME_HEADER_BYTES = 5
_SERVICE_FIELD = 1
_STATUS_FIELD = 1
_MAX_VARINT_BYTES = 10


class WireType(enum.IntEnum):
    VARINT = 0
    FIXED64 = 1
    LENGTH_DELIMITED = 2
    FIXED32 = 5


class ServingStatus(enum.IntEnum):
    """HealthCheckResponse.ServingStatus, as far as this service answers it."""

    SERVING = 1
    NOT_SERVING = 2


class MalformedMessage(ValueError):
    pass


def frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def unframe(body: bytes) -> bytes:
    """The one uncompressed message of a unary request's body."""
    if len(body) < FRAME_HEADER_BYTES:
        raise MalformedMessage(f"the request body has {len(body)} bytes, less than a message frame's header")
    if body[0] != 0:
        raise MalformedMessage("the request message is compressed; this service accepts none")
    length = int.from_bytes(body[1:FRAME_HEADER_BYTES], "big")
    if length != len(body) - FRAME_HEADER_BYTES:
        raise MalformedMessage(f"the request frame announces {length} bytes and carries "
                               f"{len(body) - FRAME_HEADER_BYTES}: a unary call takes exactly one message")
    return body[FRAME_HEADER_BYTES:]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for index in range(_MAX_VARINT_BYTES):
        if at + index >= len(data):
            raise MalformedMessage("the request message ends inside a varint")
        byte = data[at + index]
        value |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return value, at + index + 1
    raise MalformedMessage("the request message has a varint longer than 10 bytes")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _skip(data: bytes, at: int, wire_type: int) -> int:
    if wire_type == WireType.VARINT:
        return _varint(data, at)[1]
    sizes = {WireType.FIXED64: 8, WireType.FIXED32: 4}
    if wire_type in sizes:
        end = at + sizes[WireType(wire_type)]
    elif wire_type == WireType.LENGTH_DELIMITED:
        length, at = _varint(data, at)
        end = at + length
    else:
        raise MalformedMessage(f"the request message has a field of wire type {wire_type}, which proto3 lacks")
    if end > len(data):
        raise MalformedMessage("the request message ends inside a field")
    return end


def requested_service(message: bytes) -> str:
    """HealthCheckRequest.service ("" when absent)."""
    service = ""
    at = 0
    while at < len(message):
        key, at = _varint(message, at)
        field, wire_type = key >> 3, key & 0x7
        if field == 0:
            raise MalformedMessage("the request message has a field numbered 0")
        if field == _SERVICE_FIELD and wire_type == WireType.LENGTH_DELIMITED:
            length, start = _varint(message, at)
            at = _skip(message, at, wire_type)
            try:
                service = message[start:start + length].decode()
            except UnicodeDecodeError:
                raise MalformedMessage("the requested service name is not UTF-8") from None
        else:
            at = _skip(message, at, wire_type)
    return service


def status_response(status: ServingStatus) -> bytes:
    """HealthCheckResponse{status}."""
    return bytes([_STATUS_FIELD << 3 | WireType.VARINT]) + _encode_varint(status)
