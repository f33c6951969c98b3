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
from resource_worker.placement.pool import PoolTables
from resource_worker.placement.state import RequestClasses

# NUMA node sets tried; each costs one greedy fill.
_MAX_NUMA_SETS = 4


def _pairs(count: int) -> int:
    return count * (count - 1) // 2


def first_selection(tables: PoolTables, classes: RequestClasses, size: int, choices: list[Limits]) -> list:
    """The score values (IDs last) of the best of a few greedy fills, one per way to meet the NUMA optimum
    (`counting.numa_options`, roomiest first)."""
    best: list | None = None
    for fewest, most in choices[:_MAX_NUMA_SETS]:
        forced = list(fewest)
        allowed = [c for c, (low, high) in enumerate(zip(fewest, most, strict=True)) if high > low]
        values = _fill(tables, classes, forced, allowed, _anchor(tables, forced, allowed), size)
        if best is None or values < best:
            best = values
    assert best is not None
    return best


def _anchor(tables: PoolTables, forced: list[int], allowed: list[int]) -> int | None:
    """The root to fill first: the one the forced devices use most, else the roomiest one."""
    held = [0] * tables.n_roots
    room = [0] * tables.n_roots
    for c, count in enumerate(forced):
        if count and tables.root[c] >= 0:
            held[tables.root[c]] += count
    for c in allowed:
        if tables.root[c] >= 0:
            room[tables.root[c]] += tables.size[c] - forced[c]
    if not tables.n_roots:
        return None
    return min(range(tables.n_roots), key=lambda root: (-held[root], -room[root], root))


def _fill(tables: PoolTables, classes: RequestClasses, forced: list[int], allowed: list[int], anchor: int | None,
          size: int) -> list:
    counts = forced
    need = size - sum(counts)
    links = {c: pairs for tree in forest(tables) for c, pairs in tree.links.items()}
    # Cards: the forced ones are paid; new ones are opened roomiest first while they are still needed.
    open_cards = 0
    for c, count in enumerate(forced):
        if count:
            open_cards |= tables.card_bit[c]
    rooms: dict[int, int] = {}
    for c in allowed:
        bit = tables.card_bit[c]
        if bit and not bit & open_cards:
            rooms[bit] = rooms.get(bit, 0) + tables.size[c] - counts[c]
    free_room = sum(tables.size[c] - counts[c] for c in allowed if tables.card_bit[c] & open_cards)
    lacking = need - free_room
    for bit in sorted(rooms, key=lambda bit: (-rooms[bit], bit)):
        if lacking <= 0 or rooms[bit] < 2:
            break
        open_cards |= bit
        lacking -= rooms[bit]
    # Devices on open cards first, then devices without a card, each the cheapest next to those chosen:
    # per class, the total and farthest distance to the chosen devices; per root, how many there are.
    slot_sum = [0] * len(counts)
    slot_max = [-1] * len(counts)
    in_root = [0] * tables.n_roots
    taken = [0] * len(counts)
    # The score as it adds up: unknown NUMA, NUMA nodes, solo devices, cards, unreadable, cross-root, max, sum.
    score = [0, 0, 0, 0, 0, 0, 0, 0]

    def take(cls: int, count: int) -> None:
        already = taken[cls]
        taken[cls] += count
        score[0] += 0 if tables.numa_bit[cls] else count
        score[1] |= tables.numa_bit[cls]
        score[2] += 0 if tables.card_bit[cls] else count
        score[3] |= tables.card_bit[cls]
        root = tables.root[cls]
        if root < 0:
            score[4] += count
            return
        score[5] += count * (sum(in_root) - in_root[root])
        in_root[root] += count
        pairs_inside = _pairs(already + count) - _pairs(already)
        score[6] = max(score[6], slot_max[cls], tables.intra[cls] if pairs_inside else 0)
        score[7] += count * slot_sum[cls] + pairs_inside * tables.intra[cls]
        for other, distance in links[cls]:
            slot_sum[other] += count * distance
            if distance > slot_max[other]:
                slot_max[other] = distance

    for c, count in enumerate(forced):
        if count:
            take(c, count)
    while need > 0:
        best_key, best_class = None, -1
        readable = sum(in_root)
        for c in allowed:
            already = taken[c]
            if already >= tables.size[c]:
                continue
            root = tables.root[c]
            key = (0 if tables.card_bit[c] & open_cards else 1,
                   root < 0,
                   readable - in_root[root] if root >= 0 else 0,
                   root != anchor,
                   max(slot_max[c], tables.intra[c] if already else 0) if root >= 0 else 0,
                   slot_sum[c] + already * tables.intra[c] if root >= 0 else 0,
                   tables.first_id[c])
            if best_key is None or key < best_key:
                best_key, best_class = key, c
        if best_class < 0:
            break  # numa_options leaves room enough; were it not so, the answer check would say so
        # A class's devices are alike and close: take what it has, up to what is still needed.
        count = min(tables.size[best_class] - taken[best_class], need)
        if tables.card_bit[best_class]:
            open_cards |= tables.card_bit[best_class]
        need -= count
        take(best_class, count)
    ids = tuple(sorted(i for c, count in enumerate(taken) if count for i in classes.ids(c, count)))
    return [score[0], score[1].bit_count(), score[2] + score[3].bit_count(), score[4], score[5], score[6], score[7],
            ids]
