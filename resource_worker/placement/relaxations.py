"""Pure relaxations the bounds are made of: each says the least a component can cost, or the most it can save.

Invariant: every function here is optimistic. A value it returns is never worse
than what any selection within the given limits reaches, and what it narrows
(`most`, `fewest`: the most and the fewest devices each class may still give)
only drops counts that no selection meeting its bound exactly can use. A bound
that overestimated would prune the optimum; the property tests hold each of
them to brute force.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

# With this many roots or fewer that can still grow, the cross-root bound
# tries every extreme split and is exact.
EXACT_ROOTS = 5
# With this many tree nodes or fewer that already hold chosen devices and can
# still grow, a level's pair bound is exact.
EXACT_NODES = 3


def pairs(count: int) -> int:
    return count * (count - 1) // 2


class Unknowns(NamedTuple):
    """How few devices must lack some knowledge (NUMA node, PCI path), and what that leaves."""

    count: int
    known_classes: list[int]
    """The classes that have it and may still give devices."""
    narrowed: bool


class OpenedGroups(NamedTuple):
    """Fewest groups (NUMA nodes, cards) a selection opens, counting those already paid for."""

    groups: int
    new_groups: int
    """Groups to open beyond the paid ones: unpaid groups and optional devices without a group."""
    paid: int
    """Bits of the groups paid for: chosen already or holding a forced device."""
    narrowed: bool


class Splits(NamedTuple):
    """The most of sum(n_root ** 2) a completion reaches, and every split of new devices over roots reaching it."""

    squares: int
    best: list[tuple[int, ...]] | None
    """None when there were too many roots to try: then `squares` is only an upper bound."""


class LevelPairs(NamedTuple):
    """An upper bound on the device pairs below one level's tree nodes, and what meeting it requires."""

    pairs: int
    empty: tuple[int, ...]
    """Nodes that get no device in any allocation reaching the bound."""
    full: tuple[int, ...]
    """Nodes that get all their room in any allocation reaching the bound."""


class Reach(NamedTuple):
    """How the devices of some classes stand to the chosen ones, whatever their number."""

    forced: int
    most: int
    forced_max: int
    """The farthest distance from a forced device to a chosen one; -1 when none."""
    forced_sum: int
    by_sum: list[tuple[int, int]]
    """(total distance to the chosen devices, devices) of the optional ones, nearest first."""
    by_max: list[tuple[int, int]]
    """(farthest distance to a chosen device, devices) of the optional ones, nearest first."""


def feasible(classes: list[int], to_choose: int, most: list[int], fewest: list[int]) -> bool:
    return sum(fewest[c] for c in classes) <= to_choose <= sum(most[c] for c in classes)


def pin(classes: list[int], picks: int, most: list[int], fewest: list[int]) -> bool:
    """The classes must give exactly `picks` devices: at either extreme that fixes each class.

    Returns whether a limit changed.
    """
    low = high = 0
    for c in classes:
        low += fewest[c]
        high += most[c]
    if low == high or picks not in (low, high):
        return False
    for c in classes:
        if picks == low:
            most[c] = fewest[c]
        else:
            fewest[c] = most[c]
    return True


def fewest_unknown(classes: list[int], known: list, to_choose: int, most: list[int], fewest: list[int],
                   known_optional: int | None = None) -> Unknowns:
    """How few of `to_choose` devices must be unknown in some respect: only as many as the known ones leave.

    `known[c]` is truthy when class c is known. `known_optional`, when given, is
    the most optional known devices a selection may take (less than all their
    room when, say, only so many cards may still open). Pins both sides to that number.
    """
    known_classes, blind = [], []
    known_room = blind_fewest = 0
    for c in classes:
        if known[c]:
            known_classes.append(c)
            known_room += most[c]
        else:
            blind.append(c)
            blind_fewest += fewest[c]
    if known_optional is not None:
        known_room = min(known_room, sum(fewest[c] for c in known_classes) + known_optional)
    count = max(blind_fewest, to_choose - known_room)
    if pin(blind, count, most, fewest) | pin(known_classes, to_choose - count, most, fewest):
        return Unknowns(count, [c for c in known_classes if most[c]], True)
    return Unknowns(count, known_classes, False)


