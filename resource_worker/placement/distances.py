"""Lower bounds on the PCI distances of every completion, per way to split the new devices over roots.

Invariant: for a split of new devices over roots, `DistanceBounds.options`
never returns a larger (max, sum) than any completion spreading its devices
that way reaches, and the tree nodes it says must stay empty or fill up do so
in every completion meeting its sum bound exactly. Per root the bound is
built level by level over the tree and shared by the search nodes that agree
on that root.
"""

from __future__ import annotations

from typing import NamedTuple

from resource_worker.placement import relaxations as rx
from resource_worker.placement.pool import PoolTables
from resource_worker.placement.state import State, WorkMeter


class DistanceOption(NamedTuple):
    """Lower bounds on the final (max, sum) of distances for one way to split new devices over roots."""

    quota: list[int] | None
    """New devices per root; None when the split is not known."""
    max_distance: int
    distance_sum: int
    empty: set[int]
    """Tree nodes that get no optional device in any completion meeting the sum bound exactly."""
    full: set[int]
    """Tree nodes that get all their optional devices in any such completion."""


class LevelShape(NamedTuple):
    weight: int
    nodes: list[int]
    counts: tuple[tuple[int, int], ...]
    """(devices held, room left) per node."""


class Meeting(NamedTuple):
    """A tree node as the lowest common ancestor of the devices added."""

    supply: int
    """The devices below it that may still be chosen."""
    closest: int
    """The distance of the closest pair meeting exactly there."""


class RootShape(NamedTuple):
    """What the open classes of one root offer, whatever the number of devices added."""

    near: rx.Reach
    levels: list[LevelShape]
    meetings: list[Meeting]
    forced: int
    forced_depth: int
    optional_depths: list[tuple[int, int]]
    """(depth, devices) of the optional devices, shallowest first."""


class RootBound(NamedTuple):
    max_distance: int
    distance_sum: int
    empty: set[int]
    full: set[int]


class DistanceBounds:
    """The distance bounds of one request, with what nodes of its search share: per root, shapes and bounds."""

    def __init__(self, tables: PoolTables, meter: WorkMeter) -> None:
        self.tables = tables
        self.meter = meter
        # Keyed on a root's chosen devices and limits: its shape, and its bound per number of devices added.
        self._root_shapes: dict[tuple, RootShape] = {}
        self._root_bounds: dict[tuple, RootBound | None] = {}

    def fill_tree(self, classes: list[int], option: DistanceOption, most: list[int], fewest: list[int]) -> None:
        """Narrows the limits to the completions that fill the tree as this option's sum bound does."""
        for c in classes:
            if not option.empty.isdisjoint(self.tables.above[c]):
                most[c] = fewest[c]
            elif not option.full.isdisjoint(self.tables.above[c]):
                fewest[c] = most[c]

    def options(self, state: State, readable: list[int], readable_count: int, quotas: list[list[int]] | None,
                most: list[int], fewest: list[int]) -> list[DistanceOption]:
        """Lower bounds on the final (max, sum) distances, per possible split between roots."""
        tables = self.tables
        if quotas is None:
            # Unknown split between roots: only distances to chosen devices count.
            near = rx.nearest(rx.reach(readable, state.slot_sum, state.slot_max, most, fewest), readable_count)
            return [] if near is None else [DistanceOption(None, max(state.max_distance, near.max_distance),
                                                           state.distance_sum + near.distance_sum, set(), set())]
        by_root: dict[int, list[int]] = {}
        for c in readable:
            by_root.setdefault(tables.root[c], []).append(c)
        # What some more devices add under a root depends only on what is chosen
        # there and on its classes' limits: other nodes of the search share it.
        keys: dict[int, tuple] = {}
        options = []
        for quota in quotas:
            worst, total = state.max_distance, state.distance_sum
            empty: set[int] = set()
            full: set[int] = set()
            for x, added in enumerate(quota):
                if not added:
                    continue
                if x not in keys:
                    classes = by_root.get(x, [])
                    keys[x] = (x, tuple(sorted(pick for pick in state.picks if tables.root[pick.cls] == x)),
                               tuple((c, most[c], fewest[c]) for c in classes))
                    if keys[x] not in self._root_shapes:
                        self._root_shapes[keys[x]] = self._root_shape(state, classes, most, fewest)
                key = keys[x], added
                if key not in self._root_bounds:
                    self._root_bounds[key] = self._root_bound(state, x, self._root_shapes[keys[x]], added)
                bound = self._root_bounds[key]
                if bound is None:
                    break
                worst, total = max(worst, bound.max_distance), total + bound.distance_sum
                empty |= bound.empty
                full |= bound.full
            else:
                options.append(DistanceOption(quota, worst, total, empty, full))
        return options

    def _root_shape(self, state: State, classes: list[int], most: list[int], fewest: list[int]) -> RootShape:
        tables = self.tables
        self.meter.work += len(tables.split) + len(classes)
        held = state.held[:]
        room = [0] * len(tables.split)
        supply = [0] * len(tables.split)
        forced = forced_depth = 0
        for c in classes:
            for v in tables.above[c]:
                held[v] += fewest[c]
                room[v] += most[c] - fewest[c]
                supply[v] += most[c]
            forced += fewest[c]
            forced_depth += fewest[c] * tables.depth[c]
        x = tables.root[classes[0]] if classes else -1
        levels = []
        for level in tables.levels[x] if classes else ():
            nodes = [v for v in level.nodes if held[v] or room[v]]
            levels.append(LevelShape(level.weight, nodes, tuple((held[v], room[v]) for v in nodes)))
        meetings = [Meeting(supply[v], tables.split[v]) for v in {v for c in classes for v in tables.above[c]}
                    if tables.split[v] is not None]
        depths = sorted((tables.depth[c], most[c] - fewest[c]) for c in classes if most[c] > fewest[c])
        near = rx.reach(classes, state.slot_sum, state.slot_max, most, fewest)
        return RootShape(near, levels, meetings, forced, forced_depth, depths)

    def _root_bound(self, state: State, root: int, shape: RootShape, added: int) -> RootBound | None:
        """Lower bound on the (max, sum) of distances `added` more devices bring under `root`."""
        near = rx.nearest(shape.near, added)
        if near is None or added == 1:
            return None if near is None else RootBound(near.max_distance, near.distance_sum, set(), set())
        self.meter.work += len(shape.meetings) + len(shape.levels)
        # The added devices meet at a node that can supply them all.
        inner_max = min((m.closest for m in shape.meetings if m.supply >= added), default=0)
        # For any set of n devices, the distance sum is (n - 1) * (sum of
        # depths) - 2 * (over every node, pairs of devices below it), and a
        # level's pairs are bounded level by level; forced devices count as held.
        depths = shape.forced_depth
        left = added - shape.forced
        for depth, room in shape.optional_depths:
            take = min(room, left)
            depths += take * depth
            left -= take
        together = 0
        empty: set[int] = set()
        full: set[int] = set()
        for level in shape.levels:
            bound = rx.level_pairs(level.counts, added - shape.forced)
            together += level.weight * bound.pairs
            empty.update(level.nodes[i] for i in bound.empty)
            full.update(level.nodes[i] for i in bound.full)
        n = state.roots[root] + added
        joint = (n - 1) * (state.root_depth[root] + depths) - 2 * together - state.root_sum[root]
        if near.distance_sum > joint:
            # Meeting this bound says nothing about how the tree fills.
            return RootBound(max(near.max_distance, inner_max), near.distance_sum, set(), set())
        # Meeting it exactly takes each level's most pairs and the least depth.
        return RootBound(max(near.max_distance, inner_max), joint, empty, full)
