"""The exact search: the score's components settled one after the other, each exactly, within a work budget.

Invariant: every selection with the optimal score lies in one of the branches
this search keeps, and a branch is dropped only when an exact value shows it
scores worse on some component while matching every earlier one. The branches
are: the sets of NUMA nodes meeting the NUMA optimum (`counting`); for each card
whose devices sit in several places (PCI roots, or no readable path), whether
it is opened; and the ways to spread the devices over the places that meet the
card, unreadable-path and cross-root optima. Within a branch each root is
settled on its own: the least largest distance over the balls of its tree
(`balls`), then the least (distance sum, ID weight) by a tree dynamic program
over the widest balls of that diameter (`tree_dp`). When the search ends
without spending its budget its answer is optimal; when the budget cuts it, the
answer is the best complete selection found, or the fallback it was given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import NamedTuple, cast

from resource_worker.placement import counting
from resource_worker.placement.balls import Ball, Balls, Target, feasible_balls
from resource_worker.placement.counting import FREE, Limits
from resource_worker.placement.geometry import RootTree, forest
from resource_worker.placement.pool import NO_CARD, NO_ROOT, PoolTables
from resource_worker.placement.score import Bound, Score, SplitScore
from resource_worker.placement.shares import least_shares
from resource_worker.placement.state import RequestClasses, WorkMeter, WorkSpent
from resource_worker.placement.tree_dp import Encoding, Knapsack, Solution


class Plan(NamedTuple):
    """A branch before the places are split: its limits, how each class counts cards, and cards counted already."""

    limits: Limits
    bundle_of: tuple[int, ...]
    paid: int
    """Cards every selection of the branch uses outside the places' own count: paid for by a forced device,
    or opened by the branch though spread over several places."""


class Split(NamedTuple):
    """A branch with its devices spread over the places: each PCI root, then the devices with no readable path."""

    score: SplitScore
    """The exact card, unreadable-path and cross-root values of every selection of the split."""
    plan: Plan
    counts: tuple[int, ...]
    bundles: tuple[int, ...]
    """The least bundles (cards, devices with no card) each place uses for its count."""


class Settled(NamedTuple):
    """A split's best selection: its encoded (cards, distance sum, ID weight) and each place's part."""

    value: int
    parts: list[Solution | None]


@dataclasses.dataclass(frozen=True)
class Outcome:
    score: Score
    """The answer's score: its devices are `score.device_ids`."""
    proven_optimal: bool
    work: int
    open_bound: Bound | None
    """When cut: the components of the optimum known exactly (the rest None)."""