def open_groups(classes: list[int], group: list[int], paid: int, target: int,
                most: list[int], fewest: list[int]) -> OpenedGroups | None:
    """Fewest groups that hold `target` devices of `classes`: those paid for, then the largest.

    `group[c]` is the bit of the group of class c; 0 makes each device a group
    of its own. Narrows the limits to the completions using that few groups.
    None when the classes cannot hold `target` devices.
    """
    room: dict[int, int] = {}
    single_fewest = single_most = 0
    for c in classes:
        bit = group[c]
        if bit:
            room[bit] = room.get(bit, 0) + most[c]
            if fewest[c]:
                paid |= bit
        else:
            single_fewest += fewest[c]
            single_most += most[c]
    need = target - single_fewest - sum(v for bit, v in room.items() if bit & paid)
    unpaid = sorted([v for bit, v in room.items() if not bit & paid] + [1] * (single_most - single_fewest),
                    reverse=True)
    extra = needed(unpaid, need)
    if extra is None:
        return None
    # Opening `extra` groups gives at most the largest ones' room, so the
    # devices chosen fall short of all the room in use by at most `slack`:
    # a paid group's class gives all but `slack`, and a group too small to
    # reach `need` with the largest others stays closed.
    slack = sum(unpaid[:extra]) - need
    smallest = unpaid[extra - 1] - slack if extra else float("inf")
    narrowed = False
    for c in classes:
        bit = group[c]
        if bit & paid:
            if most[c] - slack > fewest[c]:
                fewest[c] = most[c] - slack
                narrowed = True
        elif most[c] > fewest[c] and (room[bit] if bit else 1) < smallest:
            most[c] = fewest[c]
            narrowed = True
    return OpenedGroups(paid.bit_count() + single_fewest + extra, extra, paid, narrowed)


def room_in_new_groups(classes: list[int], group: list[int], paid: int, new_groups: int,
                       most: list[int], fewest: list[int]) -> int:
    """The most optional devices of `classes` a selection opening only `new_groups` more groups can take.

    All the room of paid groups, then the largest unpaid groups' room as seen
    within `classes` (a group may hold other devices elsewhere; counting only
    these keeps the figure an upper bound for them).
    """
    paid_room = 0
    unpaid: dict[int, int] = {}
    singles = 0
    for c in classes:
        spare = most[c] - fewest[c]
        if not spare:
            continue
        bit = group[c]
        if not bit:
            singles += spare
        elif bit & paid:
            paid_room += spare
        else:
            unpaid[bit] = unpaid.get(bit, 0) + spare
    rooms = sorted(unpaid.values(), reverse=True)
    # Each optional device without a group is a group of one: it fills a slot as the smallest groups do.
    rooms += [1] * min(singles, new_groups)
    rooms.sort(reverse=True)
    return paid_room + sum(rooms[:new_groups])


def pin_roots(root: list[int], classes: list[int], quotas: list[list[int]], most: list[int], fewest: list[int]) -> bool:
    """Pin each root whose number of new devices is the same in every remaining split."""
    changed = False
    for x in range(len(quotas[0]) if quotas else 0):
        if len({quota[x] for quota in quotas}) == 1:
            changed |= pin([c for c in classes if root[c] == x], quotas[0][x], most, fewest)
    return changed


def needed(rooms_desc: list[int], need: int) -> int | None:
    """How many groups, largest first, hold `need` devices; None if they cannot."""
    count = 0
    for room in rooms_desc:
        if need <= 0:
            break
        need -= room
        count += 1
    return count if need <= 0 else None


