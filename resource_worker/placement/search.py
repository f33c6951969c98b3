"""Exact branch and bound over how many devices each class gives, within a fixed amount of work.

Invariant: `best` is always a complete selection the request allows (the
incumbent it started from, or a better one found since), and a subtree is only
dropped when its bound shows it cannot beat `best`. So when the search ends
without spending its work budget, `best` is optimal; when the budget cuts it,
`best` is still valid and `open_bound` is a lower bound on everything left
unexplored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import NamedTuple

from resource_worker.placement.bounds import INFEASIBLE, Bounds, Limits, Stage, numa_choices
from resource_worker.placement.pool import PoolTables
from resource_worker.placement.score import COMPONENTS, CROSS_ROOT
from resource_worker.placement.state import RequestClasses, State, WorkMeter

# About the work units per open class of computing one bound in full, for deciding whether it still fits.
_FULL_BOUND_UNITS = 12
# Work after which a search from one root starts over from one root per NUMA choice.
_SPLIT_AFTER = 2000
# Above this many ways to meet the NUMA optimum, the search starts from one root holding them all.
_NUMA_ROOTS = 16


class _Bound:
    """A node's lower-bound vector, computed one component at a time, only as far as comparisons need."""

    __slots__ = ("values", "snaps", "_stages")

    def __init__(self, stages: Iterator[Stage]) -> None:
        """The first stage holds no value, only the limits that hold from the start."""
        self.values: list = []
        first = next(stages)
        self.snaps: list[Limits] = [first.limits] if first.limits is not None else []
        self._stages: Iterator[Stage] | None = stages

    @classmethod
    def known(cls, values: list) -> _Bound:
        """The exact score of a complete selection (or INFEASIBLE)."""
        return cls(iter([Stage(None, None), *(Stage(value, None) for value in values)]))

    def _pull(self) -> None:
        step = next(self._stages, None)
        if step is None:
            self._stages = None
            return
        self.values.append(step.value)
        if step.limits is not None:
            self.snaps.append(step.limits)

    def get(self, component: int) -> object:
        """The bound on one component, or None past an infeasible component."""
        while len(self.values) <= component and self._stages is not None:
            self._pull()
        return self.values[component] if component < len(self.values) else None

    def limits(self, component: int) -> Limits:
        """The limits when components before this one are met exactly, or the deepest ones known."""
        while len(self.snaps) <= component and self._stages is not None:
            self._pull()
        return self.snaps[min(component, len(self.snaps) - 1)]

    def known_prefix(self) -> list:
        """The components computed so far."""
        return list(self.values)

    def __lt__(self, other: _Bound) -> bool:
        for component in range(COMPONENTS):
            mine, theirs = self.get(component), other.get(component)
            if mine != theirs:
                return mine is not None and (theirs is None or mine < theirs)
        return False


class _Node:
    """A partial selection: its bound, the devices still to choose, what is chosen, its children once made."""

    __slots__ = ("bound", "to_choose", "state", "children")

    def __init__(self, bound: _Bound, to_choose: int, state: State) -> None:
        self.bound = bound
        self.to_choose = to_choose
        self.state = state
        self.children: _Expansion | None = None


class _Children:
    """Child nodes made on demand and kept, so that walking them again reuses them."""

    __slots__ = ("_made", "_pending")

    def __init__(self, pending: Iterator[_Node]) -> None:
        self._made: list[_Node] = []
        self._pending: Iterator[_Node] | None = pending

    def __iter__(self) -> Iterator[_Node]:
        i = 0
        while True:
            if i == len(self._made):
                child = next(self._pending, None) if self._pending is not None else None
                if child is None:
                    self._pending = None
                    return
                self._made.append(child)
            yield self._made[i]
            i += 1


class Counts(NamedTuple):
    """The most and the fewest devices each class may give."""

    most: list[int]
    fewest: list[int]


class _Expansion(NamedTuple):
    limits: Limits
    """The limits the children were made within."""
    single: bool
    """Whether no branching was needed: the one child takes every class the limits pinned."""
    children: _Children


@dataclasses.dataclass(frozen=True)
class Outcome:
    selection: tuple[str, ...]
    score_values: list
    proven_optimal: bool
    work: int
    open_bound: list | None
    """When cut: the lowest bound (as far as it was computed) among the subtrees left unexplored."""


