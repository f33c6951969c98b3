"""ResourceSlices as plain functions of the inventory: which devices, with which attributes, in which slices.

Names and attributes are those of Rebellions' Go DRA driver, so that its DeviceClasses and CEL selectors work
unchanged (docs/dra.md#devices-and-attributes), plus the SR-IOV VFs it does not publish. An Unhealthy device
stays, with the taint UNHEALTHY_TAINT_KEY until it recovers; on an API server that drops taints it is left out
instead, and comes back when it recovers.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_worker.inventory import NodeInventory, ServedDevice
from shared.config import DRA_DRIVER, TaintEffect
from shared.node.device_health import Health
from shared.resources import Resource

API_VERSION = "resource.k8s.io/v1"
# The API's bounds on devices in one slice: 128, and 64 in a slice where any device carries a taint. Slices are
# cut at 64 whenever taints are published, so that a device turning Unhealthy changes its own slice only.
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_TAINTED_SLICE = 64
UNHEALTHY_TAINT_KEY = f"{DRA_DRIVER}/unhealthy"
# A taint's value is a label value: at most 63 characters of these, starting and ending with a letter or digit.
_NOT_IN_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")
TYPE_NPU = "npu"
TYPE_VF = "vf"
_VF_COUNT = {Resource.NPU_VF1: 1, Resource.NPU_VF4: 4}
# The API server's rules, which refuse a whole slice for one device that breaks them: a device name is a DNS
# label, a string attribute at most 64 characters.
_DEVICE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_STRING_ATTRIBUTE = 64
# The API server's generated names: a prefix of at most 58 characters and 5 of these (k8s.io/apiserver's
# names.SimpleNameGenerator), 63 in all.
_NAME_PREFIX_CHARS = 58
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

Json = dict[str, Any]


def _string(value: str) -> Json:
    return {"string": value}


def _int(value: int) -> Json:
    return {"int": value}


def pcie_root(pci_path: Sequence[str] | None) -> str | None:
    """`pci<domain>:<bus>` of the device's host bridge: the first segment of its resolved sysfs path."""
    if not pci_path or not pci_path[0].startswith("pci"):
        return None
    return pci_path[0]


def device_entry(device: ServedDevice, driver_version: str) -> Json:
    """One device of a slice (resource.k8s.io/v1 `Device`)."""
    record = device.record
    attributes: dict[str, Json] = {"type": _string(TYPE_NPU if device.resource is Resource.NPU else TYPE_VF)}
    for name, value in (("productName", record.product), ("sid", record.sid), ("uuid", record.uuid),
                        ("pciDeviceID", record.pci_device_id), ("firmwareVersion", record.firmware_version),
                        ("driverVersion", driver_version)):
        if value and len(value) <= MAX_STRING_ATTRIBUTE:
            attributes[name] = _string(value)
    attributes["resource.kubernetes.io/pciBusID"] = _string(record.bus_id.lower())
    root = pcie_root(record.pci_path)
    if root is not None:
        attributes["resource.kubernetes.io/pcieRoot"] = _string(root)
    if record.numa_node is not None:
        attributes["resource.kubernetes.io/numaNode"] = _int(record.numa_node)
        attributes["dra.net/numaNode"] = _int(record.numa_node)
    if device.resource in _VF_COUNT:
        attributes["vfCount"] = _int(_VF_COUNT[device.resource])
        if record.parent_pf:
            attributes["parentPciBusID"] = _string(record.parent_pf.lower())
    entry: Json = {"name": record.device_id, "attributes": attributes}
    if record.memory_bytes:
        entry["capacity"] = {"memory": {"value": str(record.memory_bytes)}}
    return entry


def publishable(name: str) -> bool:
    return bool(_DEVICE_NAME.fullmatch(name))


def offered_devices(inventory: NodeInventory) -> list[ServedDevice]:
    """The devices of the pool, Healthy or not: every one whose name the API takes, by name (slice order is
    allocation priority)."""
    return [device for _, device in sorted(inventory.devices.items()) if publishable(device.record.device_id)]


