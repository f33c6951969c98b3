"""Per-component lower bounds on every completion of a partial selection.

Invariant: the stages of `Bounds.stages` yield, component by component, a value
no completion within the limits can beat, and after each value the limits that
still hold for any completion meeting that value and all earlier ones exactly.
Each stage may therefore use the narrowing of the stages before it; nothing
here is ever more optimistic than `relaxations` allows, so pruning on these
bounds never loses an optimum.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from resource_worker.placement import relaxations as rx
from resource_worker.placement.pool import PoolTables
from resource_worker.placement.state import RequestClasses, State

INFEASIBLE = float("inf")


class Limits(NamedTuple):
    """Classes still open, with the most and the fewest devices each may still give."""

    open_classes: list[int]
    most: list[int]
    fewest: list[int]


class Stage(NamedTuple):
    """One component's bound, and the limits that hold once it is met (None: those before)."""

    value: object
    limits: Limits | None


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
    """A tree node as a meeting point: devices it can supply, the closest pair meeting exactly there."""

    supply: int
    closest: int


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


def _limits(open_classes: list[int], most: list[int], fewest: list[int]) -> Limits:
    """A snapshot: later narrowing works on the lists, never on one already handed out."""
    return Limits([c for c in open_classes if most[c]], most[:], fewest[:])


def _after_groups(opened: rx.OpenedGroups | None, current: Limits, most: list[int], fewest: list[int],
                  to_choose: int) -> Limits:
    """The limits once a group bound is met: as it narrowed them, with classes pinned where that fixes them."""
    if opened is not None and (rx.pin(current.open_classes, to_choose, most, fewest) or opened.narrowed):
        return _limits(current.open_classes, most, fewest)
    return current


