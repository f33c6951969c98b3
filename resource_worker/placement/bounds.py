"""Per-component lower bounds on every completion of a partial selection.

Invariant: the stages of `Bounds.stages` yield, component by component, a value
no completion within the limits can beat, and after each value the limits that
still hold for any completion meeting that value and all earlier ones exactly.
Each stage may therefore use the narrowing of the stages before it; nothing
here is ever more optimistic than `relaxations` allows, so pruning on these
bounds never loses an optimum.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

from resource_worker.placement import relaxations as rx
from resource_worker.placement.distances import DistanceBounds, DistanceOption
from resource_worker.placement.pool import PoolTables
from resource_worker.placement.state import RequestClasses, State, WorkMeter

INFEASIBLE = float("inf")
# Sets of NUMA nodes looked at when listing the ways to meet the NUMA optimum.
_NUMA_SETS_TRIED = 256


class NumaChoice(NamedTuple):
    forced: list[int]
    """Devices each class must give."""
    allowed: list[int]
    """The classes that may give more than that."""


class NumaChoices(NamedTuple):
    choices: list[NumaChoice]
    complete: bool
    """Whether these are all of them."""


class RootQuotas(NamedTuple):
    squares: int
    """The most of sum(devices per root ** 2) a completion reaches."""
    quotas: list[list[int]] | None
    """New devices per root in every split reaching it; None when there were too many roots to try."""


class Limits(NamedTuple):
    """Classes still open, with the most and the fewest devices each may still give."""

    open_classes: list[int]
    most: list[int]
    fewest: list[int]


class Stage(NamedTuple):
    """One component's bound, and the limits that hold once it is met (None: those before)."""

    value: object
    limits: Limits | None


