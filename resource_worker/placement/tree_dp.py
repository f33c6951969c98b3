"""The PCI part of one place's share of a selection, exactly: a knapsack over the tree of a PCI root.

Invariant: `Knapsack.solve` returns the least (cards, distance sum, -ID weight)
over every choice of `count` devices within the limits given, one integer per
value (`Encoding`), and `Knapsack.counts` the choice reaching it. It is exact
because each term adds up over the tree: the sum of pairwise distances of k
devices is, over every edge, n * (k - n) for the n chosen below it; a class's
devices each add their own path of `chain` edges; a card whose classes all hang
from one node counts once where they meet; the ID tie-break is a sum of
weights (`RequestClasses.free_weights`). Lexicographic order survives addition,
so the least total is made of least parts. A part only keeps the counts that
can still add up to `count` with what the rest of the tree must and can give.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from resource_worker.placement.counting import SOLO
from resource_worker.placement.geometry import RootTree
from resource_worker.placement.state import RequestClasses, WorkMeter


class Decoded(NamedTuple):
    """What one encoded knapsack value holds."""

    bundles: int
    distance_sum: int
    id_weight: int


class Encoding(NamedTuple):
    """A `Decoded` as one integer, bundles * bundle_unit + distance_sum * sum_unit - id_weight: lexicographic
    order survives addition, so the tree program adds and compares plain integers."""

    sum_unit: int
    bundle_unit: int

    @classmethod
    def for_pool(cls, pool_size: int, deepest: int) -> Encoding:
        sum_unit = 1 << pool_size          # above any total ID weight
        largest_sum = pool_size * pool_size * max(deepest, 1)
        return cls(sum_unit, sum_unit << largest_sum.bit_length())

    def decode(self, value: int) -> Decoded:
        units = -(-value // self.sum_unit)
        weight = units * self.sum_unit - value
        bundles, distance_sum = divmod(units, self.bundle_unit // self.sum_unit)
        return Decoded(bundles, distance_sum, weight)


_NOT_A_CLASS = -1
"""`_Part.cls` of a part made of other parts."""


class _Part:
    """The least value of some devices for each count from `low` on, and the parts it was made of."""

    __slots__ = ("cls", "edges", "forced", "left", "low", "right", "supply", "values")

    def __init__(self, low: int, values: list[int], supply: int, forced: int, cls: int = _NOT_A_CLASS,
                 left: _Part | None = None, right: _Part | None = None) -> None:
        self.low = low
        self.values = values
        self.supply = supply
        """The most devices its classes give."""
        self.forced = forced
        """The fewest."""
        self.cls = cls
        self.left = left
        self.right = right
        self.edges = 0
        """Edges above these devices not yet in `values`: the part's devices all pass them."""

    def value(self, count: int) -> int | None:
        index = count - self.low
        return self.values[index] if 0 <= index < len(self.values) else None


class Solution(NamedTuple):
    value: int
    part: _Part
    devices: int


class _Whole(NamedTuple):
    """The selection one `solve` makes as a whole: its devices, and the most and fewest its classes give.
    Each part is clipped to the counts that can still complete it."""

    devices: int
    supply: int
    forced: int


