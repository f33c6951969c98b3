"""Device names, npu indices and PCI addresses of a simulated node.

PCI forest (one host bridge, like a single-socket box; NUMA is a label, not a bus):

    pci0000:00/<root port 0000:00:0R.0>/<switch upstream 0000:UU:00.0>/<downstream 0000:DD:0S.0>/<PF 0000:BB:00.0>

Each switch in use gets its own root port (R = 1, 2, ... in switch order), an upstream
port bus and a downstream bus with one port per PF; each PF its own bus. VF j of a PF
sits on the PF's bus at routing ID j+1 (`0000:BB:00.1` .. `0000:BB:00.7`, then
`0000:BB:01.0` as with ARI), in the same parent dir as the PF.

Names: PF i is `rbln{i}` with npu i; VF j of PF i is `rbln{i}-{j}`. VF npus continue
after the last PF's, in PF then VF order: with 2 PFs in vf4 mode, rbln0-0..3 are npu
2..5 and rbln1-0..3 are npu 6..9.
"""

from __future__ import annotations

import dataclasses

from simulator.spec import NodeSpec

HOST_BRIDGE = "pci0000:00"
_MAX_BUS, _MAX_DEVICE = 0xFF, 0x1F
_FIRST_SID = 52628079


@dataclasses.dataclass(frozen=True)
class SimDevice:
    device: str
    """`rbln0` (PF) or `rbln0-1` (VF): the device ID and the /dev node name."""
    npu: int
    bus_id: str
    pci_path: tuple[str, ...]
    """sysfs segments from `pci0000:00` down to `bus_id`."""
    sid: str
    numa_node: int | None
    product: str
    parent: str | None
    """For a VF its PF's device ID; None for a PF."""
    num_vfs: int
    """For a PF its VF count (`sriov_numvfs`); for a VF its parent's."""

    @property
    def is_vf(self) -> bool:
        return self.parent is not None


def bdf(bus: int, device: int, function: int) -> str:
    return f"0000:{bus:02x}:{device:02x}.{function}"


def _pf_paths(spec: NodeSpec) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = [()] * len(spec.pfs)
    next_bus = 1
    for port, switch in enumerate(sorted({pf.switch for pf in spec.pfs}), start=1):
        upstream, downstream_bus = bdf(next_bus, 0, 0), next_bus + 1
        next_bus += 2
        members = [i for i, pf in enumerate(spec.pfs) if pf.switch == switch]
        if port > _MAX_DEVICE or len(members) > _MAX_DEVICE + 1:
            raise ValueError(f"too many switches or PFs per switch for one PCI bus (switch {switch})")
        for slot, index in enumerate(members):
            paths[index] = (HOST_BRIDGE, bdf(0, port, 0), upstream, bdf(downstream_bus, slot, 0), bdf(next_bus, 0, 0))
            next_bus += 1
    if next_bus - 1 > _MAX_BUS:
        raise ValueError(f"{len(spec.pfs)} PFs need more than {_MAX_BUS} PCI buses")
    return paths


def plan(spec: NodeSpec) -> tuple[SimDevice, ...]:
    """Every device of the node, PFs first, in npu order."""
    pf_paths = _pf_paths(spec)
    pfs, vfs = [], []
    next_vf_npu = len(spec.pfs)
    for i, (pf, path) in enumerate(zip(spec.pfs, pf_paths, strict=True)):
        sid = pf.sid if pf.sid is not None else f"{_FIRST_SID + i:016d}"
        pfs.append(SimDevice(f"rbln{i}", i, path[-1], path, sid, pf.numa_node, pf.product, None, pf.num_vfs))
        bus = int(path[-1][5:7], 16)
        for j in range(pf.num_vfs):
            routing_id = j + 1
            vf_path = (*path[:-1], bdf(bus, routing_id >> 3, routing_id & 7))
            vfs.append(SimDevice(f"rbln{i}-{j}", next_vf_npu, vf_path[-1], vf_path, sid, pf.numa_node,
                                 pf.product, f"rbln{i}", pf.num_vfs))
            next_vf_npu += 1
    return tuple(pfs + vfs)
