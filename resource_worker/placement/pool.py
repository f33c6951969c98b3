"""The tables of one pool of offered devices: classes of look-alike devices and the PCI tree they sit in.

Invariant: two devices share a class only when no score component but the IDs
can tell them apart (same NUMA node, same card or none shared, interchangeable
PCI positions), so a search that decides how many devices each class gives,
always its smallest IDs first, loses no selection worth having. The tables are
never changed after they are built: every request for the pool shares them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from resource_worker.placement.request import Candidate

# The kubelet offers the same devices again until some are allocated or
# change: the tables of the last few pools are kept.
_CACHED_POOLS = 8

Path = tuple[str, ...]

# What the tables say where a class has nothing to say. Per-class facts are parallel lists indexed by
# class (the search's inner loops read them by index), so a missing one is a value of its own, named here.
UNKNOWN_NUMA = 0
"""`numa_bit` of a class whose NUMA node is unknown (known nodes have one bit each)."""
NO_CARD = 0
"""`card_bit` of a class whose devices share a card with no other offered device: each counts as a card."""
NO_ROOT = -1
"""`root` of a class whose PCI path could not be read."""
NO_NODE = -1
"""`attach` of a class whose PCI path could not be read; `node_parent` of a root's own node."""


class Position(NamedTuple):
    """Where a class sits: devices with equal positions are interchangeable in the PCI components."""

    shared: Path
    """The deepest tree node above every device of the class (a device's own path when they share it)."""
    intra: int
    """The distance between two devices of the class."""


class ClassKey(NamedTuple):
    numa_node: int | None
    card: str | None
    position: Position


class PoolTables:
    """Everything about a pool that does not depend on the request: built once, shared by every request for it."""

    def __init__(self, pool: tuple[Candidate, ...]) -> None:
        card_sizes: dict[str, int] = {}
        for c in pool:
            if c.card is not None:
                card_sizes[c.card] = card_sizes.get(c.card, 0) + 1
        tree = _Tree(pool)

        members: dict[ClassKey, list[Candidate]] = {}
        for c in pool:
            # A card holding one available device behaves exactly like no card.
            card = c.card if c.card is not None and card_sizes[c.card] > 1 else None
            members.setdefault(ClassKey(c.numa_node, card, tree.position(c.pci_path)), []).append(c)
        keyed = sorted(members.items(), key=lambda item: item[1][0].device_id)

        numa_nodes = sorted({k.numa_node for k, _ in keyed if k.numa_node is not None})
        numa_bits: dict[int | None, int] = {n: 1 << i for i, n in enumerate(numa_nodes)}
        cards = sorted({k.card for k, _ in keyed if k.card is not None})
        card_bits: dict[str | None, int] = {n: 1 << i for i, n in enumerate(cards)}
        root_index: dict[str, int] = {}
        node_index: dict[Path, int] = {}
        self.ids: list[tuple[str, ...]] = []
        self.first_id: list[str] = []
        self.numa_bit: list[int] = []   # or UNKNOWN_NUMA
        self.card_bit: list[int] = []   # or NO_CARD
        self.root: list[int] = []       # or NO_ROOT
        self.depth: list[int] = []
        self.intra: list[int] = []      # distance between two devices of the class
        self.attach: list[int] = []
        """The tree node each class hangs from (NO_NODE: unreadable path)."""
        for key, devices in keyed:
            self.ids.append(tuple(d.device_id for d in devices))
            self.first_id.append(devices[0].device_id)
            self.numa_bit.append(numa_bits.get(key.numa_node, UNKNOWN_NUMA))
            self.card_bit.append(card_bits.get(key.card, NO_CARD))
            path = devices[0].pci_path or ()
            self.root.append(root_index.setdefault(path[0], len(root_index)) if path else NO_ROOT)
            self.depth.append(len(path))
            self.intra.append(key.position.intra)
            # Below `shared` the devices of a class part ways, one device per node.
            shared = key.position.shared
            for i in range(1, len(shared) + 1):
                node_index.setdefault(shared[:i], len(node_index))
            self.attach.append(node_index[shared] if shared else NO_NODE)
        self.n_roots = len(root_index)
        self.size = [len(ids) for ids in self.ids]
        # Tree nodes: every prefix of a class's `shared` path, so a node's parent is a node too.
        self.node_parent = [node_index.get(path[:-1], NO_NODE) for path in node_index]
        self.node_root = [root_index[path[0]] for path in node_index]
        self.chain = [intra // 2 for intra in self.intra]
        """Hops from `attach` down to each device of the class, through nodes no other device shares."""
        rank = {c.device_id: i for i, c in enumerate(pool)}
        self.ranks = [tuple(rank[i] for i in ids) for ids in self.ids]
        """Each device's place in the pool's ID order."""


class _Tree:
    """Device counts over the PCI forest: how many devices sit at or below each node."""

    def __init__(self, pool: tuple[Candidate, ...]) -> None:
        self.subtree: dict[Path, int] = {}
        at: dict[Path, int] = {}
        for c in pool:
            if c.pci_path:
                at[c.pci_path] = at.get(c.pci_path, 0) + 1
        # Endpoints first, then each parent once for all the endpoints below it.
        parents: dict[Path, int] = {}
        for path, count in at.items():
            self.subtree[path] = self.subtree.get(path, 0) + count
            if len(path) > 1:
                parents[path[:-1]] = parents.get(path[:-1], 0) + count
        for parent, count in parents.items():
            for i in range(1, len(parent) + 1):
                prefix = parent[:i]
                self.subtree[prefix] = self.subtree.get(prefix, 0) + count

    def position(self, path: Path | None) -> Position:
        """A device alone below some node T is, to every other device, just "h hops below T's parent";
        devices sharing an endpoint, or with devices below them, keep their exact path."""
        if not path:
            return Position((), 0)
        if self.subtree[path] > 1 or len(path) == 1:
            return Position(path, 0)
        # Climb while the device is still alone below the node.
        top = len(path)
        while top > 2 and self.subtree[path[:top - 1]] == 1:
            top -= 1
        return Position(path[:top - 1], 2 * (len(path) - top + 1))


@functools.lru_cache(maxsize=_CACHED_POOLS)
def tables_for(pool: tuple[Candidate, ...]) -> PoolTables:
    """The tables for a pool, found again by value: a scan gives the servicer new candidates of the same devices."""
    return PoolTables(pool)
