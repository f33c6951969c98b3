"""One scan of the node: rbln-smi inventory + sysfs (SR-IOV, NUMA, PCI path, status) -> per-resource devices."""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Callable

from scanner.pci_path import PciPaths
from shared.channels.inventory_protocol import MAX_DEVICES
from shared.node.device_record import BUS_ID_PATTERN, DeviceRecord, is_valid_device_id
from shared.node.driver_status import read_status
from shared.node.rbln_smi import RblnSmi, RblnSmiError, SmiDevice
from shared.node.sriov import SriovError, SriovKind, SriovRole, numa_node, probe_sriov, read_attribute
from shared.resources import Resource

Clock = Callable[[], int]


@dataclasses.dataclass(frozen=True)
class Exclusion:
    device: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ScanResult:
    inventories: dict[Resource, tuple[DeviceRecord, ...]]
    """Every resource, the absent ones empty."""
    error: str | None = None
    """Why discovery failed; the inventories are then all empty."""
    excluded: tuple[Exclusion, ...] = ()
    """Devices left out of every resource, with the reason (not hosting PFs: those are expected)."""
    unreadable: tuple[Exclusion, ...] = ()
    """Devices advertised without an attribute sysfs has for them but which could not be read (a status
    file that is a FIFO, a link loop, junk), with the reason."""
    smi_seconds: float = 0.0
    npu_products: tuple[str, ...] = ()
    """rbln-smi's product name of every NPU it lists once, advertised or not, except the PFs hosting VFs."""
    driver_version: str = ""
    """The driver's version (sysfs `kernel_version`, else rbln-smi's `KMD_version`); empty when unknown."""


def empty_inventories() -> dict[Resource, tuple[DeviceRecord, ...]]:
    return {resource: () for resource in Resource}


def resource_for(role: SriovRole) -> Resource | None:
    """Where a device is advertised: plain PFs as npu, VFs by their PF's VF count; None = not advertised."""
    if role.kind is SriovKind.PLAIN_PF:
        return Resource.NPU
    if role.kind is SriovKind.VF:
        return Resource.for_vf_count(role.num_vfs)
    return None


def _classify(smi: SmiDevice, sysfs_root: pathlib.Path) -> tuple[Resource | None, SriovRole | None, str | None]:
    """(resource, role, exclusion reason) of one listed device."""
    if not is_valid_device_id(smi.device):
        return None, None, f"device name {smi.device[:80]!r} is not a valid device ID"
    if not BUS_ID_PATTERN.fullmatch(smi.bus_id):
        return None, None, f"PCI address {smi.bus_id[:80]!r} is malformed"
    try:
        role = probe_sriov(sysfs_root, smi.bus_id)
    except SriovError as exc:
        return None, None, str(exc)
    resource = resource_for(role)
    if resource is None and role.kind is SriovKind.VF:
        return None, role, (f"its PF {role.parent_pf} is partitioned into {role.num_vfs} VFs; "
                            f"only 1 (npu-vf1) and 4 (npu-vf4) are supported")
    return resource, role, None


def driver_version(sysfs_root: pathlib.Path, device_ids: list[str], reported: str) -> str:
    """The version the driver gives in sysfs for the first device (by name, as `rbln0` comes first), where
    Rebellions' own feature discovery reads it; rbln-smi's `KMD_version` when that device has none."""
    if device_ids:
        try:
            version = read_attribute(sysfs_root / "class" / "rebellions" / min(device_ids) / "kernel_version")
        except OSError:
            version = ""
        if version:
            return version
    return reported


def scan(smi: RblnSmi, sysfs_root: pathlib.Path, clock: Clock = time.monotonic_ns) -> ScanResult:
    started = time.monotonic()
    try:
        listing = smi.inventory()
    except RblnSmiError as exc:
        return ScanResult(empty_inventories(), error=str(exc), smi_seconds=time.monotonic() - started)
    smi_seconds = time.monotonic() - started
    if len(listing.devices) > MAX_DEVICES:
        # More than a message can carry: publishing it would be refused by every worker.
        return ScanResult(empty_inventories(), error=f"rbln-smi lists {len(listing.devices)} devices, "
                          f"more than the {MAX_DEVICES} a node can have", smi_seconds=smi_seconds)

    pci_paths = PciPaths(sysfs_root)
    found: dict[Resource, list[DeviceRecord]] = {resource: [] for resource in Resource}
    excluded = [Exclusion("?", reason) for reason in listing.rejected]
    unreadable: list[Exclusion] = []
    seen: set[str] = set()
    npu_products = []
    for entry in listing.devices:
        if entry.device in seen:
            excluded.append(Exclusion(entry.device, "listed more than once by rbln-smi"))
            continue
        seen.add(entry.device)
        resource, role, reason = _classify(entry, sysfs_root)
        if reason is not None:
            excluded.append(Exclusion(entry.device, reason))
        if role is None or role.kind is not SriovKind.HOSTING_PF:
            npu_products.append(entry.name)
        if resource is None or role is None:
            continue
        # Stamped before the read: an observation is never newer than the state it saw.
        observed_at_ns = clock()
        node, numa_problem = numa_node(sysfs_root, entry.bus_id, entry.numa_node)
        status = read_status(sysfs_root, entry.device)
        unreadable.extend(Exclusion(entry.device, problem) for problem in (numa_problem, status.problem) if problem)
        found[resource].append(DeviceRecord(
            device_id=entry.device,
            npu=entry.npu,
            bus_id=entry.bus_id,
            product=entry.name,
            sid=entry.sid,
            numa_node=node,
            parent_pf=role.parent_pf,
            pci_path=pci_paths.resolve(entry.bus_id),
            status=status,
            observed_at_ns=observed_at_ns,
            uuid=entry.uuid,
            firmware_version=entry.firmware_version,
            pci_device_id=entry.pci_device_id,
            memory_bytes=entry.memory_bytes,
        ))
    inventories = {resource: tuple(sorted(devices, key=lambda d: d.device_id))
                   for resource, devices in found.items()}
    version = driver_version(sysfs_root, [d for d in seen if is_valid_device_id(d)], listing.kmd_version)
    return ScanResult(inventories, excluded=tuple(excluded), unreadable=tuple(unreadable), smi_seconds=smi_seconds,
                      npu_products=tuple(npu_products), driver_version=version)
