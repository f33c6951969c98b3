"""Nodes for placement benchmarks and tests: the spec's shapes and a seeded family of irregular PCI forests.

Every function returns {device ID: Candidate}, the pool a worker hands to placement.

- `vf_node(roots)`: 16 PFs in vf4 mode on 4 PCIe switches and 2 NUMA nodes, the 64 VFs
  grouped by parent PF; `roots=2` puts each NUMA node under a PCI root of its own,
  `roots=1` both under one root (the simulated node's layout, and the harder case).
- `pf_node()`: 32 single-device cards, 8 per switch, one root per NUMA node.
- `irregular_node(seed, devices)`: one member of the irregular family, the same for the
  same arguments on any machine.
- `STRESS`: pools made to spend the work bound, not members of any family a node shows:
  `spread-cards` (128 PFs whose SIDs pair devices under different roots: every card is
  spread, so the ways to choose cards explode), `numa-heavy` (128 devices on 8 NUMA nodes
  of equal room: 70 ways to meet the NUMA optimum), `vf-pairs` (64 PFs with 2 VFs each
  over 24 bridges, NUMA drawn per VF: many classes and cards).

The irregular family is what a VM guest or an unusual host board shows: 1-3 PCI roots
with random domain and bus numbers; a random tree of 8-30 bridges whose depths differ
(new bridges tend to hang off the latest one, so long chains and flat fans both occur);
NUMA nodes 0-3 drawn per subtree and per device, so they follow neither the roots nor
the cards, and a few devices with no NUMA node; pools of PFs (each its own card, or a
SID shared by PFs under different bridges, or an invalid SID: empty, N/A, unknown,
zeros) or of VFs grouped by parent PF (1-7 VFs next to their PF); a few unreadable PCI
paths; now and then a device on a bridge that has devices below it; IDs of several
styles, numbered in no relation to their PCI position.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from resource_worker.placement import Candidate, card_key

_INVALID_SIDS = ("", "N/A", "unknown", "0000", "00000000-0000")
_ID_STYLES = ("rbln{n}", "rbln{n:02d}", "npu{n}", "RBLN-{n:03d}", "dev{n}x")


def _port_path(switch: int, port: int, roots: int) -> tuple[str, ...]:
    """Segments down to a downstream port: root port, switch upstream port, downstream port.

    Switches 0-1 serve NUMA 0, 2-3 NUMA 1; with two roots each NUMA node has its own.
    """
    root_bus = 0x80 if roots == 2 and switch >= 2 else 0x00
    root_port = switch % 2 + 1 if roots == 2 else switch + 1
    upstream_bus = root_bus + 1 + (switch % 2 if roots == 2 else switch) * 0x20
    return (f"pci0000:{root_bus:02x}", f"0000:{root_bus:02x}:{root_port:02x}.0",
            f"0000:{upstream_bus:02x}:00.0", f"0000:{upstream_bus + 1:02x}:{port:02x}.0")


def _device_bus(port_path: tuple[str, ...], port: int) -> int:
    return int(port_path[-1][5:7], 16) + 1 + port


def vf_node(roots: int = 2) -> dict[str, Candidate]:
    node = {}
    for pf in range(16):
        switch, port = divmod(pf, 4)
        port_path = _port_path(switch, port, roots)
        bus = _device_bus(port_path, port)
        for vf in range(4):
            device_id = f"rbln{pf}-{vf}"
            node[device_id] = Candidate(device_id, switch // 2, card_key("", f"0000:{bus:02x}:00.0"),
                                        port_path + (f"0000:{bus:02x}:00.{vf + 1}",))
    return node


def pf_node() -> dict[str, Candidate]:
    node = {}
    for pf in range(32):
        switch, port = divmod(pf, 8)
        port_path = _port_path(switch, port, roots=2)
        bus = _device_bus(port_path, port)
        device_id = f"rbln{pf}"
        node[device_id] = Candidate(device_id, switch // 2, card_key(f"SN{pf:04d}", None),
                                    port_path + (f"0000:{bus:02x}:00.0",))
    return node


class _Forest:
    """The bridges of one irregular node and the bus numbers handed out so far."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.next_bus = rng.randrange(1, 0x40)
        domains = rng.sample(range(0x10000), 3) if rng.random() < 0.3 else [0, 0, 0]
        buses = sorted(rng.sample(range(0x00, 0x100, 0x10), 3))
        roots = [(f"pci{domains[i]:04x}:{buses[i]:02x}",) for i in range(rng.randint(1, 3))]
        # (path, NUMA node of the devices below it unless they say otherwise)
        self.bridges: list[tuple[tuple[str, ...], int]] = []
        for root in roots:
            self.bridges.append((root, rng.randrange(4)))
        for _ in range(rng.randint(8, 30)):
            parent, numa = self.bridges[-1] if rng.random() < 0.45 else rng.choice(self.bridges)
            if rng.random() < 0.3:
                numa = rng.randrange(4)
            self.bridges.append((parent + (self.address(),), numa))
        self.leaves = [b for b in self.bridges[len(roots):]] or self.bridges

    def address(self, function: int = 0) -> str:
        bus, self.next_bus = self.next_bus % 0x100, self.next_bus + 1
        return f"0000:{bus:02x}:{self.rng.randrange(0x20):02x}.{function}"

    def place(self) -> tuple[tuple[str, ...], int]:
        """Where a PF goes: below a bridge, or now and then on the bridge itself."""
        bridge, numa = self.rng.choice(self.leaves)
        return (bridge if self.rng.random() < 0.03 else bridge + (self.address(),)), numa