class Bounds:
    """The bound stages of one request, with what nodes of its search share: per root, shapes and bounds."""

    def __init__(self, tables: PoolTables, classes: RequestClasses) -> None:
        self.tables = tables
        self.classes = classes
        self.work = 0
        """Work units spent: one per stage, plus the classes and levels the distance bounds walk."""
        # Keyed on a root's chosen devices and limits: its shape, and its bound per number of devices added.
        self._root_shapes: dict[tuple, RootShape] = {}
        self._root_bounds: dict[tuple, RootBound | None] = {}

    def stages(self, state: State, limits: Limits, to_choose: int) -> Iterator[Stage]:
        """The limits that hold, then, component by component, a lower bound for every completion.

        Each stage assumes the previous bounds are met exactly, which narrows
        what the next one may use. A stage that finds nothing feasible yields
        infinity and ends.
        """
        tables = self.tables
        most, fewest = limits.most[:], limits.fewest[:]
        current = _limits(limits.open_classes, most, fewest)
        self.work += 1
        yield Stage(None, current)
        if not rx.feasible(current.open_classes, to_choose, most, fewest):
            # Swap order can ask more of a class's neighbours than is left to choose.
            yield Stage(INFEASIBLE, None)
            return

        # 1. NUMA: unknown-NUMA devices only when known ones run out, then as few nodes as possible.
        unknowns = rx.fewest_unknown(current.open_classes, tables.numa_bit, to_choose, most, fewest)
        if unknowns.narrowed:
            current = _limits(current.open_classes, most, fewest)
        self.work += 1
        yield Stage(state.unknown + unknowns.count, current)
        numa = rx.open_groups(unknowns.known_classes, tables.numa_bit, state.numa_mask, to_choose - unknowns.count,
                              most, fewest)
        current = _after_groups(numa, current, most, fewest, to_choose)
        if numa is None:
            yield Stage(INFEASIBLE, None)
            return
        self.work += 1
        yield Stage(numa.groups, current)

        # 2. Cards, filled largest first after the cards already paid for.
        cards = rx.open_groups(current.open_classes, tables.card_bit, state.card_mask, to_choose, most, fewest)
        current = _after_groups(cards, current, most, fewest, to_choose)
        if cards is None:
            yield Stage(INFEASIBLE, None)
            return
        self.work += 1
        yield Stage(state.solo + cards.groups, current)

        # 3. PCI roots: readable paths first, then as few cross-root pairs as possible.
        unreadable = rx.fewest_unknown(current.open_classes, tables.depth, to_choose, most, fewest)  # depth 0: no path
        if unreadable.narrowed:
            current = _limits(current.open_classes, most, fewest)
        self.work += 1
        yield Stage(state.unreadable + unreadable.count, current)
        readable_count = to_choose - unreadable.count
        quotas = self._root_quotas(state, unreadable.known_classes, readable_count, numa, cards, most, fewest)
        if quotas is None:
            yield Stage(INFEASIBLE, None)
            return
        squares, quota_list = quotas
        total = sum(state.roots) + readable_count
        if quota_list is not None and rx.pin_roots(tables.root, unreadable.known_classes, quota_list, most, fewest):
            current = _limits(current.open_classes, most, fewest)
        self.work += 1
        yield Stage((total * total - squares) // 2, current)

        yield from self._distance_stages(state, current, to_choose, readable_count, quota_list)

    def _root_quotas(self, state: State, readable: list[int], readable_count: int, numa: rx.OpenedGroups,
                     cards: rx.OpenedGroups, most: list[int], fewest: list[int]) -> tuple[int, list[list[int]] | None] \
            | None:
        """The most of sum(devices per root ** 2) and every quota of devices per root reaching it.

        A completion meeting the NUMA and card bounds opens only so many new
        NUMA nodes and cards: under each root it can add no more than the room
        of its paid groups and of that many of its largest other groups.
        """
        tables = self.tables
        floor = [0] * tables.n_roots
        spare = [0] * tables.n_roots
        by_root: list[list[int]] = [[] for _ in range(tables.n_roots)]
        for c in readable:
            floor[tables.root[c]] += fewest[c]
            spare[tables.root[c]] += most[c] - fewest[c]
            by_root[tables.root[c]].append(c)
        for x, classes in enumerate(by_root):
            if spare[x]:
                spare[x] = min(spare[x],
                               rx.room_in_new_groups(classes, tables.card_bit, cards.paid, cards.new_groups, most,
                                                     fewest),
                               rx.room_in_new_groups(classes, tables.numa_bit, numa.paid, numa.new_groups, most,
                                                     fewest) if all(tables.numa_bit[c] for c in classes) else spare[x])
        splits = rx.best_splits([a + b for a, b in zip(state.roots, floor)], spare, readable_count - sum(floor))
        if splits is None:
            return None
        # Squares are strictly convex, so only the best splits reach the bound:
        # a completion meeting it spreads its devices over the roots as one of them does.
        quotas = None if splits.best is None else [[f + a for f, a in zip(floor, split)] for split in splits.best]
        return splits.squares, quotas

    def _distance_stages(self, state: State, current: Limits, to_choose: int, readable_count: int,
                         quotas: list[list[int]] | None) -> Iterator[Stage]:
        """4. PCI distances: first the maximum, then, leaving out devices that would exceed it, the sum; 5. IDs."""
        tables = self.tables
        most, fewest = current.most[:], current.fewest[:]
        readable = [c for c in current.open_classes if tables.root[c] >= 0]
        options = self._distance_options(state, readable, readable_count, quotas, most, fewest) \
            if rx.feasible(current.open_classes, to_choose, most, fewest) else []
        limit = min((option.max_distance for option in options), default=INFEASIBLE)
        if limit == INFEASIBLE:
            yield Stage(INFEASIBLE, None)
            return
        options = [option for option in options if option.max_distance == limit]
        narrowed = False
        for c in readable:
            if state.slot_max[c] > limit or tables.intra[c] > limit and most[c] > max(fewest[c], 1):
                most[c] = fewest[c] if state.slot_max[c] > limit else max(fewest[c], 1)
                narrowed = True
        if quotas is not None:
            rx.pin_roots(tables.root, readable, [option.quota for option in options], most, fewest)
        current = _limits(current.open_classes, most, fewest)
        self.work += 1
        yield Stage(limit, current)
        if narrowed:
            readable = [c for c in current.open_classes if tables.root[c] >= 0]
            quotas = None if quotas is None else [option.quota for option in options]
            options = self._distance_options(state, readable, readable_count, quotas, most, fewest) \
                if rx.feasible(current.open_classes, to_choose, most, fewest) else []
        lowest = min((option.distance_sum for option in options), default=INFEASIBLE)
        if lowest == INFEASIBLE:
            yield Stage(INFEASIBLE, None)
            return
        if quotas is not None:
            options = [option for option in options if option.distance_sum == lowest]
            quotas = [option.quota for option in options]
            rx.pin_roots(tables.root, readable, quotas, most, fewest)
            if len(options) == 1:
                self._fill_tree(readable, options[0], most, fewest)
        current = _limits(current.open_classes, most, fewest)
        self.work += 1
        yield Stage(lowest, current)
        self.work += 1
        yield Stage(self._smallest_selection(state, current, to_choose, readable_count, options), None)

    def _smallest_selection(self, state: State, current: Limits, to_choose: int, readable_count: int,
                            options: list[DistanceOption]) -> tuple[str, ...]:
        """5. IDs: the chosen ones plus the smallest IDs still allowed, taking from each root as many as a
        remaining split gives it, and from the tree as that split's sum bound fills it."""
        tables = self.tables
        open_classes, most, fewest = current
        chosen = self.classes.chosen(state.picks)
        if options[0].quota is None:
            return tuple(sorted(chosen + self._smallest_ids(open_classes, to_choose, most, fewest)))
        by_root: dict[int, list[int]] = {}
        for c in open_classes:
            by_root.setdefault(tables.root[c], []).append(c)
        chosen += self._smallest_ids(by_root.get(-1, []), to_choose - readable_count, most, fewest)
        readable = [c for c in open_classes if tables.root[c] >= 0]

        def smallest(option: DistanceOption) -> tuple[str, ...]:
            room, low = most, fewest
            if len(options) > 1:
                room, low = most[:], fewest[:]
                self._fill_tree(readable, option, room, low)
            return tuple(sorted(chosen + [i for x, count in enumerate(option.quota) if count
                                          for i in self._smallest_ids(by_root.get(x, []), count, room, low)]))
        return min(map(smallest, options))

    def _fill_tree(self, classes: list[int], option: DistanceOption, most: list[int], fewest: list[int]) -> None:
        """Narrows the limits to the completions that fill the tree as this option's sum bound does."""
        for c in classes:
            if not option.empty.isdisjoint(self.tables.above[c]):
                most[c] = fewest[c]
            elif not option.full.isdisjoint(self.tables.above[c]):
                fewest[c] = most[c]

    def _smallest_ids(self, classes: list[int], count: int, most: list[int], fewest: list[int]) -> list[str]:
        """The IDs `classes` must give within these limits and their smallest other IDs allowed, `count` in all."""
        given = self.classes
        ids = [i for c in classes for i in given.ids(c, fewest[c])]
        offered = [i for c in classes
                   for i in given.free_ids[c][fewest[c] - given.mandatory[c]:most[c] - given.mandatory[c]]]
        return ids + sorted(offered)[:max(0, count - len(ids))]

    def _distance_options(self, state: State, readable: list[int], readable_count: int,
                          quotas: list[list[int]] | None, most: list[int], fewest: list[int]) -> list[DistanceOption]:
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
        self.work += len(classes)
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
        self.work += len(shape.levels)
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
