"""A fast greedy answer, for when the exact search runs out of work before it completes one.

Invariant: `first_selection` returns a complete selection the request allows
(every mandatory device, `size` devices in all), built in the score's order:
as few unknown-NUMA devices and NUMA nodes as possible, then devices of cards
already paid for before new cards (the roomiest first), then, device by
device, the one adding the least to unreadable paths, cross-root pairs and
distances. It is asked for only when the search is cut; the answer is then the
better of it and what the search completed, and is checked like any other.
"""

from __future__ import annotations

from resource_worker.placement.counting import Limits
from resource_worker.placement.geometry import forest
from resource_worker.placement.pool import NO_CARD, NO_ROOT, UNKNOWN_NUMA, PoolTables
from resource_worker.placement.score import Score
from resource_worker.placement.state import RequestClasses

# NUMA node sets tried; each costs one greedy fill.
_MAX_NUMA_SETS = 4

Links = dict[int, list[tuple[int, int]]]
"""Per class of a readable path, every other class of its root with the distance between their devices."""


def _pairs(count: int) -> int:
    return count * (count - 1) // 2


def first_selection(tables: PoolTables, classes: RequestClasses, size: int, choices: list[Limits]) -> Score:
    """The score of the best of a few greedy fills, one per way to meet the NUMA optimum
    (`counting.numa_options`, roomiest first)."""
    links = {c: pairs for tree in forest(tables) for c, pairs in tree.links.items()}
    best: Score | None = None
    for fewest, most in choices[:_MAX_NUMA_SETS]:
        forced = list(fewest)
        allowed = [c for c, (low, high) in enumerate(zip(fewest, most, strict=True)) if high > low]
        fill = _Fill(tables, links)
        for c, count in enumerate(forced):
            if count:
                fill.take(c, count)
        fill.complete(allowed, _open_cards(tables, forced, allowed, size), _anchor(tables, forced, allowed), size)
        score = fill.score(classes)
        if best is None or score < best:
            best = score
    assert best is not None
    return best


def _anchor(tables: PoolTables, forced: list[int], allowed: list[int]) -> int | None:
    """The root to fill first: the one the forced devices use most, else the roomiest one."""
    held = [0] * tables.n_roots
    room = [0] * tables.n_roots
    for c, count in enumerate(forced):
        if count and tables.root[c] != NO_ROOT:
            held[tables.root[c]] += count
    for c in allowed:
        if tables.root[c] != NO_ROOT:
            room[tables.root[c]] += tables.size[c] - forced[c]
    if not tables.n_roots:
        return None
    return min(range(tables.n_roots), key=lambda root: (-held[root], -room[root], root))


def _open_cards(tables: PoolTables, forced: list[int], allowed: list[int], size: int) -> int:
    """The cards a fill takes devices of: the forced ones, paid for; new ones, roomiest first, while the
    devices of the open ones still fall short."""
    open_cards = 0
    for c, count in enumerate(forced):
        if count:
            open_cards |= tables.card_bit[c]
    rooms: dict[int, int] = {}
    for c in allowed:
        bit = tables.card_bit[c]
        if bit != NO_CARD and not bit & open_cards:
            rooms[bit] = rooms.get(bit, 0) + tables.size[c] - forced[c]
    free_room = sum(tables.size[c] - forced[c] for c in allowed if tables.card_bit[c] & open_cards)
    lacking = size - sum(forced) - free_room
    for bit in sorted(rooms, key=lambda bit: (-rooms[bit], bit)):
        if lacking <= 0 or rooms[bit] < 2:
            break
        open_cards |= bit
        lacking -= rooms[bit]
    return open_cards