class Search:
    """One request's exact search."""

    def __init__(self, tables: PoolTables, mandatory: set[str], size: int, budget: int) -> None:
        self.tables = tables
        self.size = size
        self.classes = RequestClasses(tables, mandatory)
        self.meter = WorkMeter(budget)
        self.numa = counting.numa_options(tables, self.classes.mandatory, size)
        self.trees = forest(tables)
        self.pool_classes = [c for c in range(len(tables.size)) if tables.root[c] == NO_ROOT]
        self.encoding = Encoding.for_pool(sum(tables.size), max(tables.depth, default=1))
        self.bound = Bound(self.numa.unknown, self.numa.nodes)
        """The exact optimum of each component, as far as the search got."""
        self.found: Score | None = None
        """The score of the best complete selection found."""
        self._diameters: dict[tuple, Balls | None] = {}
        """Per root, its count and its classes' limits: its least diameter and widest balls."""
        self._keys: dict[tuple[int, int, int], tuple] = {}
        self._settled: dict[tuple, tuple[int, Solution] | None] = {}
        """Per root, its count, its classes' limits and the largest distance: its best part."""

    def run(self, fallback: Callable[[], Score]) -> Outcome:
        """The best selection; `fallback` gives the score of a valid one, asked for only when the search is cut
        before it has settled every branch."""
        proven = self.numa.complete
        try:
            self._search()
        except WorkSpent:
            proven = False
        best = self.found
        if not proven:
            first = fallback()
            best = first if best is None or first < best else best
        assert best is not None, "a finished search found a selection"
        return Outcome(best, proven, self.meter.work, None if proven else self.bound)

    def _search(self) -> None:
        splits = self._best_splits()
        # The card optimum is met by some selection, so some branch meets it: none would be a bug.
        assert splits, "no branch meets the card optimum"
        self._settle_bound(unreadable_paths=splits[0].score.unreadable_paths,
                           cross_root_pairs=splits[0].score.cross_root_pairs)
        # Only the splits reaching the least largest distance matter: each is judged up to the best so far.
        diameter = None
        reached = []
        for split in splits:
            least = self._diameter(split, diameter)
            if least is not None:
                diameter = least if diameter is None else min(diameter, least)
                reached.append((least, split))
        assert diameter is not None, "no branch meets the card count at every root"
        self._settle_bound(max_distance=diameter)
        best = None
        for least, split in reached:
            if least == diameter:
                settled = self._settle(split, diameter)
                if settled is not None and (best is None or settled.value < best.value):
                    best = settled
                    self.found = self._score(split, diameter, settled)
        assert self.found is not None, "no branch reaches the least largest distance"

    def _settle_bound(self, **components: int) -> None:
        """The optimum's next components are known, if every set of NUMA nodes was searched."""
        if self.numa.complete:
            self.bound = self.bound._replace(**components)

    # -- cards and places ----------------------------------------------------------------------

    def _best_splits(self) -> list[Split]:
        """Every branch meeting the optima up to the cross-root pairs."""
        tables = self.tables
        everything = range(len(tables.size))
        # Before any card is paid for, a class counts as its card (counting.SOLO when it has none).
        cards = tables.card_bit
        scored = []
        for option in self.numa.options:
            self.meter.charge(len(tables.size))
            bundles = counting.fewest_bundles(everything, cards, option, self.size)
            assert bundles is not None, "every NUMA option listed holds a selection"
            scored.append((bundles, option))
        fewest = min(bundles for bundles, _ in scored)
        self._settle_bound(cards=fewest)
        splits: list[Split] = []
        for bundles, option in scored:
            if bundles != fewest:
                continue
            for plan in self._plans(option, cards, fewest):
                for split in self._splits(plan):
                    if not splits or split.score < splits[0].score:
                        splits = [split]
                    elif split.score == splits[0].score:
                        splits.append(split)
        return splits

    def _plans(self, option: Limits, cards: list[int], fewest: int) -> Iterator[Plan]:
        """The option with each card spread over several places opened or closed, as far as the card optimum allows.

        Elsewhere a card's classes hang from one node and the tree counts it once; a spread card is decided here:
        opened, its devices cost no more cards; closed, none of them is taken. A partial decision whose least
        card count (the undecided cards counted as usual) misses the optimum is not followed.
        """
        tables = self.tables
        self.meter.charge(len(cards))
        classes = [c for c in range(len(cards)) if option.most[c]]
        paid = {cards[c] for c in classes if option.fewest[c] and cards[c] != NO_CARD}
        places: dict[int, set] = {}
        rooms: dict[int, int] = {}
        for c in classes:
            if cards[c] != NO_CARD and cards[c] not in paid:
                places.setdefault(cards[c], set()).add((tables.root[c], tables.attach[c]))
                rooms[cards[c]] = rooms.get(cards[c], 0) + option.most[c]
        spread = sorted((card for card, where in places.items() if len(where) > 1),
                        key=lambda card: (-rooms[card], card))
        base_bundles = [FREE if cards[c] in paid else cards[c] for c in range(len(cards))]
        # Depth first, opened before closed: (cards decided, of them opened, the cards each class counts, most).
        pending = [(0, 0, base_bundles, list(option.most))]
        while pending:
            decided, opened, bundle_of, most = pending.pop()
            limits = Limits(option.fewest, tuple(most))
            if decided:
                self.meter.charge(len(classes))
                bundles = counting.fewest_bundles(classes, bundle_of, limits, self.size)
                if bundles is None or len(paid) + opened + bundles != fewest:
                    continue
            if decided == len(spread):
                self.meter.charge(len(cards))
                yield Plan(limits, tuple(bundle_of), len(paid) + opened)
                continue
            card = spread[decided]
            members = [c for c in classes if cards[c] == card]
            closed_most = most[:]
            for c in members:
                closed_most[c] = 0
            opened_bundles = bundle_of[:]
            for c in members:
                opened_bundles[c] = FREE
            pending.append((decided + 1, opened, bundle_of, closed_most))
            pending.append((decided + 1, opened + 1, opened_bundles, most))

    def _splits(self, plan: Plan) -> Iterator[Split]:
        """Every way to spread the plan's devices over the places meeting the card, unreadable and cross-root
        optima for it: cards add up over the places, and cross-root pairs fall as the sum of squares per root grows."""
        most = plan.limits.most
        self.meter.charge(len(most))
        # A split's (cards, unreadable devices, -sum of squared devices per root) compared as one integer: each
        # unit above anything the components after it add up to.
        squares_unit = 1 << (self.size * self.size).bit_length()
        cards_unit = squares_unit << (self.size + 1).bit_length()
        places = [[c for c in tree.classes if most[c]] for tree in self.trees] + \
            [[c for c in self.pool_classes if most[c]]]
        used = [index for index, classes in enumerate(places) if classes]
        bundles = {}
        values = []
        for index in used:
            self.meter.charge(len(places[index]) + 1)
            bundles[index] = counting.bundles_by_count(places[index], plan.bundle_of, plan.limits)
            self.meter.charge(len(bundles[index]))
            pool = index == len(places) - 1
            values.append([None if least is None else least * cards_unit + (n * squares_unit if pool else -n * n)
                           for n, least in enumerate(bundles[index][:self.size + 1])])
        for shares in least_shares(values, self.size, self.meter):
            self.meter.charge(len(places))
            counts = [0] * len(places)
            for index, share in zip(used, shares, strict=True):
                counts[index] = share
            unreadable = counts[-1]
            readable = self.size - unreadable
            # A share is a count its place can give (the least sums skip the others): never None here.
            place_bundles = cast(tuple[int, ...], tuple(bundles[index][n] if index in bundles else 0
                                                        for index, n in enumerate(counts)))
            cross = (readable * readable - sum(n * n for n in counts[:-1])) // 2
            score = SplitScore(cards=plan.paid + sum(place_bundles), unreadable_paths=unreadable,
                               cross_root_pairs=cross)
            yield Split(score, plan, tuple(counts), place_bundles)

    # -- each root's distances -----------------------------------------------------------------

    def _root_key(self, tree: RootTree, plan: Plan, count: int) -> tuple:
        """What a root's part of a split depends on: its count and its classes' limits and card kinds."""
        # Plans live as long as the search, so their identities name them.
        memo = (id(plan), tree.root, count)
        if memo not in self._keys:
            fewest, most = plan.limits
            self.meter.charge(len(tree.classes))
            self._keys[memo] = tree.root, count, tuple((fewest[c], most[c], plan.bundle_of[c]) for c in tree.classes)
        return self._keys[memo]

    def _balls(self, tree: RootTree, split: Split, diameter: int | None = None,
               at_most: int | None = None) -> Balls | None:
        """The root's least diameter, if at most `at_most`, and its widest balls (or its widest balls of the
        diameter given)."""
        fewest = split.plan.limits.fewest
        target = Target(split.counts[tree.root], split.bundles[tree.root], sum(fewest[c] for c in tree.classes))
        return feasible_balls(tree, split.plan.limits, split.plan.bundle_of, target, self.meter, diameter, at_most)

    def _diameter(self, split: Split, at_most: int | None) -> int | None:
        """The least largest distance of the split, the largest of its roots' least diameters, if at most
        `at_most` (None: larger)."""
        diameter = 0
        for tree in self.trees:
            count = split.counts[tree.root]
            if count > 1:
                key = self._root_key(tree, split.plan, count)
                # A root found beyond some bound is beyond any later one: bounds only fall.
                if key not in self._diameters:
                    self._diameters[key] = self._balls(tree, split, at_most=at_most)
                least = self._diameters[key]
                if least is None or (at_most is not None and least.diameter > at_most):
                    return None
                diameter = max(diameter, least.diameter)
        return diameter

    def _settle(self, split: Split, diameter: int) -> Settled | None:
        """The split's least (distance sum, ID weight) within this largest distance, with each place's part."""
        plan = split.plan
        knapsack = Knapsack(self.classes, plan.limits.fewest, plan.bundle_of, self.tables.chain, self.encoding,
                            self.meter)
        # The cards counted outside the places, so that the totals of different plans compare.
        total = plan.paid * self.encoding.bundle_unit
        parts: list[Solution | None] = []
        for tree in self.trees:
            count = split.counts[tree.root]
            if not count:
                parts.append(None)
                continue
            key = self._root_key(tree, plan, count) + (diameter,)
            if key not in self._settled:
                self._settled[key] = self._best_in_balls(knapsack, tree, split, diameter)
            best = self._settled[key]
            if best is None:
                return None
            total += best[0]
            parts.append(best[1])
        count = split.counts[-1]
        pool = None
        if count:
            pool = knapsack.solve(None, {c: plan.limits.most[c] for c in self.pool_classes if plan.limits.most[c]},
                                  count)
            if pool is None:
                return None
            total += pool.value
        return Settled(total, parts + [pool])

    def _best_in_balls(self, knapsack: Knapsack, tree: RootTree, split: Split,
                       diameter: int) -> tuple[int, Solution] | None:
        most = split.plan.limits.most
        count = split.counts[tree.root]
        if count < 2 or diameter >= tree.span:
            # One device, or a diameter no two devices of the root exceed: the root is one ball.
            balls = [Ball({c: most[c] for c in tree.classes if most[c]})]
        else:
            least = self._diameters[self._root_key(tree, split.plan, count)]
            if least is not None and least.diameter < diameter:
                # Another root sets the largest distance: this one may spread as far.
                least = self._balls(tree, split, diameter)
            balls = [] if least is None else least.balls
        best = None
        for ball in balls:
            solution = knapsack.solve(tree, ball.most, count)
            if solution is not None and (best is None or solution.value < best[0]):
                best = (solution.value, solution)
        return best

    def _score(self, split: Split, diameter: int, settled: Settled) -> Score:
        knapsack = Knapsack(self.classes, split.plan.limits.fewest, split.plan.bundle_of, self.tables.chain,
                            self.encoding, self.meter)
        counts: dict[int, int] = {}
        for part in settled.parts:
            if part is not None:
                counts.update(knapsack.counts(part))
        distance_sum = self.encoding.decode(settled.value).distance_sum
        self.meter.charge(self.size)
        return Score(unknown_numa=self.numa.unknown, numa_nodes=self.numa.nodes, cards=split.score.cards,
                     unreadable_paths=split.score.unreadable_paths, cross_root_pairs=split.score.cross_root_pairs,
                     max_distance=diameter, distance_sum=distance_sum,
                     device_ids=tuple(sorted(self.classes.chosen(counts))))