def taint_value(lifecycle: str) -> str:
    """The driver status as a taint's value: `FAULT` stays `FAULT`, `UNKNOWN(7)` becomes `UNKNOWN-7`."""
    return _NOT_IN_LABEL_VALUE.sub("-", lifecycle)[:63].strip("-_.")


def published_devices(inventory: NodeInventory, taint_effect: TaintEffect | None) -> list[Json]:
    """The devices the slices list. With a taint effect every device of the pool, an Unhealthy one carrying the
    unhealthy taint (its driver status as the value); without one (the API server drops taints) the Healthy
    ones only."""
    entries = []
    for device in offered_devices(inventory):
        if device.health is Health.HEALTHY:
            entries.append(device_entry(device, inventory.driver_version))
        elif taint_effect is not None:
            entry = device_entry(device, inventory.driver_version)
            entry["taints"] = [{"key": UNHEALTHY_TAINT_KEY, "value": taint_value(device.lifecycle),
                                "effect": taint_effect.value}]
            entries.append(entry)
    return entries


def tainted(devices: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for device in devices if device.get("taints"))


def slice_specs(node_name: str, devices: Sequence[Json], generation: int, per_slice: int) -> list[Json]:
    """The pool's slice specs, at most `per_slice` devices each; one empty slice for no devices (an empty pool
    says the driver is up and has nothing to offer)."""
    chunks = [list(devices[i:i + per_slice]) for i in range(0, len(devices), per_slice)]
    chunks = chunks or [[]]
    return [{"driver": DRA_DRIVER, "nodeName": node_name,
             "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(chunks)},
             "devices": chunk} for chunk in chunks]


def slice_name(node_name: str, draw: Callable[[str], str] = secrets.choice) -> str:
    """A new slice's name, as the API server would generate one (the first 58 characters of the prefix, then 5
    drawn from its alphabet), but chosen here: a create retried after its answer was lost (the connection gone
    with the request on its way) then finds the slice the first try made (409) instead of making a second."""
    return f"{node_name}-{DRA_DRIVER}-"[:_NAME_PREFIX_CHARS] + "".join(draw(_NAME_ALPHABET) for _ in range(5))


def new_slice(node_name: str, node_uid: str, spec: Json, name: str) -> Json:
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice",
            "metadata": {"name": name,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                              "uid": node_uid, "controller": True}]},
            "spec": spec}


def _without_time_added(device: Mapping[str, Any]) -> Json:
    """A device as published, without the time the API server stamps on each of its taints."""
    if not device.get("taints"):
        return dict(device)
    return {**device, "taints": [{k: v for k, v in taint.items() if k != "timeAdded"} for taint in device["taints"]]}


def content(spec: Mapping[str, Any]) -> Json:
    """A slice spec without its pool generation and its taints' times: what decides whether a slice must change."""
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    return {"driver": spec.get("driver"), "nodeName": spec.get("nodeName"), "pool": pool,
            "devices": [_without_time_added(device) for device in spec.get("devices") or []]}


def keep_time_added(spec: Json, existing: Mapping[str, Any]) -> Json:
    """`spec` with the time of each taint the existing slice already carries, so that rewriting a slice for another
    device's sake does not make an old taint look new."""
    stamped = {(device.get("name"), taint.get("key"), taint.get("value"), taint.get("effect")): taint["timeAdded"]
               for device in existing.get("devices") or [] for taint in device.get("taints") or []
               if taint.get("timeAdded")}
    devices = []
    for device in spec["devices"]:
        taints = [{**taint, "timeAdded": stamped[key]} if (key := (device["name"], taint["key"], taint["value"],
                                                                    taint["effect"])) in stamped else taint
                  for taint in device.get("taints") or []]
        devices.append({**device, "taints": taints} if taints else device)
    return {**spec, "devices": devices}


def taints_dropped(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """Whether the API server stored a slice without the taints it was sent (the field is off there)."""
    kept = {device.get("name"): bool(device.get("taints")) for device in stored.get("devices") or []}
    return any(device.get("taints") and not kept.get(device.get("name")) for device in sent.get("devices") or [])
