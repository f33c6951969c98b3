"""The least largest distance k devices under one PCI root can have: exact on the tree, shared down the search.

Invariant: a `Diameters` floor never exceeds the largest distance of any
selection within the limits it was built from (and, when asked with a card
budget, of any selection opening no more cards than that). A set of devices
with largest distance D has a centre on the tree (a node, the middle of an
edge, or a point on the private chain of bridges above one of its devices)
that no device of the set is more than D/2 from; trying every such centre
with the nearest devices to each gives the least D, so a search node can take
it as a floor for its own, cheaper, bound.
"""

from __future__ import annotations

import bisect
import heapq
from typing import NamedTuple

from resource_worker.placement.pool import PoolTables

_FAR = 1 << 30


class _Centre(NamedTuple):
    reach: dict[int, int]
    """Per class, the distance from the centre to its devices: doubled for a node or an edge's middle, plain
    from the chain's top for a chain."""
    chain: int | None
    """For a point on the chain above a device of this class: the class."""


class _Reach(NamedTuple):
    """What a centre sees of a selection's devices."""

    floor: int
    """How far the forced devices reach."""
    distances: list[int]
    """The distances of the optional devices, nearest first, one entry per distance."""
    covered: list[int]
    """How many optional devices lie within each of those distances."""


class Diameters:
    """Floors on the largest distance under one root, for selections within (most, fewest) limits."""

    def __init__(self, tables: PoolTables, root: int, most: list[int], fewest: list[int]) -> None:
        self.tables = tables
        self.most, self.fewest = most, fewest
        self.classes = [c for c in range(len(tables.size)) if tables.root[c] == root and most[c]]
        self.forced = sum(fewest[c] for c in self.classes)
        self.total = sum(most[c] for c in self.classes)
        self.centres = list(self._centres(root))
        self.reaches = [self._reach(centre) for centre in self.centres]
        self.cost = len(self.centres) * len(self.classes)
        """Classes looked at so far: the work it took."""
        self._ranks: dict[int, list[tuple[int, int]]] = {}
        self._with_cards: dict[tuple[int, int, int], int] = {}

    def _centres(self, root: int):
        tables, classes = self.tables, self.classes
        for v in tables.root_nodes[root]:
            from_v = tables.distances_from(v)
            yield _Centre({c: 2 * from_v[c] for c in classes}, None)
            parent = tables.parent_node[v]
            if parent >= 0:
                from_parent = tables.distances_from(parent)
                yield _Centre({c: 2 * (from_v[c] if v in tables.above_set[c] else from_parent[c]) + 1
                               for c in classes}, None)
        # A point on the private chain of bridges above a device a of class c: every other device x is
        # h + dist(top, x) from a.
        for c in classes:
            if tables.intra[c]:
                from_top = tables.distances_from(tables.node_of_shared[c])
                yield _Centre({d: from_top[d] for d in classes}, c)

    def _room(self, centre: _Centre, c: int) -> int:
        """The optional devices of class c that may be among a centre's set (on a chain, a aside)."""
        return self.most[c] - self.fewest[c] - (c == centre.chain and not self.fewest[c])

    def _reach(self, centre: _Centre) -> _Reach:
        # On a chain the device a may be the forced one of its class.
        chain, reach = centre.chain, centre.reach
        floor = max((reach[c] for c in self.classes if self.fewest[c] and c != chain), default=0)
        if chain is not None and self.fewest[chain] > 1:
            floor = max(floor, reach[chain])
        by_distance: dict[int, int] = {}
        for c in self.classes:
            room = self._room(centre, c)
            if room > 0:
                by_distance[reach[c]] = by_distance.get(reach[c], 0) + room
        distances = sorted(by_distance)
        covered, running = [], 0
        for d in distances:
            running += by_distance[d]
            covered.append(running)
        return _Reach(floor, distances, covered)

    def _value(self, centre: _Centre, radius: int) -> int:
        """The largest distance a set around a centre with everything within `radius` of it has at least.

        On a chain, with R the farthest other device from the top, a is the chain's length h plus R from
        it, and two others may be 2R apart: max(h, R) + R.
        """
        if centre.chain is None:
            return radius
        return max(centre.reach[centre.chain], radius) + radius

    def _needed(self, centre: _Centre, k: int) -> int:
        """Optional devices a set of k holds besides the forced ones (and, on a chain, besides a)."""
        return k - self.forced - (centre.chain is not None)

    def _at(self, index: int, k: int) -> int:
        """What one centre allows for k devices, cards aside."""
        centre, reach = self.centres[index], self.reaches[index]
        needed = self._needed(centre, k)
        if needed <= 0:
            return self._value(centre, reach.floor)
        tier = bisect.bisect_left(reach.covered, needed)
        if tier == len(reach.covered):
            return _FAR
        return self._value(centre, max(reach.floor, reach.distances[tier]))

    def _ranked(self, k: int) -> list[tuple[int, int]]:
        """(what the centre allows for k devices, cards aside; centre), least first."""
        if k not in self._ranks:
            self.cost += len(self.centres)
            self._ranks[k] = sorted((self._at(i, k), i) for i in range(len(self.centres)))
        return self._ranks[k]

    def floor_with_cards(self, k: int, paid: int, new_cards: int) -> int:
        """The least largest distance of k devices of which those outside the cards in `paid` open at most
        `new_cards` cards (a device with no card counting as one). Each centre allows no less for k devices
        than for fewer, so neither does the least over them."""
        if k < 2:
            return 0
        k = min(k, self.total)
        key = k, paid, new_cards
        if key not in self._with_cards:
            ranked = self._ranked(k)
            plain = ranked[0][0] if ranked and ranked[0][0] < _FAR else 0
            best = _FAR
            # Centres in the order of what they allow regardless of cards: one that cannot beat the best
            # found so far even then is not looked at.
            for value, index in ranked:
                if value >= best:
                    break
                self.cost += len(self.classes)
                best = min(best, self._with_budget(index, k, paid, new_cards))
            self._with_cards[key] = max(plain, best if best < _FAR else plain)
        return self._with_cards[key]

    def _with_budget(self, index: int, k: int, paid: int, new_cards: int) -> int:
        """What one centre allows for k devices when only `new_cards` cards beyond `paid` may open."""
        centre = self.centres[index]
        needed = self._needed(centre, k)
        floor = self.reaches[index].floor
        if needed <= 0:
            return self._value(centre, floor)
        card_bit = self.tables.card_bit
        tiers: dict[int, list[int]] = {}
        for c in self.classes:
            if self._room(centre, c) > 0:
                tiers.setdefault(centre.reach[c], []).append(c)
        paid_room = 0
        rooms: dict[int, int] = {}
        singles = 0
        for radius in sorted(tiers):
            for c in tiers[radius]:
                bit = card_bit[c]
                if not bit:
                    singles += self._room(centre, c)
                elif bit & paid:
                    paid_room += self._room(centre, c)
                else:
                    rooms[bit] = rooms.get(bit, 0) + self._room(centre, c)
            largest = heapq.nlargest(new_cards, list(rooms.values()) + [1] * min(singles, new_cards))
            if paid_room + sum(largest) >= needed:
                return self._value(centre, max(floor, radius))
        return _FAR
