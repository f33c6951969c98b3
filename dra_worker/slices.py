"""ResourceSlices as plain functions of the inventory: which devices, with which attributes, in which slices.

Names and attributes are those of Rebellions' Go DRA driver, so that its DeviceClasses and CEL selectors work
unchanged (docs/dra.md#devices-and-attributes), plus the SR-IOV VFs it does not publish. An Unhealthy device
is left out, and comes back when it recovers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dra_worker.inventory import NodeInventory, ServedDevice
from shared.config import DRA_DRIVER
from shared.resources import Resource

API_VERSION = "resource.k8s.io/v1"
# The API's bound on devices in one slice (without taints or counters).
MAX_DEVICES_PER_SLICE = 128
TYPE_NPU = "npu"
TYPE_VF = "vf"
_VF_COUNT = {Resource.NPU_VF1: 1, Resource.NPU_VF4: 4}
# The API server's rules, which refuse a whole slice for one device that breaks them: a device name is a DNS
# label, a string attribute at most 64 characters.
_DEVICE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_STRING_ATTRIBUTE = 64

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


def published_devices(inventory: NodeInventory) -> list[Json]:
    """The devices the pool offers: every Healthy one whose name the API takes, by name (slice order is
    allocation priority)."""
    return [device_entry(device, inventory.driver_version) for device in inventory.healthy()
            if publishable(device.record.device_id)]


def slice_specs(node_name: str, devices: Sequence[Json], generation: int) -> list[Json]:
    """The pool's slice specs, at most MAX_DEVICES_PER_SLICE devices each; one empty slice for no devices
    (an empty pool says the driver is up and has nothing to offer)."""
    chunks = [list(devices[i:i + MAX_DEVICES_PER_SLICE]) for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)]
    chunks = chunks or [[]]
    return [{"driver": DRA_DRIVER, "nodeName": node_name,
             "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(chunks)},
             "devices": chunk} for chunk in chunks]


def new_slice(node_name: str, node_uid: str, spec: Json) -> Json:
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice",
            "metadata": {"generateName": f"{node_name}-{DRA_DRIVER}-"[:200],
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                              "uid": node_uid, "controller": True}]},
            "spec": spec}


def content(spec: Mapping[str, Any]) -> Json:
    """A slice spec without its pool generation: what decides whether a slice must change."""
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    return {"driver": spec.get("driver"), "nodeName": spec.get("nodeName"), "pool": pool,
            "devices": list(spec.get("devices") or [])}
