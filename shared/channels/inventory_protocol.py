"""The scanner -> worker protocol: per-resource inventory snapshots over ZeroMQ, msgpack-encoded.

Modelled on the ZeroMQ Guide's Clone pattern:
- the scanner PUBlishes `[topic, payload]` on every scan, one message per
  resource (the topic is the resource name); every message is the resource's
  full state and doubles as the heartbeat;
- a worker SUBscribes first, then asks the scanner's ROUTER for the current
  state (`[SNAPSHOT_REQUEST, topic]` -> `[SNAPSHOT_REPLY, payload]`), drops
  updates it already has, and resyncs on a sequence gap, a new epoch (the
  scanner restarted) or a missed heartbeat;
- sequence numbers are per resource and strictly increasing within an epoch.

Everything received is validated; a malformed message raises ProtocolError.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import msgpack

from shared.config import INVENTORY_SNAPSHOT_SOCKET, INVENTORY_UPDATES_SOCKET
from shared.node.device_record import BUS_ID_PATTERN, DeviceRecord, is_valid_device_id
from shared.node.driver_status import StatusReading
from shared.resources import Resource

# 2: every message carries whether the CDI annotation's device resolves (`cdi`).
# 3: the driver's version per message, each device's uuid, firmware, PCI device ID and memory (for DRA).
SCHEMA_VERSION = 3
SNAPSHOT_REQUEST = b"ICANHAZ?"
SNAPSHOT_REPLY = b"KTHXBAI"
# Far above a real node (a few hundred devices ~ 100 KiB) and far below harm.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_DEVICES = 4096


class ProtocolError(ValueError):
    """A message that does not follow the protocol; the receiver keeps its last good state."""


@dataclasses.dataclass(frozen=True)
class InventoryMessage:
    resource: Resource
    epoch: str
    seq: int
    scanned_at_ns: int
    devices: tuple[DeviceRecord, ...]
    discovery_error: str | None = None
    cdi_resolvable: bool = False
    """Whether a spec in the CDI spec dirs resolves the device the Allocate annotation names (the scan's check)."""
    driver_version: str = ""


def endpoints(run_dir: pathlib.Path) -> tuple[str, str]:
    """(updates PUB endpoint, snapshot ROUTER endpoint) inside the private run dir."""
    return f"ipc://{run_dir / INVENTORY_UPDATES_SOCKET}", f"ipc://{run_dir / INVENTORY_SNAPSHOT_SOCKET}"


def restrict_endpoint(endpoint: str) -> None:
    """Make an ipc socket file owner-only: ZeroMQ has no option for its mode, so chmod after bind."""
    os.chmod(endpoint.removeprefix("ipc://"), 0o600)


def topic(resource: Resource) -> bytes:
    # ZeroMQ subscriptions match prefixes: the terminator keeps `rebellions.ai/npu`
    # from also receiving `rebellions.ai/npu-vf4`.
    return resource.value.encode() + b";"


def _device_to_wire(device: DeviceRecord) -> dict[str, Any]:
    return {
        "id": device.device_id,
        "npu": device.npu,
        "bus": device.bus_id,
        "product": device.product,
        "sid": device.sid,
        "numa": device.numa_node,
        "parent": device.parent_pf,
        "path": list(device.pci_path) if device.pci_path is not None else None,
        "status": device.status.code,
        "at": device.observed_at_ns,
        "uuid": device.uuid,
        "fw": device.firmware_version,
        "pciid": device.pci_device_id,
        "mem": device.memory_bytes,
    }


def encode(message: InventoryMessage) -> bytes:
    return msgpack.packb({
        "v": SCHEMA_VERSION,
        "resource": message.resource.value,
        "epoch": message.epoch,
        "seq": message.seq,
        "scanned_at": message.scanned_at_ns,
        "error": message.discovery_error,
        "cdi": message.cdi_resolvable,
        "driver": message.driver_version,
        "devices": [_device_to_wire(d) for d in message.devices],
    })


def _expect(value: Any, kinds: type | tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ProtocolError(f"{what} has type {type(value).__name__}")
    return value


def _optional(value: Any, kinds: type | tuple[type, ...], what: str) -> Any:
    return None if value is None else _expect(value, kinds, what)


def _device_from_wire(raw: Any) -> DeviceRecord:
    _expect(raw, dict, "device")
    device_id = _expect(raw.get("id"), str, "device id")
    if not is_valid_device_id(device_id):
        raise ProtocolError(f"device id {device_id[:80]!r} is not valid")
    bus_id = _expect(raw.get("bus"), str, f"{device_id} bus")
    parent = _optional(raw.get("parent"), str, f"{device_id} parent")
    for address in (bus_id, parent):
        if address is not None and not BUS_ID_PATTERN.fullmatch(address):
            raise ProtocolError(f"{device_id}: PCI address {address[:80]!r} is malformed")
    path = _optional(raw.get("path"), list, f"{device_id} path")
    if path is not None:
        path = tuple(_expect(segment, str, f"{device_id} path segment") for segment in path)
    return DeviceRecord(
        device_id=device_id,
        npu=_expect(raw.get("npu"), (int, str), f"{device_id} npu"),
        bus_id=bus_id,
        product=_expect(raw.get("product"), str, f"{device_id} product"),
        sid=_expect(raw.get("sid"), str, f"{device_id} sid"),
        numa_node=_optional(raw.get("numa"), int, f"{device_id} numa"),
        parent_pf=parent,
        pci_path=path,
        status=StatusReading(_optional(raw.get("status"), int, f"{device_id} status")),
        observed_at_ns=_expect(raw.get("at"), int, f"{device_id} observation time"),
        uuid=_expect(raw.get("uuid"), str, f"{device_id} uuid"),
        firmware_version=_expect(raw.get("fw"), str, f"{device_id} firmware"),
        pci_device_id=_expect(raw.get("pciid"), str, f"{device_id} PCI device ID"),
        memory_bytes=_optional(raw.get("mem"), int, f"{device_id} memory"),
    )


def decode(payload: bytes) -> InventoryMessage:
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(payload)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for junk
        raise ProtocolError(f"not msgpack: {type(exc).__name__}: {exc}") from None
    _expect(raw, dict, "message")
    if raw.get("v") != SCHEMA_VERSION:
        raise ProtocolError(f"schema version {raw.get('v')!r}, expected {SCHEMA_VERSION}")
    try:
        resource = Resource(_expect(raw.get("resource"), str, "resource"))
    except ValueError:
        raise ProtocolError(f"unknown resource {str(raw.get('resource'))[:80]!r}") from None
    devices = _expect(raw.get("devices"), list, "devices")
    if len(devices) > MAX_DEVICES:
        raise ProtocolError(f"{len(devices)} devices exceed {MAX_DEVICES}")
    seq = _expect(raw.get("seq"), int, "seq")
    if seq < 1:
        raise ProtocolError(f"seq {seq} is not positive")
    cdi_resolvable = raw.get("cdi")
    if not isinstance(cdi_resolvable, bool):
        raise ProtocolError(f"cdi has type {type(cdi_resolvable).__name__}")
    records = tuple(_device_from_wire(d) for d in devices)
    if len({d.device_id for d in records}) != len(records):
        raise ProtocolError("a device id occurs twice")
    return InventoryMessage(
        resource=resource,
        epoch=_expect(raw.get("epoch"), str, "epoch"),
        seq=seq,
        scanned_at_ns=_expect(raw.get("scanned_at"), int, "scanned_at"),
        devices=records,
        discovery_error=_optional(raw.get("error"), str, "error"),
        cdi_resolvable=cdi_resolvable,
        driver_version=_expect(raw.get("driver"), str, "driver"),
    )