def best_splits(base: list[int], spare: list[int], grow: int) -> Splits | None:
    """Most of sum(n_x ** 2) after adding `grow` devices on top of `base`, at most `spare` per root.

    None when the roots cannot take `grow`.
    """
    if not 0 <= grow <= sum(spare):
        return None
    growing = [x for x, s in enumerate(spare) if s > 0]
    squares = sum(b * b for b in base)
    if grow == 0:
        return Splits(squares, [(0,) * len(base)])
    if len(growing) <= EXACT_ROOTS:
        # A convex sum over a box cut by one equation peaks at a vertex: every
        # root at its minimum or its maximum, except at most one.
        best, splits = -1, []
        for mask in range(1 << len(growing)):
            full = [x for i, x in enumerate(growing) if mask >> i & 1]
            left = grow - sum(spare[x] for x in full)
            if left < 0:
                continue
            partial = [None] if left == 0 else [x for x in growing if x not in full and left < spare[x]]
            for y in partial:
                split = [0] * len(base)
                for x in full:
                    split[x] = spare[x]
                if y is not None:
                    split[y] = left
                value = squares + sum(2 * base[x] * a + a * a for x, a in enumerate(split))
                if value > best:
                    best, splits = value, [tuple(split)]
                elif value == best:
                    splits.append(tuple(split))
        return Splits(best, sorted(set(splits)))
    # Two relaxations, each an upper bound: everything on the fullest growing
    # root ignoring its limit, or the largest possible roots filled first
    # ignoring what they already hold.
    top = max(base[x] for x in growing)
    unlimited = squares + 2 * top * grow + grow * grow
    left = sum(base) + grow
    filled = 0
    for room in sorted((b + s for b, s in zip(base, spare)), reverse=True):
        take = min(room, left)
        filled += take * take
        left -= take
    return Splits(min(unlimited, filled), None)


def fill(rooms_desc: list[int], count: int) -> int:
    """Most pairs inside groups when `count` devices go into empty groups of these sizes: largest first."""
    total = 0
    for room in rooms_desc:
        if count < 2:
            break
        take = min(room, count)
        total += pairs(take)
        count -= take
    return total


