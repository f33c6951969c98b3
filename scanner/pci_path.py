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
import stat

from shared.node.device_record import BUS_ID_PATTERN

_ROOT_SEGMENT = re.compile(r"pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}")


class PciPaths:
    """Reads devices' PCI paths under one sysfs root.

    The root is resolved once (it may be reached through symlinks); each device then
    costs three system calls, where resolving its link component by component took
    about fifteen: the kernel's link is read and applied as text, and the result is
    only accepted if it is a directory (not a link) and the very one the link leads to.
    The kernel's links name the device's canonical path, so the text is that path; a
    tree that routes them through symlinked bridges is not sysfs, and gains nothing but
    the positions its own names claim.
    """

    def __init__(self, sysfs_root: pathlib.Path):
        # (devices dir, links dir) of the resolved root; None when the root cannot be resolved.
        self._dirs: tuple[str, str] | None
        try:
            real_root = os.path.realpath(sysfs_root, strict=True)
        except (OSError, RecursionError):
            self._dirs = None
        else:
            self._dirs = (os.path.join(real_root, "devices"),
                          os.path.realpath(os.path.join(real_root, "bus", "pci", "devices")))

    def resolve(self, bus_id: str) -> tuple[str, ...] | None:
        """Segments from the PCI root (`pci0000:00`) down to the device's own BDF, or None when untrusted."""
        if self._dirs is None:
            return None
        devices, links = self._dirs
        if not isinstance(bus_id, str) or not BUS_ID_PATTERN.fullmatch(bus_id):
            return None
        link = os.path.join(links, bus_id)
        try:
            target = os.path.normpath(os.path.join(links, os.readlink(link)))
            found = os.lstat(target)
            # The text must name the directory the kernel's own resolution reaches.
            if not stat.S_ISDIR(found.st_mode) or not os.path.samestat(found, os.stat(link)):
                return None
        except (OSError, ValueError):
            # A missing link, a directory in place of one, ELOOP; ValueError: a NUL in the target.
            return None
        if not target.startswith(devices + os.sep):
            return None
        segments = tuple(target[len(devices) + 1:].split(os.sep))
        if len(segments) < 2 or not _ROOT_SEGMENT.fullmatch(segments[0]):
            return None
        if not all(BUS_ID_PATTERN.fullmatch(segment) for segment in segments[1:]):
            return None
        if segments[-1].lower() != bus_id.lower():
            return None
        return segments

