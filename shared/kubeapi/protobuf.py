"""ResourceSlices in the API server's protobuf encoding, to and from the JSON objects the rest of the project
handles (docs/dra.md#publishing-and-its-api-cost).

An object is the four bytes MAGIC, then an `Unknown` envelope naming its apiVersion and kind around the
object's own message; a watch in this encoding is a stream of events, each its length in four big-endian bytes
and a `WatchEvent` whose object is encoded as above. The messages (shared/kubeapi/resource/v1) carry the JSON
fields' names, so a conversion walks the message's fields: the two types that JSON writes as strings are the
only special cases (a Quantity as its string, a Time as RFC 3339 in seconds). A field the schema does not know
is dropped on the way in, and a key it does not know is refused on the way out (EncodeError).
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterator, Mapping
from typing import Any, TypeAlias

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError as _ProtobufDecodeError
from google.protobuf.message import Message

from shared.kubeapi.resource.v1 import api_pb2

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
_FRAME_LENGTH = struct.Struct(">I")
# The largest watch event taken: an object of the API server is at most 3 MiB in etcd (a ResourceSlice far less).
MAX_EVENT = 16 << 20
_KINDS: dict[tuple[str, str], type[Message]] = {
    ("resource.k8s.io/v1", "ResourceSlice"): api_pb2.ResourceSlice,
    ("resource.k8s.io/v1", "ResourceSliceList"): api_pb2.ResourceSliceList,
    ("v1", "Status"): api_pb2.Status,
}
# Kept by the server when an update leaves them out: dropped, not refused, when a JSON object is encoded.
_SERVER_KEPT = frozenset({"managedFields"})
_QUANTITY = api_pb2.Quantity.DESCRIPTOR
_TIME = api_pb2.Time.DESCRIPTOR

Json = dict[str, Any]


class DecodeError(ValueError):
    """The bytes are not an object or watch event of the kinds this module knows."""


class EncodeError(ValueError):
    """The JSON object has a key or a value its message cannot take; the message names which."""


def encode(obj: Mapping[str, Any]) -> bytes:
    """A JSON object of a kind this module knows (its apiVersion and kind say which), in the protobuf encoding."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    message_type = _KINDS.get((str(api_version), str(kind)))
    if message_type is None:
        raise EncodeError(f"no protobuf message for kind {kind!r} of {api_version!r}")
    message = message_type()
    _fill(message, {key: value for key, value in obj.items() if key not in ("apiVersion", "kind")}, str(kind))
    envelope = api_pb2.Unknown(typeMeta=api_pb2.TypeMeta(apiVersion=api_version, kind=kind),
                               raw=message.SerializeToString())
    return MAGIC + envelope.SerializeToString()


def decode(data: bytes) -> Json:
    """An object in the protobuf encoding as its JSON object (apiVersion and kind included)."""
    if not data.startswith(MAGIC):
        raise DecodeError(f"not an object in the protobuf encoding (it starts {data[:8]!r})")
    try:
        envelope = api_pb2.Unknown.FromString(data[len(MAGIC):])
        api_version, kind = envelope.typeMeta.apiVersion, envelope.typeMeta.kind
        message_type = _KINDS.get((api_version, kind))
        if message_type is None:
            raise DecodeError(f"an object of kind {kind!r} of {api_version!r}, which this client does not read")
        if envelope.contentEncoding:
            raise DecodeError(f"an object in the content encoding {envelope.contentEncoding!r}")
        message = message_type.FromString(envelope.raw)
    except _ProtobufDecodeError as exc:
        raise DecodeError(f"a broken protobuf object: {exc}") from None
    return {"apiVersion": api_version, "kind": kind, **_json(message)}


class WatchStream:
    """A protobuf watch's bytes, as they arrive, split into its events."""

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> Iterator[tuple[str, Json]]:
        """The events (their type and object) that `chunk` completes."""
        self._pending += chunk
        while len(self._pending) >= _FRAME_LENGTH.size:
            (length,) = _FRAME_LENGTH.unpack_from(self._pending)
            if length > MAX_EVENT:
                raise DecodeError(f"a watch event of {length} bytes (at most {MAX_EVENT} are taken)")
            end = _FRAME_LENGTH.size + length
            if len(self._pending) < end:
                return
            frame = bytes(self._pending[_FRAME_LENGTH.size:end])
            del self._pending[:end]
            try:
                event = api_pb2.WatchEvent.FromString(frame)
            except _ProtobufDecodeError as exc:
                raise DecodeError(f"a broken watch event: {exc}") from None
            yield event.type, decode(event.object.raw)


# -- message to JSON ------------------------------------------------------------------------------------------

