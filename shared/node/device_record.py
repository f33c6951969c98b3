"""What the scanner knows about one device: plain data, shared by the scanner and the workers."""

from __future__ import annotations

import dataclasses
import re

from shared.node.driver_status import StatusReading

# Device IDs reach file paths (/dev/<id>, sysfs) and the kubelet (at most 63
# characters); only plain names are accepted from rbln-smi. Both patterns are for fullmatch:
# with `match` and `$`, a name with a trailing newline would pass.
DEVICE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
BUS_ID_PATTERN = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
# SIDs rbln-smi prints for a device without one.
_INVALID_SIDS = frozenset({"", "n/a", "unknown"})


def is_valid_device_id(device_id: str) -> bool:
    return bool(DEVICE_ID_PATTERN.fullmatch(device_id)) and device_id not in (".", "..")


@dataclasses.dataclass(frozen=True)
class DeviceRecord:
    device_id: str
    """`rbln0` for a PF, `rbln0-1` for a VF: the kubelet device ID and the /dev node name."""
    npu: int | str
    """rbln-smi's `npu` index, used to put the device into an RSD group."""
    bus_id: str
    """PCI address, `0000:03:00.0`."""
    product: str
    """`RBLN-CA25`, ... as rbln-smi names it."""
    sid: str
    """Card serial; devices sharing a valid SID sit on one card (card_key)."""
    numa_node: int | None
    """None when unknown (missing, invalid or negative)."""
    parent_pf: str | None
    """For a VF, the PCI address of the PF hosting it; None for a PF."""
    pci_path: tuple[str, ...] | None
    """sysfs path segments from the PCI root (`pci0000:00`) to the device's own
    address; None when the path could not be trusted."""
    status: StatusReading
    observed_at_ns: int
    """CLOCK_MONOTONIC (shared by every process of the node) when `status` was read."""
    uuid: str = ""
    firmware_version: str = ""
    pci_device_id: str = ""
    memory_bytes: int | None = None
    """What DRA publishes of the device beyond what the device plugin needs; empty/None when unknown."""


def card_key(sid: str, parent_pf: str | None) -> str | None:
    """The card a device sits on, or None when nothing says it shares one."""
    if parent_pf:
        # A VF's SID may be blank or copied from its PF; the PF address is what groups VFs.
        return "pf:" + parent_pf.strip().lower()
    sid = (sid or "").strip()
    # All zeros is no SID, however it is written: `0000…`, `0000-00…`, `0x0000…`.
    digits = sid[2:] if sid[:2].lower() == "0x" else sid
    if sid.lower() in _INVALID_SIDS or set(digits) <= set("0-:. "):
        return None
    return "sid:" + sid
