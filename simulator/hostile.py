"""Hostile sysfs content on a simulated node, as a seeded family: what a broken driver, a failing disk or
someone with write access to the node could leave where the scanner reads.

A `Hostility` damages one sysfs entry of one device in one way:
- targets: the device's `bus/pci/devices/<BDF>` link, its `physfn` link (a VF), its `sriov_numvfs`
  (a PF), its `numa_node`, its driver `status` (a PF);
- kinds: a symbolic link loop, an enormous file (a sparse gigabyte), a non-UTF-8 name (a link to it, or
  for file contents, bytes that are no UTF-8) and a FIFO that blocks whoever reads it.

`family(node, seed, count)` plants `count` of them on distinct devices, chosen by `seed`, and says what
the stack must make of each (`Expectation`): the device left out, or advertised without the attribute
(`expected_out`, `expected_warned`). A damaged `sriov_numvfs` or link of a PF hosting VFs leaves its VFs'
role unknown too: they are expected out.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
import random

from simulator.node import SimulatedNode
from simulator.spec import NodeSpec, PfSpec

# A sparse file: its size is what counts, not the disk it takes.
ENORMOUS_BYTES = 1 << 30
NON_UTF8 = b"\xff\xfe\xc3\x28-not-utf8"


class Kind(enum.Enum):
    LINK_LOOP = "symlink loop"
    ENORMOUS = "enormous file"
    NON_UTF8 = "non-UTF-8 name"
    FIFO = "FIFO"


class Target(enum.Enum):
    BUS_LINK = "bus link"
    PHYSFN = "physfn"
    SRIOV_NUMVFS = "sriov_numvfs"
    NUMA_NODE = "numa_node"
    STATUS = "status"


class Expectation(enum.Enum):
    EXCLUDED = "excluded"
    """Not advertised, with one error naming it: its SR-IOV role cannot be known."""
    WITHOUT_ATTRIBUTE = "advertised without the attribute"
    """Advertised, with one warning naming it."""


@dataclasses.dataclass(frozen=True)
class Hostility:
    device: str
    target: Target
    kind: Kind

    @property
    def expectation(self) -> Expectation:
        if self.target in (Target.NUMA_NODE, Target.STATUS):
            return Expectation.WITHOUT_ATTRIBUTE
        return Expectation.EXCLUDED


def hostile_node_spec() -> NodeSpec:
    """A node with every kind of device the family can damage: plain PFs with and without a NUMA node
    (rbln-smi then reports none, and sysfs is read), PFs hosting one VF and four VFs."""
    return NodeSpec((PfSpec(), PfSpec(numa_node=None), PfSpec(numa_node=None, switch=1), PfSpec("vf1"),
                     PfSpec("vf1", numa_node=None, switch=1), PfSpec("vf4", switch=1)))


def targets_of(node: SimulatedNode, device_id: str) -> tuple[Target, ...]:
    """What of the device the scanner reads: a VF has no status file or sriov_numvfs of its own, a PF
    hosting VFs is not advertised (its status and NUMA node are never read), and `numa_node` is read only
    where rbln-smi reports none."""
    device = node.device(device_id)
    if device.num_vfs and not device.is_vf:
        return Target.BUS_LINK, Target.SRIOV_NUMVFS
    own = (Target.PHYSFN,) if device.is_vf else (Target.SRIOV_NUMVFS, Target.STATUS)
    return (Target.BUS_LINK, *own, *((Target.NUMA_NODE,) if device.numa_node is None else ()))


def _path(node: SimulatedNode, hostility: Hostility) -> pathlib.Path:
    bus_link = node.sysfs_root / "bus" / "pci" / "devices" / node.device(hostility.device).bus_id
    if hostility.target is Target.BUS_LINK:
        return bus_link
    if hostility.target is Target.STATUS:
        return node.status_file(hostility.device)
    return bus_link.resolve() / hostility.target.value


def plant(node: SimulatedNode, hostility: Hostility) -> None:
    """Damage the node as `hostility` says."""
    path = _path(node, hostility)
    path.unlink(missing_ok=True)
    kind = hostility.kind
    if kind is Kind.LINK_LOOP:
        path.symlink_to(path.name)
    elif kind is Kind.FIFO:
        os.mkfifo(path)
    elif kind is Kind.ENORMOUS:
        with open(path, "wb") as handle:
            handle.truncate(ENORMOUS_BYTES)
    elif hostility.target in (Target.BUS_LINK, Target.PHYSFN):
        # A link to a name that is no UTF-8 (and nothing by that name exists).
        os.symlink(b"../" + NON_UTF8, os.fsencode(path))
    else:
        path.write_bytes(NON_UTF8 + b"\n")


def family(node: SimulatedNode, seed: int, count: int) -> list[Hostility]:
    """`count` hostilities on distinct devices of `node`, chosen by `seed`, planted."""
    rng = random.Random(seed)
    planted = []
    for device_id in rng.sample(node.devices(), min(count, len(node.devices()))):
        hostility = Hostility(device_id, rng.choice(targets_of(node, device_id)), rng.choice(list(Kind)))
        plant(node, hostility)
        planted.append(hostility)
    return planted


def expected_out(node: SimulatedNode, planted: list[Hostility]) -> set[str]:
    """The devices the stack must leave out: those planted EXCLUDED, and the VFs of a PF whose
    `sriov_numvfs` or link is damaged (their VF count is read there)."""
    out = {h.device for h in planted if h.expectation is Expectation.EXCLUDED}
    damaged_counts = {h.device for h in planted if h.target in (Target.SRIOV_NUMVFS, Target.BUS_LINK)}
    out |= {device.device for device in node.inventory if device.parent in damaged_counts}
    return out


def expected_warned(node: SimulatedNode, planted: list[Hostility]) -> set[str]:
    """The devices the stack must advertise with a warning: damaged WITHOUT_ATTRIBUTE and not left out."""
    return {h.device for h in planted if h.expectation is Expectation.WITHOUT_ATTRIBUTE} - expected_out(node, planted)