# How each field converts, worked out once per field: (SCALAR | SCALARS | MAP | MAP_OF | MESSAGES | MESSAGE,
# the message type of its values or None).
SCALAR, SCALARS, MAP, MAP_OF, MESSAGES, MESSAGE = range(6)
_plans: dict[FieldDescriptor, tuple[int, Descriptor | None]] = {}


def _plan(field: FieldDescriptor) -> tuple[int, Descriptor | None]:
    plan = _plans.get(field)
    if plan is None:
        entry = field.message_type
        if entry is None:
            plan = (SCALARS if field.is_repeated else SCALAR, None)
        elif entry.GetOptions().map_entry:
            values = entry.fields_by_name["value"].message_type
            plan = (MAP, None) if values is None else (MAP_OF, values)
        else:
            plan = (MESSAGES if field.is_repeated else MESSAGE, entry)
        _plans[field] = plan
    return plan


def _json(message: Message) -> Json:
    out: Json = {}
    for field, value in message.ListFields():
        kind, _ = _plans.get(field) or _plan(field)
        if kind == SCALAR:
            out[field.name] = value
        elif kind == MAP_OF:
            # by key, not items(): a map of messages has a Python-level ItemsView (a tenth of the decoding)
            out[field.name] = {key: _value(value[key]) for key in value}
        elif kind == MESSAGE:
            out[field.name] = _value(value)
        elif kind == MESSAGES:
            out[field.name] = [_value(item) for item in value]
        else:
            out[field.name] = dict(value) if kind == MAP else list(value)
    return out


def _value(message: Message) -> Any:
    descriptor = message.DESCRIPTOR
    if descriptor is _QUANTITY:
        return message.string  # type: ignore[attr-defined]
    if descriptor is _TIME:
        moment = datetime.datetime.fromtimestamp(message.seconds, datetime.timezone.utc)  # type: ignore[attr-defined]
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return _json(message)


# -- JSON to message ------------------------------------------------------------------------------------------

_by_name: dict[Any, dict[str, tuple[int, Descriptor | None]]] = {}


def _fields(descriptor: Any) -> dict[str, tuple[int, Descriptor | None]]:
    """A message type's fields by name, each with its plan."""
    fields = _by_name.get(descriptor)
    if fields is None:
        fields = _by_name[descriptor] = {field.name: _plan(field) for field in descriptor.fields}
    return fields


# Where in the object a value is: the kind at the top, else (where its parent is, its field, its key or index
# or None): spelt out only for an error.
Where: TypeAlias = "str | tuple[Where, str, object]"


def _spelt(where: Where) -> str:
    if isinstance(where, str):
        return where
    parent, name, key = where
    return f"{_spelt(parent)}.{name}" if key is None else f"{_spelt(parent)}.{name}[{key!r}]"


def _fill(message: Message, obj: Mapping[str, Any], where: Where) -> None:
    if not isinstance(obj, dict | Mapping):  # dict first: the check against the ABC alone costs more
        raise EncodeError(f"{_spelt(where)}: an object is wanted, not {type(obj).__name__}")
    message.SetInParent()
    fields = _by_name.get(message.DESCRIPTOR) or _fields(message.DESCRIPTOR)
    for name, value in obj.items():
        plan = fields.get(name)
        if value is None or (plan is None and name in _SERVER_KEPT):
            continue
        if plan is None:
            raise EncodeError(f"{_spelt(where)}: {message.DESCRIPTOR.name} has no field {name!r}")
        kind, entry = plan
        try:
            if kind == SCALAR:
                setattr(message, name, value)
            elif kind == MAP_OF:
                target = getattr(message, name)
                for key, item in value.items():
                    _set(target[key], entry, item, where, name, key)
            elif kind == MESSAGE:
                _set(getattr(message, name), entry, value, where, name)
            elif kind == MESSAGES:
                target = getattr(message, name)
                for index, item in enumerate(value):
                    _set(target.add(), entry, item, where, name, index)
            elif kind == MAP:
                getattr(message, name).update(value)
            else:
                getattr(message, name).extend(value)
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, EncodeError):
                raise
            raise EncodeError(f"{_spelt((where, name, None))}: {exc}") from None


def _set(message: Message, descriptor: Descriptor | None, value: Any, where: Where, name: str,
         key: object = None) -> None:
    """Fill a message field of the object at `where` (its `name`, and the `key` or index within it)."""
    if descriptor is _QUANTITY:
        message.string = str(value)  # type: ignore[attr-defined]
    elif descriptor is _TIME:
        message.seconds = _seconds(value, _spelt((where, name, key)))  # type: ignore[attr-defined]
    else:
        _fill(message, value, (where, name, key))


def _seconds(value: Any, where: str) -> int:
    """An RFC 3339 time (as JSON writes a Time) as seconds since the epoch."""
    try:
        moment = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise EncodeError(f"{where}: {value!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise EncodeError(f"{where}: {value!r} names no time zone")
    return int(moment.timestamp())
