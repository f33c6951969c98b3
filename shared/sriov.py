"""SR-IOV roles and NUMA nodes of PCI devices, read from sysfs (CONTRACT §3)."""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib

# A sysfs attribute is a short line; never read more than this.
_MAX_ATTRIBUTE_BYTES = 256


class SriovError(RuntimeError):
    """The device's SR-IOV state cannot be determined; it must not be advertised."""


class SriovKind(enum.Enum):
    PLAIN_PF = "plain PF"
    HOSTING_PF = "PF hosting VFs"
    VF = "VF"


@dataclasses.dataclass(frozen=True)
class SriovRole:
    kind: SriovKind
    num_vfs: int = 0
    """For a hosting PF its own VF count; for a VF its parent's."""
    parent_pf: str | None = None


def pci_device_dir(sysfs_root: pathlib.Path, bus_id: str) -> pathlib.Path:
    return sysfs_root / "bus" / "pci" / "devices" / bus_id


def read_attribute(path: pathlib.Path) -> str:
    """A sysfs attribute's text, stripped; OSError when it cannot be read."""
    with open(path, "rb") as handle:
        raw = handle.read(_MAX_ATTRIBUTE_BYTES + 1)
    if len(raw) > _MAX_ATTRIBUTE_BYTES:
        raise OSError(f"{path} is longer than a sysfs attribute")
    return raw.decode("ascii", "replace").strip()


def _read_num_vfs(device_dir: pathlib.Path) -> int:
    path = device_dir / "sriov_numvfs"
    try:
        text = read_attribute(path)
    except OSError as exc:
        raise SriovError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return int(text)
    except ValueError:
        raise SriovError(f"{path} holds {text!r}, not a VF count") from None


def probe_sriov(sysfs_root: pathlib.Path, bus_id: str) -> SriovRole:
    device_dir = pci_device_dir(sysfs_root, bus_id)
    physfn = device_dir / "physfn"
    if physfn.is_symlink():
        parent = os.path.basename(os.readlink(physfn))
        return SriovRole(SriovKind.VF, _read_num_vfs(pci_device_dir(sysfs_root, parent)), parent)
    if not (device_dir / "sriov_numvfs").exists():
        return SriovRole(SriovKind.PLAIN_PF)
    num_vfs = _read_num_vfs(device_dir)
    if num_vfs > 0:
        return SriovRole(SriovKind.HOSTING_PF, num_vfs)
    return SriovRole(SriovKind.PLAIN_PF)


def parse_numa(text: str | int | None) -> int | None:
    """A NUMA node number, or None for missing, invalid or negative values."""
    if text is None or isinstance(text, bool):
        return None
    try:
        node = int(str(text).strip())
    except ValueError:
        return None
    return node if node >= 0 else None


def numa_node(sysfs_root: pathlib.Path, bus_id: str, reported: str | int | None) -> int | None:
    """rbln-smi's NUMA node when valid, else the PCI device's `numa_node` attribute."""
    node = parse_numa(reported)
    if node is not None:
        return node
    try:
        return parse_numa(read_attribute(pci_device_dir(sysfs_root, bus_id) / "numa_node"))
    except OSError:
        return None