class _Fill:
    """One greedy fill: the devices taken from each class, and the score's components as they add up."""

    def __init__(self, tables: PoolTables, links: Links) -> None:
        self.tables = tables
        self.links = links
        classes = len(tables.size)
        self.taken = [0] * classes
        self.distance_to = [0] * classes
        """Per class, the total distance from one of its devices to the devices taken."""
        self.farthest = [0] * classes
        """Per class, the farthest distance from one of its devices to a device taken (0 while none is)."""
        self.in_root = [0] * tables.n_roots
        self.unknown_numa = 0
        self.numa_bits = 0
        self.solo_devices = 0
        """Devices taken with no card: each counts as a card."""
        self.card_bits = 0
        self.unreadable_paths = 0
        self.cross_root_pairs = 0
        self.max_distance = 0
        self.distance_sum = 0

    def take(self, cls: int, count: int) -> None:
        tables = self.tables
        already = self.taken[cls]
        self.taken[cls] += count
        if tables.numa_bit[cls] == UNKNOWN_NUMA:
            self.unknown_numa += count
        self.numa_bits |= tables.numa_bit[cls]
        if tables.card_bit[cls] == NO_CARD:
            self.solo_devices += count
        self.card_bits |= tables.card_bit[cls]
        root = tables.root[cls]
        if root == NO_ROOT:
            self.unreadable_paths += count
            return
        in_root = self.in_root
        self.cross_root_pairs += count * (sum(in_root) - in_root[root])
        in_root[root] += count
        pairs_inside = _pairs(already + count) - _pairs(already)
        intra = tables.intra[cls]
        self.max_distance = max(self.max_distance, self.farthest[cls], intra if pairs_inside else 0)
        self.distance_sum += count * self.distance_to[cls] + pairs_inside * intra
        distance_to, farthest = self.distance_to, self.farthest
        for other, distance in self.links[cls]:
            distance_to[other] += count * distance
            if distance > farthest[other]:
                farthest[other] = distance

    def complete(self, allowed: list[int], open_cards: int, anchor: int | None, size: int) -> None:
        """Devices on open cards first, then devices without a card, each class the cheapest next to the
        devices taken; a class's devices are alike and close, so it gives what it has, up to what is needed."""
        tables = self.tables
        need = size - sum(self.taken)
        while need > 0:
            cls = self._cheapest(allowed, open_cards, anchor)
            if cls is None:
                break  # numa_options leaves room enough; were it not so, the answer check would say so
            count = min(tables.size[cls] - self.taken[cls], need)
            if tables.card_bit[cls] != NO_CARD:
                open_cards |= tables.card_bit[cls]
            need -= count
            self.take(cls, count)

    def _cheapest(self, allowed: list[int], open_cards: int, anchor: int | None) -> int | None:
        """The class adding least, in the score's order: an open card, a readable path, fewest cross-root
        pairs, the anchor root, then the largest and the summed distance to the devices taken; then IDs."""
        tables = self.tables
        size, roots, intra, first_id = tables.size, tables.root, tables.intra, tables.first_id
        taken, in_root, distance_to, farthest = self.taken, self.in_root, self.distance_to, self.farthest
        unreadable = NO_ROOT
        readable = sum(in_root)
        best_key, best_class = None, None
        for c in allowed:
            already = taken[c]
            if already >= size[c]:
                continue
            root = roots[c]
            key = (0 if tables.card_bit[c] & open_cards else 1,
                   root == unreadable,
                   readable - in_root[root] if root != unreadable else 0,
                   root != anchor,
                   max(farthest[c], intra[c] if already else 0) if root != unreadable else 0,
                   distance_to[c] + already * intra[c] if root != unreadable else 0,
                   first_id[c])
            if best_key is None or key < best_key:
                best_key, best_class = key, c
        return best_class

    def score(self, classes: RequestClasses) -> Score:
        ids = tuple(sorted(i for c, count in enumerate(self.taken) if count for i in classes.ids(c, count)))
        return Score(unknown_numa=self.unknown_numa, numa_nodes=self.numa_bits.bit_count(),
                     cards=self.solo_devices + self.card_bits.bit_count(), unreadable_paths=self.unreadable_paths,
                     cross_root_pairs=self.cross_root_pairs, max_distance=self.max_distance,
                     distance_sum=self.distance_sum, device_ids=ids)