# Pure, and the same few levels recur across the nodes of a search and across requests.
@functools.lru_cache(maxsize=4096)
def level_pairs(nodes: tuple[tuple[int, int], ...], added: int) -> LevelPairs:
    """An upper bound on the pairs below a level's nodes once `added` devices join.

    `nodes` holds (devices held, room left) per node; a node with h devices
    gaining n has C(h + n, 2) pairs. Exact unless many nodes that already
    hold devices can grow. With the bound, when two nodes at most can grow:
    the nodes that get nothing, and those that get all their room, in every
    allocation reaching it (which need not place all `added` devices).
    """
    total = sum(pairs(held) for held, _ in nodes)
    growing = [i for i, (_, room) in enumerate(nodes) if room]
    if len(growing) <= 2:
        return _two_nodes(nodes, growing, added, total)
    grown = [nodes[i] for i in growing if nodes[i][0]]
    fresh = sorted((nodes[i][1] for i in growing if not nodes[i][0]), reverse=True)
    if not grown:
        # Empty nodes: the most pairs come from filling the largest first.
        return LevelPairs(total + fill(fresh, added), (), ())
    if len(grown) > EXACT_NODES:
        # Each node's gain is convex in what it gets, so below its chord: a
        # fractional knapsack over whole nodes bounds the sum.
        left = added
        for gain, room in sorted(((held * room + pairs(room), room) for held, room in map(nodes.__getitem__, growing)),
                                 key=lambda item: item[0] / item[1], reverse=True):
            take = min(room, left)
            total += -(-gain * take // room)
            left -= take
        return LevelPairs(total, (), ())
    # on_empty[b]: pairs from b devices on the empty nodes, largest first.
    on_empty = [0] * (added + 1)
    placed, full = 0, 0
    for room in fresh:
        for j in range(1, min(room, added - placed) + 1):
            on_empty[placed + j] = full + pairs(j)
        placed, full = min(placed + room, added), full + pairs(room)
    for rest in range(placed + 1, added + 1):
        on_empty[rest] = full
    # The gains are convex, so the best lies at a vertex: every held node gets
    # nothing or all its room but at most one, the rest goes to the empty nodes.
    best = 0
    for mask in range(1 << len(grown)):
        full_nodes = [grown[i] for i in range(len(grown)) if mask >> i & 1]
        left = added - sum(room for _, room in full_nodes)
        if left < 0:
            continue
        gain = sum(pairs(held + room) - pairs(held) for held, room in full_nodes)
        best = max(best, gain + on_empty[left])
        for i, (held, room) in enumerate(grown):
            if not mask >> i & 1:
                for a in range(1, min(room, left + 1)):
                    best = max(best, gain + pairs(held + a) - pairs(held) + on_empty[left - a])
    return LevelPairs(total + best, (), ())


def _two_nodes(nodes: tuple[tuple[int, int], ...], growing: list[int], added: int, total: int) -> LevelPairs:
    """`level_pairs` when at most two nodes can grow: the gains are convex, so one of two extremes wins."""
    if not growing:
        return LevelPairs(total, (), ())
    placed = min(added, sum(nodes[i][1] for i in growing))
    first, last = growing[0], growing[-1]
    ends = [min(nodes[first][1], placed), placed - min(nodes[last][1], placed)] if first != last else [placed]
    gains = [pairs(nodes[first][0] + a) - pairs(nodes[first][0]) +
             (pairs(nodes[last][0] + placed - a) - pairs(nodes[last][0]) if first != last else 0) for a in ends]
    best = max(gains)
    given = [(a, placed - a) for a, gain in zip(ends, gains) if gain == best]
    ends_of = (first, last)[:len(growing)]
    empty = tuple(i for k, i in enumerate(ends_of) if all(g[k] == 0 for g in given))
    # A lone device in a node adds no pair, so it may as well go elsewhere:
    # only a node whose last device adds pairs must be filled.
    full = tuple(i for k, i in enumerate(ends_of) if sum(nodes[i]) >= 2 and all(g[k] == nodes[i][1] for g in given))
    return LevelPairs(total + best, empty, full)


def reach(classes: list[int], slot_sum: list[int], slot_max: list[int], most: list[int], fewest: list[int]) -> Reach:
    forced = largest = forced_sum = 0
    forced_max = -1
    optional = []
    for c in classes:
        forced += fewest[c]
        largest += most[c]
        forced_sum += fewest[c] * slot_sum[c]
        if fewest[c] and slot_max[c] > forced_max:
            forced_max = slot_max[c]
        if most[c] > fewest[c]:
            optional.append((slot_sum[c], slot_max[c], most[c] - fewest[c]))
    by_sum = sorted((total, n) for total, _, n in optional)
    by_max = sorted((worst, n) for _, worst, n in optional)
    return Reach(forced, largest, forced_max, forced_sum, by_sum, by_max)


class Nearest(NamedTuple):
    """The least (max, sum) of distances to the chosen devices some added devices can have."""

    max_distance: int
    distance_sum: int


def nearest(near: Reach, added: int) -> Nearest | None:
    """Least (max, sum) of distances to the chosen devices when `added` devices come from these classes."""
    if not near.forced <= added <= near.most:
        return None
    total, worst = near.forced_sum, near.forced_max
    left = added - near.forced
    for distance, n in near.by_sum:
        if left <= 0:
            break
        total += min(n, left) * distance
        left -= n
    left = added - near.forced
    for distance, n in near.by_max:
        if left <= 0:
            break
        worst = max(worst, distance)
        left -= n
    return Nearest(max(worst, 0), total)
