"""The least sum of distances k devices under one PCI root can have: a dynamic program over the tree.

Invariant: `TreeSums.least(k)` never exceeds the distance sum of any k devices
within the limits it was built from. For devices a, b under one root,
d(a, b) = depth(a) + depth(b) - 2 * depth(lowest common ancestor), so the sum
over the pairs of k devices is (k - 1) * (their depths) - 2 * (over every tree
node, the pairs of them below it): the program decides how many devices each
subtree gets, children first, and is exact for the tree (it knows nothing of
cards or NUMA, which the search bounds elsewhere).
"""

from __future__ import annotations

from resource_worker.placement.pool import PoolTables
from resource_worker.placement.relaxations import pairs

_FAR = float("inf")


def _combine(left: list[float], right: list[float], limit: int) -> tuple[list[float], int]:
    """Min-plus convolution, cut at `limit` devices; with the cells it looked at."""
    size = min(len(left) + len(right) - 1, limit + 1)
    out = [_FAR] * size
    cells = 0
    for i, a in enumerate(left):
        if a == _FAR:
            continue
        cells += min(len(right), size - i)
        for j in range(min(len(right), size - i)):
            value = a + right[j]
            if value < out[i + j]:
                out[i + j] = value
    return out, cells


class TreeSums:
    """Least distance sums under one root, per number of devices, for selections within (most, fewest)."""

    def __init__(self, tables: PoolTables, root: int, most: list[int], fewest: list[int]) -> None:
        self.tables = tables
        self.root = root
        self.most, self.fewest = most, fewest
        self.cost = 0
        """Cells the program filled: the work it took."""
        self._least: dict[int, float] = {}

    def known(self, k: int) -> bool:
        return k in self._least

    def estimate(self, k: int) -> int:
        """At most the cells `least(k)` fills: merging subtrees cut at k devices costs no more than
        (devices under the root) * (k + 1) over the whole tree, plus a cell per node."""
        tables = self.tables
        devices = sum(self.most[c] for c in tables.by_root[self.root])
        return devices * (k + 1) + len(tables.root_nodes[self.root])

    def least(self, k: int) -> float:
        if k not in self._least:
            self._least[k] = self._solve(k)
        return self._least[k]

    def _solve(self, k: int) -> float:
        tables = self.tables
        nodes = sorted(tables.root_nodes[self.root], key=lambda v: -tables.node_depth[v])
        table: dict[int, list[float]] = {}
        for c in range(len(tables.size)):
            if tables.root[c] != self.root or not self.most[c]:
                continue
            # Each device of the class adds its depth, weighted by the k - 1 pairs it is in.
            items = [_FAR] * self.fewest[c] + [(k - 1) * tables.depth[c] * j
                                               for j in range(self.fewest[c], min(self.most[c], k) + 1)]
            at = tables.node_of_shared[c]
            table[at], cells = _combine(table.get(at, [0]), items, k)
            self.cost += cells
        result = [0.0]
        for v in nodes:
            here = table.pop(v, [0])
            # The pairs of devices below v share v as an ancestor.
            here = [value - 2 * pairs(j) for j, value in enumerate(here)]
            parent = tables.parent_node[v]
            if parent < 0:
                result = here
                continue
            table[parent], cells = _combine(table.get(parent, [0]), here, k)
            self.cost += cells + len(here)
        return result[k] if k < len(result) else _FAR
