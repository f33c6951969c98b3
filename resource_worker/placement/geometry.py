"""The PCI forest of a pool as the exact search walks it: per root, its tree nodes, where each class hangs, and
the centres of the balls that hold every selection of a given largest distance.

Invariant: in a tree, a set of devices has no two devices more than D hops apart
iff it fits in a ball of radius D/2 around a tree node (D even) or the middle of
an edge (D odd). A `Center` lists, for one such centre, the classes of its
root with the least D whose ball holds their devices; so "the classes with
reach <= D" is the ball, and every selection whose largest distance is D lies in
the ball of some centre of `RootTree.centers`. A class hangs `chain` hops below
its `attach` node, each device on a path of its own; when the centre lies on
such a path the ball holds one device of that class only (`Center.pendant`).
A root tree depends on where classes hang, never on how many devices they
hold, so pools that differ only in class sizes share it; it never changes.
"""

from __future__ import annotations

import functools
from functools import cached_property
from operator import add
from typing import NamedTuple

from resource_worker.placement.pool import NO_NODE, NO_ROOT, PoolTables

# Root trees kept: those of the pools whose tables are kept (`pool.tables_for`), and some more.
_CACHED_ROOTS = 32

NO_PENDANT = -1
"""`Center.pendant` of a centre on no class's own path."""


class Center(NamedTuple):
    """One centre. Flat tuples of numbers: kept for as long as the pool, they cost the garbage collector nothing."""

    reaches: tuple[int, ...]
    """Ascending: the class `classes[i]` is in the ball of diameter D when `reaches[i]` is at most D."""
    classes: tuple[int, ...]
    pendant: int
    """NO_PENDANT, or the class the centre's path belongs to: at most one of its devices is in the ball."""
    limit: int | None
    """Diameters from which this centre's balls are held by another's (pendant centres only); None: none."""
    by_class: tuple[int, ...]
    """Each class's reach, in the order of `RootTree.classes`."""


class Shape(NamedTuple):
    """Where the classes of one root hang: all a root tree depends on."""

    nodes: tuple[tuple[int, int], ...]
    """(node, parent) for each tree node of the root; parent NO_NODE for the root's own node."""
    classes: tuple[tuple[int, int, int], ...]
    """(class, attach node, chain) for each class under the root."""