def numa_choices(tables: PoolTables, classes: RequestClasses, size: int, limit: int) -> NumaChoices:
    """Every way to meet the NUMA component's optimum: the fewest unknown-NUMA devices, then a smallest
    set of NUMA nodes with room for the rest (when known devices run short: all of them, and unknown ones).

    A selection scoring that optimum keeps to one of them, and one that does not can never win over one
    that does, so a search may start from these alone. At most `limit` are returned, roomiest first, with
    whether that is all of them.
    """
    n = len(tables.size)
    mandatory = classes.mandatory
    known = [c for c in range(n) if tables.numa_bit[c]]
    unknown_forced = sum(mandatory[c] for c in range(n) if not tables.numa_bit[c])
    if size - sum(tables.size[c] for c in known) > unknown_forced:
        forced = [tables.size[c] if tables.numa_bit[c] else mandatory[c] for c in range(n)]
        return NumaChoices([NumaChoice(forced, [c for c in range(n) if not tables.numa_bit[c]])], True)
    room: dict[int, int] = {}
    paid = 0
    for c in known:
        room[tables.numa_bit[c]] = room.get(tables.numa_bit[c], 0) + tables.size[c]
        if mandatory[c]:
            paid |= tables.numa_bit[c]
    need = size - unknown_forced - sum(v for bit, v in room.items() if bit & paid)
    unpaid = sorted((bit for bit in room if not bit & paid), key=lambda bit: (-room[bit], bit))
    extra = 0
    while need > sum(room[bit] for bit in unpaid[:extra]):
        extra += 1
    choices = []
    for tried, subset in enumerate(itertools.combinations(unpaid, extra)):
        if len(choices) == limit or tried == _NUMA_SETS_TRIED:
            return NumaChoices(choices, False)
        if sum(room[bit] for bit in subset) >= need:
            nodes = paid | sum(subset)
            choices.append(NumaChoice(mandatory[:], [c for c in known if tables.numa_bit[c] & nodes]))
    return NumaChoices(choices, True)


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

    def __init__(self, tables: PoolTables, classes: RequestClasses, meter: WorkMeter) -> None:
        self.tables = tables
        self.classes = classes
        self.meter = meter
        self.distances = DistanceBounds(tables, meter)

    def stages(self, state: State, limits: Limits, to_choose: int) -> Iterator[Stage]:
        """The limits that hold, then, component by component, a lower bound for every completion.

        Each stage assumes the previous bounds are met exactly, which narrows
        what the next one may use. A stage that finds nothing feasible yields
        infinity and ends.
        """
        tables = self.tables
        most, fewest = limits.most[:], limits.fewest[:]
        current = _limits(limits.open_classes, most, fewest)
        self.meter.work += 1 + len(current.open_classes)
        yield Stage(None, current)
        if not rx.feasible(current.open_classes, to_choose, most, fewest):
            # Swap order can ask more of a class's neighbours than is left to choose.
            yield Stage(INFEASIBLE, None)
            return

        # 1. NUMA: unknown-NUMA devices only when known ones run out, then as few nodes as possible.
        unknowns = rx.fewest_unknown(current.open_classes, tables.numa_bit, to_choose, most, fewest)
        if unknowns.narrowed:
            current = _limits(current.open_classes, most, fewest)
        self.meter.work += 1 + len(current.open_classes)
        yield Stage(state.unknown + unknowns.count, current)
        numa = rx.open_groups(unknowns.known_classes, tables.numa_bit, state.numa_mask, to_choose - unknowns.count,
                              most, fewest)
        current = _after_groups(numa, current, most, fewest, to_choose)
        if numa is None:
            yield Stage(INFEASIBLE, None)
            return
        self.meter.work += 1 + len(current.open_classes)
        yield Stage(numa.groups, current)

        # 2. Cards, filled largest first after the cards already paid for.
        cards = rx.open_groups(current.open_classes, tables.card_bit, state.card_mask, to_choose, most, fewest)
        current = _after_groups(cards, current, most, fewest, to_choose)
        if cards is None:
            yield Stage(INFEASIBLE, None)
            return
        self.meter.work += 1 + len(current.open_classes)
        yield Stage(state.solo + cards.groups, current)

        # 3. PCI roots: readable paths first, then as few cross-root pairs as possible.
        # Depth 0: no path. Only with such devices can the cards and NUMA nodes left force some in.
        with_path = [c for c in current.open_classes if tables.depth[c]]
        capped = self._optional_room(with_path, numa, cards, most, fewest) \
            if len(with_path) < len(current.open_classes) else None
        unreadable = rx.fewest_unknown(current.open_classes, tables.depth, to_choose, most, fewest, capped)
        if unreadable.narrowed:
            current = _limits(current.open_classes, most, fewest)
        self.meter.work += 1 + len(current.open_classes)
        yield Stage(state.unreadable + unreadable.count, current)
        readable_count = to_choose - unreadable.count
        quotas = self._root_quotas(state, unreadable.known_classes, readable_count, numa, cards, most, fewest)
        if quotas is None:
            yield Stage(INFEASIBLE, None)
            return
        squares, quota_list = quotas.squares, quotas.quotas
        total = sum(state.roots) + readable_count
        if quota_list is not None and rx.pin_roots(tables.root, unreadable.known_classes, quota_list, most, fewest):
            current = _limits(current.open_classes, most, fewest)
        self.meter.work += 1 + len(current.open_classes)
        yield Stage((total * total - squares) // 2, current)

        yield from self._distance_stages(state, current, to_choose, readable_count, quota_list)

    def _root_quotas(self, state: State, readable: list[int], readable_count: int, numa: rx.OpenedGroups,
                     cards: rx.OpenedGroups, most: list[int], fewest: list[int]) -> RootQuotas | None:
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
        # With one root the split is known; with more, each root takes no more than the groups left allow.
        for x, classes in enumerate(by_root if tables.n_roots > 1 else ()):
            if spare[x]:
                spare[x] = self._optional_room(classes, numa, cards, most, fewest)
        splits = rx.best_splits([a + b for a, b in zip(state.roots, floor)], spare, readable_count - sum(floor))
        if splits is None:
            return None
        # Squares are strictly convex, so only the best splits reach the bound:
        # a completion meeting it spreads its devices over the roots as one of them does.
        quotas = None if splits.best is None else [[f + a for f, a in zip(floor, split)] for split in splits.best]
        return RootQuotas(splits.squares, quotas)

    def _optional_room(self, classes: list[int], numa: rx.OpenedGroups, cards: rx.OpenedGroups, most: list[int],
                       fewest: list[int]) -> int:
        """The most optional devices of `classes` a completion meeting the NUMA and card bounds takes:
        it opens only so many new NUMA nodes and cards."""
        tables = self.tables
        spare = blind = 0
        for c in classes:
            spare += most[c] - fewest[c]
            if not tables.numa_bit[c]:
                blind += most[c] - fewest[c]
        if not spare:
            return 0
        known = [c for c in classes if tables.numa_bit[c]]
        return min(spare,
                   rx.room_in_new_groups(classes, tables.card_bit, cards.paid, cards.new_groups,
                                         most, fewest),
                   blind + rx.room_in_new_groups(known, tables.numa_bit, numa.paid, numa.new_groups,
                                                 most, fewest))

    def _distance_stages(self, state: State, current: Limits, to_choose: int, readable_count: int,
                         quotas: list[list[int]] | None) -> Iterator[Stage]:
        """4. PCI distances: first the maximum, then, leaving out devices that would exceed it, the sum; 5. IDs."""
        tables = self.tables
        most, fewest = current.most[:], current.fewest[:]
        readable = [c for c in current.open_classes if tables.root[c] >= 0]
        options = self.distances.options(state, readable, readable_count, quotas, most, fewest) \
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
        self.meter.work += 1 + len(current.open_classes)
        yield Stage(limit, current)
        if narrowed:
            readable = [c for c in current.open_classes if tables.root[c] >= 0]
            quotas = None if quotas is None else [option.quota for option in options]
            options = self.distances.options(state, readable, readable_count, quotas, most, fewest) \
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
                self.distances.fill_tree(readable, options[0], most, fewest)
        current = _limits(current.open_classes, most, fewest)
        self.meter.work += 1 + len(current.open_classes)
        yield Stage(lowest, current)
        self.meter.work += 1 + len(current.open_classes)
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
                self.distances.fill_tree(readable, option, room, low)
            return tuple(sorted(chosen + [i for x, count in enumerate(option.quota) if count
                                          for i in self._smallest_ids(by_root.get(x, []), count, room, low)]))
        return min(map(smallest, options))

    def _smallest_ids(self, classes: list[int], count: int, most: list[int], fewest: list[int]) -> list[str]:
        """The IDs `classes` must give within these limits and their smallest other IDs allowed, `count` in all."""
        given = self.classes
        ids = [i for c in classes for i in given.ids(c, fewest[c])]
        offered = [i for c in classes
                   for i in given.free_ids[c][fewest[c] - given.mandatory[c]:most[c] - given.mandatory[c]]]
        return ids + sorted(offered)[:max(0, count - len(ids))]