class Search:
    """One request's branch and bound, starting from an incumbent, stopping after `budget` work units."""

    def __init__(self, tables: PoolTables, mandatory: set[str], size: int, budget: int) -> None:
        self.tables = tables
        self.size = size
        self.budget = budget
        self.classes = RequestClasses(tables, mandatory)
        self.numa_choices, self.numa_complete = numa_choices(tables, self.classes, size, _NUMA_ROOTS)
        self.meter = WorkMeter(budget)
        self.bounds = Bounds(tables, self.classes, self.meter)
        self.best: list = []
        self.open_bound: list | None = None
        n = len(tables.size)
        self.swap_prev = [-1] * n
        self.swap_next = [-1] * n
        for chain in tables.chains:
            chain = [c for c in chain if not self.classes.mandatory[c]]
            for first, second in zip(chain, chain[1:]):
                if tables.ids[first][-1] < tables.ids[second][0]:
                    self.swap_prev[second], self.swap_next[first] = first, second

    @property
    def work(self) -> int:
        return self.meter.work

    def _spent(self) -> bool:
        return self.work >= self.budget

    def run(self, incumbent: list) -> Outcome:
        """Searches from `incumbent` (score values of a valid selection, IDs last) for anything better.

        Most requests are settled from one root holding every NUMA choice; a search that is not, within
        `_SPLIT_AFTER` units, starts over from one root per NUMA choice, with the best selection so far.
        """
        self.best = incumbent
        if not self.numa_complete or len(self.numa_choices) == 1:
            self._walk(self._roots(self.numa_complete))
        else:
            self.meter.budget = min(self.budget, _SPLIT_AFTER)
            self._walk(self._roots(split=False))
            self.meter.budget = self.budget
            if self.open_bound is not None and not self.meter.spent():
                self.open_bound = None
                self._walk(self._roots(split=True))
        return Outcome(self.best[-1], self.best, self.open_bound is None, self.work, self.open_bound)

    def _walk(self, roots: list[_Node]) -> None:
        roots.sort(key=lambda root: root.bound)
        # First a probe that trusts every bound to be reached: when they are,
        # it walks straight to an optimum, which then prunes nearly everything.
        self._probe_found = False
        for root in roots:
            if not self._probe_found:
                self._visit(root, probe=True)
        for root in roots:
            self._visit(root)

    def _roots(self, split: bool) -> list[_Node]:
        """One root for all, or one per way to meet the NUMA optimum: each of those then bounds cards and PCI
        for its NUMA nodes alone."""
        n = len(self.tables.size)
        limits = [(self.tables.size, self.classes.mandatory)]
        if split:
            limits = []
            for choice in self.numa_choices:
                most = choice.forced[:]
                for c in choice.allowed:
                    most[c] = self.tables.size[c]
                limits.append((most, choice.forced))
        roots = []
        for most, fewest in limits:
            roots.append(self._node(State.empty(self.tables), [c for c in range(n) if most[c]], self.size, most,
                                    fewest))
        return roots

    def _node(self, state: State, open_classes: list[int], to_choose: int, most: list[int],
              fewest: list[int]) -> _Node:
        if to_choose == 0:
            if any(fewest[c] for c in open_classes):
                # The limits still ask for devices, mandatory ones among them, that no longer fit.
                return _Node(_Bound.known([INFEASIBLE]), to_choose, state)
            return _Node(_Bound.known(state.score_values(self.classes)), to_choose, state)
        return _Node(_Bound(self.bounds.stages(state, Limits(open_classes, most, fewest), to_choose)),
                     to_choose, state)

    def _may_win(self, node: _Node) -> bool:
        if node.to_choose == 0:
            score = [node.bound.get(j) for j in range(COMPONENTS)]
            return score[0] != INFEASIBLE and score < self.best
        return self._narrow(node.bound) is not None

    def _note_unexplored(self, nodes: list[_Node]) -> None:
        """The budget ran out with these nodes unexplored: keep the lowest bound known of any that may win.

        Only what is computed already counts: no work is done past the budget.
        """
        for node in nodes:
            prefix = node.bound.known_prefix()
            best = self.best[:len(prefix)]
            if prefix < best or prefix == best and len(prefix) < COMPONENTS:
                if self.open_bound is None or prefix < self.open_bound:
                    self.open_bound = prefix

    def _visit(self, node: _Node, probe: bool = False) -> None:
        bound = node.bound
        if node.to_choose == 0:
            if self._may_win(node):
                self.best = [bound.get(j) for j in range(COMPONENTS)]
                self._probe_found = True
            return
        if self._spent():
            self._note_unexplored([node])
            return
        if probe:
            if self._probe_found or bound.get(COMPONENTS - 1) is None or self._narrow(bound) is None:
                return
            limits = bound.snaps[-1]
        else:
            limits = self._narrow(bound)
            if limits is None:
                return
        # The main walk meets the nodes of the probe's path again, often with the
        # same limits: their children are then the same and are made only once.
        if node.children is None or node.children.limits is not limits:
            self.meter.work += 1 + len(limits.open_classes)
            node.children = self._expand(node, limits)
        single, children = node.children.single, node.children.children
        if single:
            for child in children:
                self._visit(child, probe)
        elif not probe:
            # Most promising first: a better selection early prunes the rest.
            # Children that cannot win are dropped before they are compared,
            # which would compute their bounds deeper than pruning needs.
            hopeful = []
            for child in children:
                if self._spent():
                    # The children not judged yet are no better than this node's bound.
                    self._note_unexplored([node, *hopeful])
                    return
                if self._may_win(child):
                    hopeful.append(child)
            if self.work + len(hopeful) * _FULL_BOUND_UNITS * (1 + len(limits.open_classes)) <= self.budget:
                hopeful.sort(key=lambda child: child.bound)
            else:
                # Comparing bounds in full could run past the budget: order by what is computed already.
                hopeful.sort(key=lambda child: child.bound.known_prefix())
            for i, child in enumerate(hopeful):
                if self._spent():
                    self._note_unexplored(hopeful[i:])
                    return
                self._visit(child)
        else:
            # The probe follows one child: the first that keeps this node's bound
            # (then the bound may still be reached), else the most promising one.
            chosen = None
            for child in children:
                if self._spent():
                    # The main walk will note this node as unexplored.
                    return
                if all(child.bound.get(j) == bound.get(j) for j in range(COMPONENTS)):
                    chosen = child
                    break
                if chosen is None or child.bound < chosen.bound:
                    chosen = child
            if chosen is not None:
                self._visit(chosen, probe)

    def _expand(self, node: _Node, limits: Limits) -> _Expansion:
        """The children of a node within these limits."""
        state, to_choose = node.state, node.to_choose
        open_classes, most, fewest = limits
        open_classes = [c for c in open_classes if most[c] > 0]
        fixed = [c for c in open_classes if most[c] == fewest[c]]
        if fixed:
            # The bounds leave these classes one possible count: take it without branching.
            for c in fixed:
                if self._spent():
                    # Adding every pinned class can be long: stop, and count this node as unexplored.
                    self._note_unexplored([node])
                    return _Expansion(limits, True, _Children(iter(())))
                count = most[c]
                swapped = self._swap_limits(c, count, most, fewest)
                if swapped is None:
                    return _Expansion(limits, True, _Children(iter(())))
                most, fewest = swapped
                state = self._add(state, c, count)
                to_choose -= count
            rest = [c for c in open_classes if c not in fixed]
            return _Expansion(limits, True, _Children(iter([self._node(state, rest, to_choose, most, fewest)])))
        if not open_classes:
            # Devices are still to be chosen but no class may give any: nothing completes this node.
            return _Expansion(limits, True, _Children(iter(())))
        # Cheap to get: the limits once the cross-root bound is met guide the branching.
        node.bound.get(CROSS_ROOT)
        branch = self._branch_class(state, open_classes, most, to_choose, node.bound.limits(CROSS_ROOT + 1))
        rest = [c for c in open_classes if c != branch]
        rest_most = sum(most[c] for c in rest)
        rest_fewest = sum(fewest[c] for c in rest)
        counts = range(min(most[branch], to_choose - rest_fewest), max(fewest[branch], to_choose - rest_most) - 1, -1)
        children = (self._node(self._add(state, branch, count) if count else state, rest, to_choose - count, *swapped)
                    for count in counts for swapped in [self._swap_limits(branch, count, most, fewest)]
                    if swapped is not None)
        return _Expansion(limits, False, _Children(children))

    def _add(self, state: State, cls: int, count: int) -> State:
        # A state copies its per-class and per-node tables and walks the class's links.
        self.meter.work += len(self.tables.links[cls]) + len(self.tables.above[cls])
        return state.add(self.tables, cls, count)

    def _swap_limits(self, cls: int, count: int, most: list[int],
                     fewest: list[int]) -> Counts | None:
        """The limits once a class gives `count` devices, with its swap neighbours ordered; None if impossible."""
        before, after = self.swap_prev[cls], self.swap_next[cls]
        if before < 0 and after < 0:
            return Counts(most, fewest)
        most, fewest = most[:], fewest[:]
        most[cls] = fewest[cls] = count
        if before >= 0:
            fewest[before] = max(fewest[before], count)
        if after >= 0:
            most[after] = min(most[after], count)
        if any(fewest[c] > most[c] for c in (before, after) if c >= 0):
            return None
        return Counts(most, fewest)

    def _narrow(self, bound: _Bound) -> Limits | None:
        """None when no completion can beat the best selection, else the limits that still hold.

        The first component where the bound differs from the best decides: a
        higher bound cannot win; a lower one may, and any better completion
        then meets every earlier bound exactly, so the limits derived from
        those bounds apply.
        """
        for j, best in enumerate(self.best):
            value = bound.get(j)
            if value != best:
                return bound.snaps[j] if value is not None and value < best else None
        return None

    def _branch_class(self, state: State, open_classes: list[int], most: list[int], to_choose: int,
                      hint: Limits) -> int:
        tables = self.tables
        forced = [c for c in open_classes if self.classes.mandatory[c] > 0]
        if forced:
            return min(forced, key=tables.first_id.__getitem__)

        # Dive towards what the tightest limits computed so far require or
        # allow, then the class that costs least next to what is already
        # chosen, so the first complete selection is already a good bound.
        def cost(c: int) -> tuple:
            x = tables.root[c]
            return (not hint.fewest[c], not hint.most[c],
                    0 if tables.numa_bit[c] & state.numa_mask else 1 if tables.numa_bit[c] else 2,
                    0 if tables.card_bit[c] & state.card_mask else 1,
                    x < 0, x >= 0 and state.roots[x] == 0,
                    state.slot_max[c], state.slot_sum[c], -min(most[c], to_choose), tables.first_id[c])
        return min(open_classes, key=cost)