class RootTree:
    """One PCI root: its nodes children first, what hangs from each, and (when asked for) its centres."""

    def __init__(self, root: int, shape: Shape) -> None:
        self.root = root
        self.classes = [c for c, _, _ in shape.classes]
        self.index = {c: i for i, c in enumerate(self.classes)}
        """Each class's place in `classes`."""
        self.attach = {c: node for c, node, _ in shape.classes}
        self.chain = {c: chain for c, _, chain in shape.classes}
        self.parent = dict(shape.nodes)
        self.children: dict[int, list[int]] = {v: [] for v, _ in shape.nodes}
        for v, parent in shape.nodes:
            if parent != NO_NODE:
                self.children[parent].append(v)
            else:
                self.top = v
        self.hanging: dict[int, list[int]] = {v: [] for v, _ in shape.nodes}
        for c in self.classes:
            self.hanging[self.attach[c]].append(c)
        # Children before parents: the order a tree dynamic program folds the nodes in.
        self.postorder: list[int] = []
        stack = [(self.top, False)]
        while stack:
            v, done = stack.pop()
            if done:
                self.postorder.append(v)
                continue
            stack.append((v, True))
            stack.extend((child, False) for child in self.children[v])

    @cached_property
    def hops(self) -> dict[int, list[int]]:
        """Per node, the hops to each class's attach node (in the order of `classes`)."""
        parent = self.parent
        attach = [self.attach[c] for c in self.classes]
        # In the reverse of a postorder walk a node's subtree is the span from the node to its last descendant.
        first = {v: tick for tick, v in enumerate(reversed(self.postorder))}
        last: dict[int, int] = {}
        for v in self.postorder:
            last[v] = max([first[v]] + [last[child] for child in self.children[v]])
        depth: dict[int, int] = {}
        for v in reversed(self.postorder):
            depth[v] = depth[parent[v]] + 1 if parent[v] != NO_NODE else 0
        spans = [first[a] for a in attach]
        hops = {self.top: [depth[a] for a in attach]}
        for v in reversed(self.postorder):
            if v != self.top:
                # One hop down from the parent: nearer to what lies below, farther from the rest.
                low, high = first[v], last[v]
                hops[v] = [h - 1 if low <= span <= high else h + 1
                           for h, span in zip(hops[parent[v]], spans, strict=True)]
        return hops

    @cached_property
    def centers(self) -> list[Center]:
        """Every tree node, every edge's middle, and the path of every class whose devices hang apart; less those
        whose balls another centre's hold at every diameter: a node with classes in one direction only (the
        next node that way is nearer to all of them), an edge with classes on one side only, a path with no
        class nearer to its device than the device is to its attach node."""
        chain = [self.chain[c] for c in self.classes]
        within: dict[int, int] = {}
        for v in self.postorder:
            within[v] = len(self.hanging[v]) + sum(within[child] for child in self.children[v])
        total = len(self.classes)
        hops = self.hops
        # Devices all at even or all at odd depths are an even number of hops apart: every largest distance is
        # even, so balls around the middle of an edge are never needed.
        depth_of_top = hops[self.top]
        odd = len({(h + k) % 2 for h, k in zip(depth_of_top, chain, strict=True)}) > 1
        centers = []
        for v in self.postorder:
            parent = self.parent[v]
            directions = sum(1 for child in self.children[v] if within[child]) + (within[v] < total)
            if self.hanging[v] or directions > 1:
                reaches = [2 * (h + k) for h, k in zip(hops[v], chain, strict=True)]
                centers.append(self._center(reaches, NO_PENDANT, None))
            if odd and parent != NO_NODE and 0 < within[v] < total:
                centers.append(self._center([2 * (min(near, far) + k) + 1 for near, far, k
                                             in zip(hops[v], hops[parent], chain, strict=True)], NO_PENDANT, None))
        for i, a in enumerate(self.classes):
            # One device of `a` at one end; the others within D of it, so within D - chain[a] of attach[a]:
            # pairwise closer than D as long as D < 2 * chain[a] (from there attach[a]'s ball holds them).
            # Of use only if some class hangs nearer to attach[a] than `a`'s devices do (never `a` itself).
            near = hops[self.attach[a]]
            if chain[i] and min(map(add, near, chain)) < chain[i]:
                reaches = [chain[i] + h + k for h, k in zip(near, chain, strict=True)]
                reaches[i] = 0
                centers.append(self._center(reaches, a, 2 * chain[i]))
        return centers

    @cached_property
    def links(self) -> dict[int, list[tuple[int, int]]]:
        """Per class, every other class of the root with the distance between their devices."""
        links = {}
        for a in self.classes:
            near = self.hops[self.attach[a]]
            links[a] = [(c, self.chain[a] + h + self.chain[c])
                        for c, h in zip(self.classes, near, strict=True) if c != a]
        return links

    @cached_property
    def span(self) -> int:
        """No two devices under the root are farther apart: a ball of this diameter holds them all."""
        return max([2 * chain for chain in self.chain.values()] +
                   [distance for pairs in self.links.values() for _, distance in pairs])

    def _center(self, reaches: list[int], pendant: int, limit: int | None) -> Center:
        """A centre from each class's reach (in the order of `classes`)."""
        ordered_reaches, ordered_classes = zip(*sorted(zip(reaches, self.classes, strict=True)), strict=True)
        return Center(ordered_reaches, ordered_classes, pendant, limit, tuple(reaches))


@functools.lru_cache(maxsize=_CACHED_ROOTS)
def _root_tree(root: int, shape: Shape) -> RootTree:
    return RootTree(root, shape)


# As many as pool tables are kept (`pool.tables_for`): a pool's forest lives as long as its tables.
@functools.lru_cache(maxsize=8)
def forest(tables: PoolTables) -> list[RootTree]:
    """The pool's roots, shared with any pool whose classes hang alike (their centres built on first use)."""
    nodes: list[list[tuple[int, int]]] = [[] for _ in range(tables.n_roots)]
    for v, (parent, root) in enumerate(zip(tables.node_parent, tables.node_root, strict=True)):
        nodes[root].append((v, parent))
    classes: list[list[tuple[int, int, int]]] = [[] for _ in range(tables.n_roots)]
    for c, root in enumerate(tables.root):
        if root != NO_ROOT:
            classes[root].append((c, tables.attach[c], tables.chain[c]))
    return [_root_tree(root, Shape(tuple(nodes[root]), tuple(classes[root]))) for root in range(tables.n_roots)]
