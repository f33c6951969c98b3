"""Where a PCI device sits in the PCI hierarchy, read from its sysfs link.

`$SYSFS_ROOT/bus/pci/devices/<BDF>` links into
`$SYSFS_ROOT/devices/pciDDDD:BB/<bridge>/.../<BDF>`; the directories on the way
are the root complex, the bridges above the device and the device itself.
Placement only trusts a path that has exactly that shape: anything else makes
the device's position unknown, which costs that device its PCI locality and
nothing more.
"""

from __future__ import annotations

import os
import pathlib
import re

from shared.inventory import BUS_ID_PATTERN

_ROOT_SEGMENT = re.compile(r"^pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}$")


def resolve_pci_path(sysfs_root: pathlib.Path, bus_id: str) -> tuple[str, ...] | None:
    """Segments from the PCI root (`pci0000:00`) down to the device's own BDF, or None when untrusted."""
    if not isinstance(bus_id, str) or not BUS_ID_PATTERN.fullmatch(bus_id):
        return None
    link = sysfs_root / "bus" / "pci" / "devices" / bus_id
    try:
        # The root is resolved too, so a sysfs tree reached through a symlink
        # (or a test tree under a symlinked temp dir) still compares equal.
        devices = pathlib.PurePath(os.path.realpath(sysfs_root, strict=True)) / "devices"
        target = pathlib.PurePath(os.path.realpath(link, strict=True))
        if not os.path.isdir(target):
            return None
        segments = target.relative_to(devices).parts
    except (OSError, ValueError, RecursionError):
        # OSError covers a missing link and ELOOP; ValueError a target outside
        # `devices`; RecursionError a pathologically long chain of links.
        return None
    if len(segments) < 2 or not _ROOT_SEGMENT.fullmatch(segments[0]):
        return None
    if not all(BUS_ID_PATTERN.fullmatch(segment) for segment in segments[1:]):
        return None
    if segments[-1].lower() != bus_id.lower():
        return None
    return segments