def irregular_node(seed: int, devices: int) -> dict[str, Candidate]:
    rng = random.Random(f"irregular/{devices}/{seed}")
    forest = _Forest(rng)
    vfs = rng.random() < 0.5
    style = rng.choice(_ID_STYLES)
    numbers = rng.sample(range(devices * 4), devices)

    def numa_of(numa: int) -> int | None:
        roll = rng.random()
        return None if roll < 0.05 else rng.randrange(4) if roll < 0.2 else numa

    def path_of(path: tuple[str, ...]) -> tuple[str, ...] | None:
        return None if rng.random() < 0.05 else path

    rows: list[tuple[int | None, str | None, tuple[str, ...] | None]] = []
    while len(rows) < devices:
        path, numa = forest.place()
        if vfs:
            pf_numa = numa_of(numa)
            for function in range(1, min(rng.choice((1, 2, 4, 4, 4, 7)), devices - len(rows)) + 1):
                vf_path = path[:-1] + (path[-1][:-1] + str(function),)
                rows.append((pf_numa if rng.random() < 0.9 else numa_of(numa), card_key("", path[-1]),
                             path_of(vf_path)))
            continue
        roll = rng.random()
        if roll < 0.1:
            sid = rng.choice(_INVALID_SIDS)
        elif roll < 0.35 and rows:
            # A card whose devices sit under different bridges.
            sid = f"SHARED{rng.randrange(max(1, devices // 8))}"
        else:
            sid = f"SN{len(rows):05d}"
        rows.append((numa_of(numa), card_key(sid, None), path_of(path)))
    node = {}
    for number, (numa, card, path) in zip(numbers, rows, strict=True):
        device_id = style.format(n=number)
        node[device_id] = Candidate(device_id, numa, card, path)
    return node


def _spread_cards() -> dict[str, Candidate]:
    node = {}
    for i in range(128):
        device_id = f"d{i:03d}"
        path = (f"pci{i % 3:04x}:00", f"0000:{(i // 4) % 32:02x}:00.0", f"0000:{0x40 + i % 0xc0:02x}:{i // 0xc0:02x}.0")
        node[device_id] = Candidate(device_id, 0, card_key(f"S{i // 2}", None), path)
    return node


def _numa_heavy() -> dict[str, Candidate]:
    node = {}
    for i in range(128):
        device_id = f"m{i:03d}"
        node[device_id] = Candidate(device_id, i % 8, None, ("pci0000:00", f"0000:{i % 16:02x}:00.0",
                                                             f"0000:{0x20 + i % 0xe0:02x}:{i // 0xe0:02x}.0"))
    return node


def _vf_pairs() -> dict[str, Candidate]:
    rng = random.Random("vf-pairs")
    node = {}
    for pf in range(64):
        bridge = ("pci0000:00", f"0000:{pf % 8:02x}:00.0", f"0000:{0x10 + pf % 24:02x}:01.0")
        for vf in range(2):
            device_id = f"v{pf:02d}-{vf}"
            node[device_id] = Candidate(device_id, rng.randrange(2), card_key("", f"0000:{0x40 + pf:02x}:00.0"),
                                        bridge + (f"0000:{0x40 + pf:02x}:00.{vf + 1}",))
    return node


STRESS: dict[str, Callable[[], dict[str, Candidate]]] = {
    "spread-cards": _spread_cards, "numa-heavy": _numa_heavy, "vf-pairs": _vf_pairs}
