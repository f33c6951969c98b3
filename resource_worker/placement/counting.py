"""The counting components, settled exactly: NUMA node sets, cards, and the cards a place needs per device count.

Invariant: nothing here is a bound; every value is the exact optimum of what it
names. `numa_options` lists every way a selection can meet the unknown-NUMA and
NUMA-node optima (or says it stopped short); `fewest_bundles` is the least number
of cards any selection within some limits uses; `bundles_by_count` gives that
least number for every device count of one place. Covering a count with the
fewest bundles is exact by taking the largest bundles first once the bundles a
selection must pay for anyway are counted.

A "bundle" is what the card component counts: a card bundles its devices, and a
device with no card is a bundle of its own. `bundle_of[c]` says how class c
counts: FREE (its card is paid for already), SOLO (each of its devices is a
bundle of its own) or a card's bit (the class's devices count once together
with every other class of that card). FREE < SOLO < every card's bit.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

from resource_worker.placement.pool import NO_CARD, UNKNOWN_NUMA, PoolTables

FREE = -1
SOLO = NO_CARD
"""So a pool's `card_bit` reads as `bundle_of` before any card is paid for."""
# Sets of NUMA nodes tried when listing the ways to meet the NUMA optimum: listing them is not
# counted as search work, so it is bounded here (8 NUMA nodes of equal room give 70 sets).
_NUMA_SETS_TRIED = 1024


class Limits(NamedTuple):
    """The fewest and the most devices each class gives; a class with most 0 is out."""

    fewest: tuple[int, ...]
    most: tuple[int, ...]


class NumaOptions(NamedTuple):
    unknown: int
    """The least number of unknown-NUMA devices a selection holds."""
    nodes: int
    """The least number of NUMA nodes a selection then uses."""
    options: list[Limits]
    """One per set of NUMA nodes meeting both: every selection within those limits meets them."""
    complete: bool
    """Whether `options` holds every such set."""


class BundleCounts(NamedTuple):
    """How the bundles of some classes fill: what any selection pays, what it holds for free, what it may open."""

    paid: int
    """Bundles every selection within the limits uses: cards with a forced device, forced devices with no card."""
    capacity: int
    """Devices a selection takes without opening another bundle."""
    rooms: list[int]
    """Devices each other bundle would add, largest first."""
    fewest_devices: int
    most_devices: int


def numa_options(tables: PoolTables, mandatory: Sequence[int], size: int) -> NumaOptions:
    """Every way to meet the NUMA optimum: the fewest unknown-NUMA devices, then a smallest set of NUMA
    nodes with room for the rest (when known devices run short: all of them, and unknown ones).

    Every selection scoring that optimum keeps within one of the options (as far as the sets tried reach).
    """
    classes = range(len(tables.size))
    known = [c for c in classes if tables.numa_bit[c] != UNKNOWN_NUMA]
    unknown_forced = sum(mandatory[c] for c in classes if tables.numa_bit[c] == UNKNOWN_NUMA)
    known_room = sum(tables.size[c] for c in known)
    if size - known_room > unknown_forced:
        # Not enough known devices: all of them, and as few unknown ones as that leaves.
        fewest = tuple(tables.size[c] if tables.numa_bit[c] != UNKNOWN_NUMA else mandatory[c] for c in classes)
        return NumaOptions(size - known_room, len({tables.numa_bit[c] for c in known}),
                           [Limits(fewest, tuple(tables.size))], True)
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
    options = []
    complete = True
    for tried, subset in enumerate(itertools.combinations(unpaid, extra)):
        if tried == _NUMA_SETS_TRIED:
            complete = False
            break
        if sum(room[bit] for bit in subset) >= need:
            nodes = paid | sum(subset)
            most = tuple(tables.size[c] if tables.numa_bit[c] & nodes else mandatory[c] for c in classes)
            options.append(Limits(tuple(mandatory), most))
    return NumaOptions(unknown_forced, paid.bit_count() + extra, options, complete)


def bundle_counts(classes: Sequence[int], bundle_of: Sequence[int], limits: Limits) -> BundleCounts:
    """The bundles of `classes` within `limits`, as `fewest_bundles` and `bundles_by_count` read them."""
    fewest, most = limits
    forced_cards: set[int] = set()
    for c in classes:
        if fewest[c] and bundle_of[c] > SOLO:
            forced_cards.add(bundle_of[c])
    paid = len(forced_cards)
    capacity = 0
    card_rooms: dict[int, int] = {}
    solo_rooms = 0
    low = high = 0
    for c in classes:
        low += fewest[c]
        high += most[c]
        bundle = bundle_of[c]
        if bundle == FREE or bundle in forced_cards:
            capacity += most[c]
        elif bundle == SOLO:
            paid += fewest[c]
            capacity += fewest[c]
            solo_rooms += most[c] - fewest[c]
        elif most[c]:
            card_rooms[bundle] = card_rooms.get(bundle, 0) + most[c]
    rooms = sorted(card_rooms.values(), reverse=True) + [1] * solo_rooms
    return BundleCounts(paid, capacity, rooms, low, high)


def fewest_bundles(classes: Sequence[int], bundle_of: Sequence[int], limits: Limits, target: int) -> int | None:
    """The least bundles a selection of `target` devices of `classes` within `limits` uses; None if none exists."""
    counts = bundle_counts(classes, bundle_of, limits)
    if not counts.fewest_devices <= target <= counts.most_devices:
        return None
    need = target - counts.capacity
    opened = 0
    for room in counts.rooms:
        if need <= 0:
            break
        need -= room
        opened += 1
    return counts.paid + opened


def bundles_by_count(classes: Sequence[int], bundle_of: Sequence[int], limits: Limits) -> list[int | None]:
    """`fewest_bundles` for every target from 0 to the most devices the classes give (None: impossible)."""
    counts = bundle_counts(classes, bundle_of, limits)
    result: list[int | None] = [None] * counts.fewest_devices
    opened, reach = 0, counts.capacity
    rooms = iter(counts.rooms)
    for target in range(counts.fewest_devices, counts.most_devices + 1):
        while target > reach:
            reach += next(rooms)
            opened += 1
        result.append(counts.paid + opened)
    return result
