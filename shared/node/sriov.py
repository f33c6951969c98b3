"""SR-IOV roles and NUMA nodes of PCI devices, read from sysfs (docs/node.md#sysfs)."""

from __future__ import annotations

import dataclasses
import enum
import errno
import os
import pathlib
import stat

from shared.node.device_record import BUS_ID_PATTERN

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
    return sysfs_root.joinpath("bus", "pci", "devices", bus_id)  # one join, not four: every device, every scan


def read_attribute(path: pathlib.Path) -> str:
    """A sysfs attribute's text, stripped; OSError when it cannot be read.

    Only a regular file counts: a FIFO or a device in its place would block the
    scan or feed it without end, so it is refused before anything is read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        raw = os.read(fd, _MAX_ATTRIBUTE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > _MAX_ATTRIBUTE_BYTES:
        raise OSError(errno.EFBIG, "longer than a sysfs attribute", str(path))
    return raw.decode("ascii", "replace").strip()


def _cannot_read(path: pathlib.Path, exc: OSError) -> SriovError:
    return SriovError(f"cannot read {path}: {exc.strerror or exc}")


def _lstat(path: pathlib.Path) -> os.stat_result | None:
    """`path` itself (a link is not followed), None when absent; SriovError when that cannot be told.

    Only "no such file" means absent: a symlink loop or an I/O error hides what the
    device is, and guessing "plain PF" would advertise a VF under the wrong resource.
    """
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _cannot_read(path, exc) from None


def _read_num_vfs(device_dir: pathlib.Path) -> int:
    path = device_dir / "sriov_numvfs"
    try:
        text = read_attribute(path)
    except OSError as exc:
        raise _cannot_read(path, exc) from None
    try:
        return int(text)
    except ValueError:
        raise SriovError(f"{path} holds {text[:32]!r}, not a VF count") from None


def probe_sriov(sysfs_root: pathlib.Path, bus_id: str) -> SriovRole:
    device_dir = pci_device_dir(sysfs_root, bus_id)
    # An entry for the device that leads nowhere (a dangling link, a file) hides whether it is a VF. (No
    # entry at all is a node whose sysfs has no SR-IOV view: its devices are plain PFs.)
    if _lstat(device_dir) is not None:
        try:
            if not stat.S_ISDIR(os.stat(device_dir).st_mode):
                raise SriovError(f"{device_dir} is not a directory")
        except OSError as exc:
            raise _cannot_read(device_dir, exc) from None
    physfn = device_dir / "physfn"
    physfn_stat = _lstat(physfn)
    if physfn_stat is not None and not stat.S_ISLNK(physfn_stat.st_mode):
        raise SriovError(f"{physfn} is not a link to a PF")
    if physfn_stat is not None:
        try:
            parent = os.path.basename(os.readlink(physfn))
        except OSError as exc:
            raise _cannot_read(physfn, exc) from None
        if not BUS_ID_PATTERN.fullmatch(parent):
            raise SriovError(f"{physfn} names {parent[:32]!r}, not a PCI address")
        return SriovRole(SriovKind.VF, _read_num_vfs(pci_device_dir(sysfs_root, parent)), parent)
    if _lstat(device_dir / "sriov_numvfs") is None:
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


def numa_node(sysfs_root: pathlib.Path, bus_id: str, reported: str | int | None) -> tuple[int | None, str | None]:
    """rbln-smi's NUMA node when valid, else the PCI device's `numa_node` attribute; and why that attribute,
    there, could not be read (a missing one is no problem)."""
    node = parse_numa(reported)
    if node is not None:
        return node, None
    path = pci_device_dir(sysfs_root, bus_id) / "numa_node"
    try:
        text = read_attribute(path)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, str(_cannot_read(path, exc))
    try:
        int(text)
    except ValueError:
        return None, f"{path} holds {text[:32]!r}, not a NUMA node"
    return parse_numa(text), None