@dataclasses.dataclass(frozen=True)
class Knapsack:
    """The tree dynamic program of one request: classes, their limits and card kinds, the encoding, the meter."""

    classes: RequestClasses
    fewest: Sequence[int]
    bundle_of: Sequence[int]
    chain: Sequence[int]
    encoding: Encoding
    meter: WorkMeter

    @property
    def _unreached(self) -> int:
        """Above every value: the start of every minimum."""
        return self.encoding.bundle_unit << 16

    def solve(self, tree: RootTree | None, most: dict[int, int], count: int) -> Solution | None:
        """The best `count` devices of the classes in `most` (class: the most it may give), all under `tree`,
        or (tree None) with no PCI distances between them."""
        whole = _Whole(count, sum(most.values()), sum(self.fewest[c] for c in most))
        self.meter.charge(len(most) + (0 if tree is None else len(tree.postorder)))
        if not whole.forced <= count <= whole.supply:
            return None
        top: _Part | None
        if tree is None:
            top = self._fold(list(most), [], most, whole)
        else:
            parts: dict[int, _Part] = {}
            for node in tree.postorder:
                below = [parts.pop(child) for child in tree.children[node] if child in parts]
                hanging = [c for c in tree.hanging[node] if c in most]
                if len(below) == 1 and not hanging:
                    # Nothing joins here: the edge up is paid for when something does.
                    joined = below[0]
                elif below or hanging:
                    joined = self._fold(hanging, below, most, whole)
                else:
                    continue
                joined.edges += 1
                parts[node] = joined
            # Edges above every chosen device add n * (count - n) = 0 at n = count.
            top = parts.get(tree.top)
        value = None if top is None else top.value(count)
        return None if value is None or top is None else Solution(value, top, count)

    def counts(self, solution: Solution) -> dict[int, int]:
        """How many devices each class gives in the solution."""
        counts: dict[int, int] = {}
        stack = [(solution.part, solution.devices)]
        while stack:
            part, count = stack.pop()
            left, right = part.left, part.right
            if left is None:  # a class's own part
                self.meter.charge(1)
                if count:
                    counts[part.cls] = count
            elif right is None:
                self.meter.charge(1)
                stack.append((left, count))
            else:
                self.meter.charge(1 + len(left.values))
                target = part.value(count)
                taken = next(n for n in range(left.low, left.low + len(left.values))
                             if (on_left := left.value(n)) is not None
                             and (on_right := right.value(count - n)) is not None and on_left + on_right == target)
                stack.append((left, taken))
                stack.append((right, count - taken))
        return counts

    def _span(self, supply: int, forced: int, whole: _Whole) -> tuple[int, int]:
        """The counts some devices can give in the whole selection: what the rest must and can add."""
        return (max(forced, whole.devices - (whole.supply - supply)),
                min(supply, whole.devices - (whole.forced - forced)))

    def _fold(self, hanging: list[int], below: list[_Part], most: dict[int, int], whole: _Whole) -> _Part:
        """One tree node: the classes hanging from it (each card counted once) and what its children hold,
        each child paying for its edge up to this node. Something hangs from it or lies below it."""
        part: _Part | None = None
        cards: dict[int, _Part] = {}
        for c in hanging:
            leaf = self._leaf(c, most[c], whole)
            bundle = self.bundle_of[c]
            if bundle > SOLO:   # a card's bit
                cards[bundle] = self._merge(cards[bundle], leaf, whole) if bundle in cards else leaf
            else:
                part = leaf if part is None else self._merge(part, leaf, whole)
        bundle_unit = self.encoding.bundle_unit
        for card in cards.values():
            self.meter.charge(len(card.values))
            charged = [value if card.low + i == 0 else value + bundle_unit for i, value in enumerate(card.values)]
            part = self._add(part, self._same(card, charged), whole)
        for child in below:
            part = self._add(part, self._edged(child, whole), whole)
        assert part is not None, "a tree node with nothing below it"
        return part

    def _edged(self, part: _Part, whole: _Whole) -> _Part:
        """The part with the edges above it paid for: n devices below an edge add n * (count - n)."""
        self.meter.charge(len(part.values))
        unit = part.edges * self.encoding.sum_unit
        count = whole.devices
        return self._same(part, [value + n * (count - n) * unit for n, value in enumerate(part.values, part.low)])

    def _add(self, part: _Part | None, other: _Part, whole: _Whole) -> _Part:
        return other if part is None else self._merge(part, other, whole)

    def _leaf(self, cls: int, most: int, whole: _Whole) -> _Part:
        low, high = self._span(most, self.fewest[cls], whole)
        self.meter.charge(2 + max(0, high - low))
        mandatory = self.classes.mandatory[cls]
        weights = self.classes.free_weights[cls]
        per_device = self.chain[cls] * (whole.devices - 1) * self.encoding.sum_unit
        if self.bundle_of[cls] == SOLO:
            per_device += self.encoding.bundle_unit
        return _Part(low, [n * per_device - weights[n - mandatory] for n in range(low, high + 1)], most,
                     self.fewest[cls], cls=cls)

    @staticmethod
    def _same(inner: _Part, values: list[int]) -> _Part:
        return _Part(inner.low, values, inner.supply, inner.forced, left=inner)

    def _merge(self, left: _Part, right: _Part, whole: _Whole) -> _Part:
        supply, forced = left.supply + right.supply, left.forced + right.forced
        first, second = left.values, right.values
        base = left.low + right.low
        low, high = self._span(supply, forced, whole)
        # The parts' own counts are contiguous, so every count between these is reached.
        low, high = max(low, base), min(high, base + len(first) + len(second) - 2)
        # Pairs (i, j) whose counts add up to a count kept: low <= base + i + j <= high.
        rows = [(max(0, low - base - i), min(len(second), high - base - i + 1)) for i in range(len(first))]
        # Besides the pairs, a merge's own lists and its record.
        self.meter.charge(4 + len(first) + high - low + sum(stop - start for start, stop in rows if stop > start))
        values = [self._unreached] * (high - low + 1)
        for x, (start, stop) in zip(first, rows, strict=True):
            k = base + start - low
            for y in second[start:stop]:
                total = x + y
                if total < values[k]:
                    values[k] = total
                k += 1
            base += 1
        return _Part(low, values, supply, forced, left=left, right=right)
