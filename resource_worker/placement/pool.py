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


class Level(NamedTuple):
    """Consecutive depths of one root that group the classes alike, counted once with a weight."""

    weight: int
    nodes: list[int]


class Link(NamedTuple):
    other: int
    distance: int


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
        groups = sorted(members.items(), key=lambda item: item[1][0].device_id)

        numa_nodes = sorted({k.numa_node for k, _ in groups if k.numa_node is not None})
        numa_bits = {n: 1 << i for i, n in enumerate(numa_nodes)}
        card_bits = {n: 1 << i for i, n in enumerate(sorted({k.card for k, _ in groups if k.card is not None}))}
        root_index: dict[str, int] = {}
        node_index: dict[Path, int] = {}
        self.ids: list[tuple[str, ...]] = []
        self.first_id: list[str] = []
        self.numa_bit: list[int] = []   # 0: unknown NUMA
        self.card_bit: list[int] = []   # 0: a card per device
        self.root: list[int] = []       # -1: unreadable path
        self.depth: list[int] = []
        self.intra: list[int] = []      # distance between two devices of the class
        self.above: list[list[int]] = []  # tree nodes above every device of the class
        for key, devices in groups:
            self.ids.append(tuple(d.device_id for d in devices))
            self.first_id.append(devices[0].device_id)
            self.numa_bit.append(numa_bits.get(key.numa_node, 0))
            self.card_bit.append(card_bits.get(key.card, 0))
            path = devices[0].pci_path or ()
            self.root.append(root_index.setdefault(path[0], len(root_index)) if path else -1)
            self.depth.append(len(path))
            self.intra.append(key.position.intra)
            # Below `shared` the devices of a class part ways, one device per node.
            shared = key.position.shared
            self.above.append([node_index.setdefault(shared[:i], len(node_index)) for i in range(1, len(shared) + 1)])
        self.n_roots = len(root_index)
        self.size = [len(ids) for ids in self.ids]
        self.chains = self._chains(groups, card_sizes, tree)
        self.links = self._links()
        self.split = [tree.closest_split(node) for node in node_index]
        self.levels = self._levels(node_index, root_index)

    def _chains(self, groups: list[tuple[ClassKey, list[Candidate]]], card_sizes: dict[str, int],
                tree: _Tree) -> list[list[int]]:
        """Classes that swap without changing the NUMA, card and PCI components, in ID order.

        Two such classes without mandatory devices, each alone on its cards (or on
        none) and alone below sibling nodes of the same shape: when one's IDs all
        precede the other's, an optimum gives the first at least as many devices,
        or swapping their counts would give smaller IDs.
        """
        chains: dict[tuple, list[int]] = {}
        for c, (key, devices) in enumerate(groups):
            if key.card is not None and card_sizes[key.card] != len(devices):
                continue
            shared = top = key.position.shared
            if shared:
                if tree.subtree[shared] != len(devices):
                    continue
                while len(top) > 1 and tree.subtree[top[:-1]] == len(devices):
                    top = top[:-1]
            chains.setdefault((key.numa_node, key.card is None, top[:-1], len(top), self.depth[c],
                               key.position.intra, len(devices)), []).append(c)
        return list(chains.values())

    def _links(self) -> list[list[Link]]:
        """Per class, every other class under the same root with the distance between their devices."""
        links: list[list[Link]] = [[] for _ in self.size]
        by_root: list[list[int]] = [[] for _ in range(self.n_roots)]
        for c, x in enumerate(self.root):
            if x >= 0:
                by_root[x].append(c)
        above = [frozenset(nodes) for nodes in self.above]
        for classes in by_root:
            for i, a in enumerate(classes):
                for b in classes[i + 1:]:
                    d = self.depth[a] + self.depth[b] - 2 * len(above[a] & above[b])
                    links[a].append(Link(b, d))
                    links[b].append(Link(a, d))
        return links

    def _levels(self, node_index: dict[Path, int], root_index: dict[str, int]) -> list[list[Level]]:
        """Per root, its tree nodes by depth; consecutive depths that group the classes alike count once."""
        by_depth: list[list[list[int]]] = [[] for _ in range(self.n_roots)]
        for node, v in node_index.items():
            depths = by_depth[root_index[node[0]]]
            while len(depths) < len(node):
                depths.append([])
            depths[len(node) - 1].append(v)
        below: list[list[int]] = [[] for _ in node_index]
        for c, nodes in enumerate(self.above):
            for v in nodes:
                below[v].append(c)
        levels = []
        for depths in by_depth:
            merged: list[Level] = []
            previous = None
            for nodes in depths:
                grouping = sorted(below[v] for v in nodes)
                if grouping == previous:
                    merged[-1] = Level(merged[-1].weight + 1, merged[-1].nodes)
                else:
                    merged.append(Level(1, nodes))
                previous = grouping
            levels.append(merged)
        return levels


class _Tree:
    """Device counts over the PCI forest: below each node, right at it, and how near the nearest is."""

    def __init__(self, pool: tuple[Candidate, ...]) -> None:
        self.subtree: dict[Path, int] = {}
        self.nearest: dict[Path, int] = {}   # depth of the shallowest device below a node
        self.at: dict[Path, int] = {}
        for c in pool:
            if c.pci_path:
                self.at[c.pci_path] = self.at.get(c.pci_path, 0) + 1
        # Endpoints first, then each parent once for all the endpoints below it.
        parents: dict[Path, list[int]] = {}
        for path, count in self.at.items():
            self.subtree[path] = self.subtree.get(path, 0) + count
            self.nearest[path] = len(path)
            if len(path) > 1:
                parents.setdefault(path[:-1], []).append(count)
        for parent, counts in parents.items():
            count, depth = sum(counts), len(parent) + 1
            for i in range(1, len(parent) + 1):
                prefix = parent[:i]
                self.subtree[prefix] = self.subtree.get(prefix, 0) + count
                if self.nearest.get(prefix, depth) >= depth:
                    self.nearest[prefix] = depth
        self.children: dict[Path, list[Path]] = {}
        for node in self.subtree:
            if len(node) > 1:
                self.children.setdefault(node[:-1], []).append(node)

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

    def closest_split(self, node: Path) -> int | None:
        """The distance between the closest two devices whose lowest common ancestor is exactly `node`:
        two right here, one here and one below, or two below through different children."""
        first = second = None
        for child in self.children.get(node, ()):
            offset = self.nearest[child] - len(node)
            if first is None or offset < first:
                first, second = offset, first
            elif second is None or offset < second:
                second = offset
        here = self.at.get(node, 0)
        closest = []
        if here >= 2:
            closest.append(0)
        if here and first is not None:
            closest.append(first)
        if second is not None:
            closest.append(first + second)
        return min(closest, default=None)


@functools.lru_cache(maxsize=_CACHED_POOLS)
def tables_for(pool: tuple[Candidate, ...]) -> PoolTables:
    """The tables for a pool, found again by value: the servicer builds new candidates per request."""
    return PoolTables(pool)
