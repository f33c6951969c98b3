"""Topology-aware preferred allocation: which devices the kubelet should take.

A selection is scored lexicographically, lower is better:

1. devices with unknown NUMA, then distinct known NUMA nodes;
2. distinct cards (a device with no known card is a card of its own);
3. devices with an unreadable PCI path, then pairs of readable devices under
   different PCI roots;
4. the largest tree distance between two devices under one root, then the sum
   of those distances;
5. the sorted device IDs.

The optimum is found exactly by branch and bound. Devices that no score
component can tell apart form a class, and the search decides how many
devices each class gives (always its smallest IDs) rather than which ones.
Each node gets a lower bound per component, computed lazily: counting bounds
for NUMA, cards and roots, a bound on the tree distances of any completion,
and the smallest IDs still possible. A first walk follows the bounds to a
good selection; the second prunes against it. Look-alike classes are kept in
ID order so that equivalent selections are not all visited.

The kubelet asks about the same pool of devices until some are allocated, so
the tables built from a pool serve the next requests for it; within a search,
the distance bound of a root is shared by the nodes that agree on that root.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

from shared.inventory import DeviceRecord
from shared.sriov import parse_numa

_INVALID_SIDS = frozenset({"", "n/a", "unknown"})
# With this many roots or fewer that can still grow, the cross-root bound
# tries every extreme split and is exact.
_EXACT_ROOTS = 5
# With this many tree nodes or fewer that already hold chosen devices and can
# still grow, a level's pair bound is exact.
_EXACT_NODES = 3
_INFEASIBLE = float("inf")
# The kubelet offers the same devices again until some are allocated or
# change: the search's tables for the last few pools are kept.
_CACHED_POOLS = 8
# Score components: unknown NUMA, NUMA nodes, cards, unreadable paths,
# cross-root pairs, max distance, distance sum, sorted IDs.
_COMPONENTS = 8
_CROSS = 4  # the cross-root pairs' component


@dataclasses.dataclass(frozen=True)
class Candidate:
    device_id: str
    numa_node: int | None
    """None when unknown."""
    card: str | None
    """Devices with the same non-None card share a card; None is a card of its own."""
    pci_path: tuple[str, ...] | None
    """Segments from the PCI root to the device; None when unreadable."""


class PlacementRequestError(ValueError):
    """The kubelet's request cannot be answered; the message says why."""


def card_key(sid: str, parent_pf: str | None) -> str | None:
    """The card a device sits on, or None when nothing says it shares one."""
    if parent_pf:
        # A VF's SID may be blank or copied from its PF; the PF address is what groups VFs.
        return "pf:" + parent_pf.strip().lower()
    sid = (sid or "").strip()
    # All zeros is no SID, however it is written: `0000…`, `0000-00…`, `0x0000…`.
    digits = sid[2:] if sid[:2].lower() == "0x" else sid
    if sid.lower() in _INVALID_SIDS or set(digits) <= set("0-:. "):
        return None
    return "sid:" + sid


def candidate_from_record(record: DeviceRecord) -> Candidate:
    return Candidate(
        device_id=record.device_id,
        numa_node=parse_numa(record.numa_node),
        card=card_key(record.sid, record.parent_pf),
        pci_path=record.pci_path or None,
    )


def preferred_allocation(candidates: Mapping[str, Candidate], available: Sequence[str],
                         must_include: Sequence[str], size: int) -> list[str]:
    """The best `size` devices of `available` including all of `must_include`: mandatory ones first."""
    pool, mandatory = _validate(candidates, available, must_include, size)
    if size == len(mandatory):
        chosen = set(mandatory)
    elif size == len(pool):
        chosen = set(pool)
    else:
        chosen = _tables(tuple(candidates[i] for i in pool)).run(set(mandatory), size)
    return mandatory + sorted(chosen.difference(mandatory))


@functools.lru_cache(maxsize=_CACHED_POOLS)
def _tables(pool: tuple[Candidate, ...]) -> _Search:
    """The search's tables for a pool, found again by value: the servicer builds new candidates per request."""
    return _Search(pool)


def _validate(candidates: Mapping[str, Candidate], available: Sequence[str],
              must_include: Sequence[str], size: int) -> tuple[list[str], list[str]]:
    pool = sorted(set(available))
    mandatory = sorted(set(must_include))
    if size < 0:
        raise PlacementRequestError(f"allocation size {size} is negative")
    if size == 0 and mandatory:
        raise PlacementRequestError(f"allocation size 0 cannot hold the {len(mandatory)} mandatory devices")
    unknown = [i for i in sorted(set(pool) | set(mandatory)) if i not in candidates]
    if unknown:
        raise PlacementRequestError(f"unknown device IDs: {_names(unknown)}")
    missing = sorted(set(mandatory) - set(pool))
    if missing:
        raise PlacementRequestError(f"mandatory devices not available: {_names(missing)}")
    if len(mandatory) > size:
        raise PlacementRequestError(f"{len(mandatory)} mandatory devices exceed allocation size {size}")
    if size > len(pool):
        raise PlacementRequestError(f"allocation size {size} exceeds the {len(pool)} available devices")
    return pool, mandatory


def _names(ids: list[str]) -> str:
    # The message reaches a log line; a hostile request must not make it huge.
    shown = ", ".join(repr(i[:64]) for i in ids[:5])
    return shown + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def _pairs(k: int) -> int:
    return k * (k - 1) // 2


class _State:
    """What the chosen devices add up to; a new state is made for every class added.

    Besides the score's counts: `solo` devices with a card of their own; per
    root, `roots` devices, `root_depth` their depths and `root_sum` their
    distances; `held` devices below each tree node; per class, `slot_sum` and
    `slot_max` the total and farthest distance from one of its devices to the
    chosen ones (-1: none under its root); `picks` (class, count) pairs.
    """

    __slots__ = ("unknown", "numa_mask", "card_mask", "solo", "unreadable", "cross", "pmax", "psum",
                 "roots", "root_depth", "root_sum", "held", "slot_sum", "slot_max", "picks")

    def copy(self) -> _State:
        other = _State.__new__(_State)
        other.unknown, other.numa_mask, other.card_mask, other.solo = \
            self.unknown, self.numa_mask, self.card_mask, self.solo
        other.unreadable, other.cross, other.pmax, other.psum = self.unreadable, self.cross, self.pmax, self.psum
        other.roots, other.root_depth, other.root_sum = self.roots, self.root_depth, self.root_sum
        other.held, other.slot_sum, other.slot_max, other.picks = \
            self.held, self.slot_sum, self.slot_max, self.picks
        return other


class _Limits(NamedTuple):
    """Classes still open, with the most and the fewest devices each may still give."""

    und: list[int]
    ecap: list[int]
    emin: list[int]


class _Bound:
    """A node's lower-bound vector, computed one component at a time, only as far as comparisons need."""

    __slots__ = ("values", "snaps", "_stages")

    def __init__(self, stages: Iterator, limits: _Limits | None) -> None:
        """`stages` yields (bound, limits that hold once it is met) pairs; `limits` hold from the start."""
        self.values: list = []
        self.snaps: list[_Limits] = [limits] if limits is not None else []
        self._stages: Iterator | None = stages

    def _pull(self) -> None:
        step = next(self._stages, None)
        if step is None:
            self._stages = None
            return
        self.values.append(step[0])
        if step[1] is not None:
            self.snaps.append(step[1])

    def get(self, j: int) -> object:
        """Component j, or None past an infeasible component."""
        while len(self.values) <= j and self._stages is not None:
            self._pull()
        return self.values[j] if j < len(self.values) else None

    def limits(self, j: int) -> _Limits:
        """The limits when components 0..j-1 are met exactly, or the deepest ones known."""
        while len(self.snaps) <= j and self._stages is not None:
            self._pull()
        return self.snaps[min(j, len(self.snaps) - 1)]

    def __lt__(self, other: _Bound) -> bool:
        for j in range(_COMPONENTS):
            mine, theirs = self.get(j), other.get(j)
            if mine != theirs:
                return mine is not None and (theirs is None or mine < theirs)
        return False


class _Node:
    """A partial selection: its bound, the devices still to choose, what is chosen, its children once made."""

    __slots__ = ("bound", "r", "state", "children")

    def __init__(self, bound: _Bound, r: int, state: _State) -> None:
        self.bound = bound
        self.r = r
        self.state = state
        self.children: tuple[_Limits, tuple[bool, _Children]] | None = None


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


class _Search:
    """Branch and bound over how many devices each class contributes."""

    def __init__(self, pool: tuple[Candidate, ...]) -> None:
        """The tables of one pool of devices, which every request for that pool shares."""
        card_sizes: dict[str, int] = {}
        subtree: dict[tuple[str, ...], int] = {}
        nearest: dict[tuple[str, ...], int] = {}   # depth of the shallowest device below a node
        at: dict[tuple[str, ...], int] = {}
        for c in pool:
            if c.card is not None:
                card_sizes[c.card] = card_sizes.get(c.card, 0) + 1
            if c.pci_path:
                at[c.pci_path] = at.get(c.pci_path, 0) + 1
        # Endpoints first, then each parent once for all the endpoints below it.
        parents: dict[tuple[str, ...], list[int]] = {}
        for path, count in at.items():
            subtree[path] = subtree.get(path, 0) + count
            nearest[path] = len(path)
            if len(path) > 1:
                parents.setdefault(path[:-1], []).append(count)
        for parent, counts in parents.items():
            count, depth = sum(counts), len(parent) + 1
            for i in range(1, len(parent) + 1):
                prefix = parent[:i]
                subtree[prefix] = subtree.get(prefix, 0) + count
                if nearest.get(prefix, depth) >= depth:
                    nearest[prefix] = depth

        members: dict[tuple, list[Candidate]] = {}
        for c in pool:
            # A card holding one available device behaves exactly like no card.
            card = c.card if c.card is not None and card_sizes[c.card] > 1 else None
            members.setdefault((c.numa_node, card, _position(c.pci_path, subtree)), []).append(c)
        groups = sorted(members.items(), key=lambda item: item[1][0].device_id)

        numa_bits = {n: 1 << i for i, n in enumerate(sorted({k[0] for k, _ in groups if k[0] is not None}))}
        card_bits = {n: 1 << i for i, n in enumerate(sorted({k[1] for k, _ in groups if k[1] is not None}))}
        root_index: dict[str, int] = {}
        node_index: dict[tuple[str, ...], int] = {}
        self.ids: list[tuple[str, ...]] = []
        self.first_id: list[str] = []
        self.numa_bit: list[int] = []   # 0: unknown NUMA
        self.card_bit: list[int] = []   # 0: a card per device
        self.root: list[int] = []       # -1: unreadable path
        self.depth: list[int] = []
        self.intra: list[int] = []      # distance between two devices of the class
        self.anc: list[list[int]] = []  # tree nodes above every device of the class
        for (numa, card, (_, shared, intra)), devices in groups:
            self.ids.append(tuple(d.device_id for d in devices))
            self.first_id.append(devices[0].device_id)
            self.numa_bit.append(numa_bits.get(numa, 0))
            self.card_bit.append(card_bits.get(card, 0))
            path = devices[0].pci_path or ()
            self.root.append(root_index.setdefault(path[0], len(root_index)) if path else -1)
            self.depth.append(len(path))
            self.intra.append(intra)
            # Below `shared` the devices of a class part ways, one device per node.
            self.anc.append([node_index.setdefault(shared[:i], len(node_index)) for i in range(1, len(shared) + 1)])
        n = len(groups)
        self.n_roots = len(root_index)
        self.cap = [len(ids) for ids in self.ids]

        # Two classes without mandatory devices, each alone on its cards (or on
        # none) and alone below sibling nodes of the same shape, swap without
        # changing components 1-4. When one's IDs all precede the other's, an
        # optimum gives the first at least as many devices: otherwise swapping
        # their counts would give smaller IDs. Chains hold such classes in ID
        # order; each request links those without mandatory devices.
        chains: dict[tuple, list[int]] = {}
        for c, ((numa, card, (_, shared, intra)), devices) in enumerate(groups):
            if card is not None and card_sizes[card] != len(devices):
                continue
            top = shared
            if shared:
                if subtree[shared] != len(devices):
                    continue
                while len(top) > 1 and subtree[top[:-1]] == len(devices):
                    top = top[:-1]
            chains.setdefault((numa, card is None, top[:-1], len(top), self.depth[c], intra, len(devices)),
                              []).append(c)
        self.chains = list(chains.values())

        # links[c]: (other class, distance) for every class under the same root.
        self.links: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        by_root: list[list[int]] = [[] for _ in range(self.n_roots)]
        for c in range(n):
            if self.root[c] >= 0:
                by_root[self.root[c]].append(c)
        above = [frozenset(nodes) for nodes in self.anc]
        for classes in by_root:
            for i, a in enumerate(classes):
                for b in classes[i + 1:]:
                    d = self.depth[a] + self.depth[b] - 2 * len(above[a] & above[b])
                    self.links[a].append((b, d))
                    self.links[b].append((a, d))

        children: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
        for node in subtree:
            if len(node) > 1:
                children.setdefault(node[:-1], []).append(node)
        levels: list[list[list[int]]] = [[] for _ in range(self.n_roots)]
        self.split: list[int | None] = []
        for node, v in node_index.items():
            by_depth = levels[root_index[node[0]]]
            while len(by_depth) < len(node):
                by_depth.append([])
            by_depth[len(node) - 1].append(v)
            # The closest two devices whose lowest common ancestor is exactly
            # this node: two right here, one here and one below, or two below
            # through different children.
            first = second = None
            for child in children.get(node, ()):
                offset = nearest[child] - len(node)
                if first is None or offset < first:
                    first, second = offset, first
                elif second is None or offset < second:
                    second = offset
            here = at.get(node, 0)
            closest = []
            if here >= 2:
                closest.append(0)
            if here and first is not None:
                closest.append(first)
            if second is not None:
                closest.append(first + second)
            self.split.append(min(closest, default=None))
        # (weight, nodes) per level of each root; consecutive levels that group
        # the classes alike (a bridge with one way down) always hold the same
        # pairs and count once with a weight.
        below: list[list[int]] = [[] for _ in node_index]
        for c, nodes in enumerate(self.anc):
            for v in nodes:
                below[v].append(c)
        self.levels: list[list[tuple[int, list[int]]]] = []
        for by_depth in levels:
            merged: list[tuple[int, list[int]]] = []
            previous = None
            for nodes in by_depth:
                grouping = sorted(below[v] for v in nodes)
                if grouping == previous:
                    merged[-1] = (merged[-1][0] + 1, merged[-1][1])
                else:
                    merged.append((1, nodes))
                previous = grouping
            self.levels.append(merged)

    # -- search ----------------------------------------------------------

    def run(self, mandatory: set[str], size: int) -> set[str]:
        """The best `size` devices including `mandatory`, searched on a copy: the tables stay as they are."""
        return copy.copy(self)._run(mandatory, size)

    def _run(self, mandatory: set[str], size: int) -> set[str]:
        n = len(self.cap)
        self.size = size
        self.best: list | None = None
        self.best_picks: list[tuple[int, int]] = []
        # Per root, keyed on its chosen devices and limits: its shape, and its bound per number of devices added.
        self.root_shapes: dict[tuple, tuple] = {}
        self.root_bounds: dict[tuple, tuple | None] = {}
        self.mand_ids = [tuple(i for i in ids if i in mandatory) for ids in self.ids]
        self.free_ids = [tuple(i for i in ids if i not in mandatory) for ids in self.ids]
        self.mins = [len(ids) for ids in self.mand_ids]
        self.swap_prev = [-1] * n
        self.swap_next = [-1] * n
        for chain in self.chains:
            chain = [c for c in chain if not self.mins[c]]
            for a, b in zip(chain, chain[1:]):
                if self.ids[a][-1] < self.ids[b][0]:
                    self.swap_prev[b], self.swap_next[a] = a, b
        state = _State()
        state.unknown = state.numa_mask = state.card_mask = state.solo = state.unreadable = 0
        state.cross = state.pmax = state.psum = 0
        state.roots = state.root_depth = state.root_sum = (0,) * self.n_roots
        state.held = [0] * len(self.split)
        state.slot_sum = [0] * n
        state.slot_max = [-1] * n
        state.picks = ()
        root = self._node(state, list(range(n)), self.size, self.cap, self.mins)
        # First a probe that trusts every bound to be reached: when they are,
        # it walks straight to an optimum, which then prunes nearly everything.
        self._visit(root, probe=True)
        self._visit(root)
        return {i for c, k in self.best_picks for i in self._ids(c, k)}

    def _ids(self, c: int, k: int) -> tuple[str, ...]:
        return self.mand_ids[c] + self.free_ids[c][:k - self.mins[c]]

    def _node(self, state: _State, und: list[int], r: int, ecap: list[int], emin: list[int]) -> _Node:
        if r == 0:
            if any(emin[c] for c in und):
                # The limits still ask for devices, mandatory ones among them, that no longer fit.
                return _Node(_Bound(iter([(_INFEASIBLE, None)]), None), r, state)
            ids = tuple(sorted(i for c, k in state.picks for i in self._ids(c, k)))
            score = [state.unknown, state.numa_mask.bit_count(), state.card_mask.bit_count() + state.solo,
                     state.unreadable, state.cross, state.pmax, state.psum, ids]
            return _Node(_Bound(((value, None) for value in score), None), r, state)
        stages = self._evaluate(state, und, r, ecap, emin)
        return _Node(_Bound(stages, next(stages)), r, state)

    def _may_win(self, node: _Node) -> bool:
        if node.r == 0:
            score = [node.bound.get(j) for j in range(_COMPONENTS)]
            return score[0] != _INFEASIBLE and (self.best is None or score < self.best)
        return self._narrow(node.bound) is not None

    def _visit(self, node: _Node, probe: bool = False) -> None:
        bound = node.bound
        if node.r == 0:
            if self._may_win(node):
                self.best, self.best_picks = [bound.get(j) for j in range(_COMPONENTS)], node.state.picks
            return
        if probe:
            if self.best is not None or bound.get(_COMPONENTS - 1) is None:
                return
            limits = bound.snaps[-1]
        else:
            limits = self._narrow(bound)
            if limits is None:
                return
        # The main walk meets the nodes of the probe's path again, often with the
        # same limits: their children are then the same and are made only once.
        if node.children is None or node.children[0] is not limits:
            node.children = limits, self._expand(node, limits)
        single, children = node.children[1]
        if single:
            for child in children:
                self._visit(child, probe)
        elif not probe:
            # Most promising first: a better selection early prunes the rest.
            # Children that cannot win are dropped before they are compared,
            # which would compute their bounds deeper than pruning needs.
            hopeful = [child for child in children if self._may_win(child)]
            for child in sorted(hopeful, key=lambda child: child.bound):
                self._visit(child)
        else:
            # The probe follows one child: the first that keeps this node's bound
            # (then the bound may still be reached), else the most promising one.
            chosen = None
            for child in children:
                if all(child.bound.get(j) == bound.get(j) for j in range(_COMPONENTS)):
                    chosen = child
                    break
                if chosen is None or child.bound < chosen.bound:
                    chosen = child
            if chosen is not None:
                self._visit(chosen, probe)

    def _expand(self, node: _Node, limits: _Limits) -> tuple[bool, _Children]:
        """(whether no branching was needed, the children) of a node within these limits."""
        state, r = node.state, node.r
        und, ecap, emin = limits
        und = [c for c in und if ecap[c] > 0]
        fixed = [c for c in und if ecap[c] == emin[c]]
        if fixed:
            # The bounds leave these classes one possible count: take it without branching.
            for c in fixed:
                k = ecap[c]
                swapped = self._swap_limits(c, k, ecap, emin)
                if swapped is None:
                    return True, _Children(iter(()))
                ecap, emin = swapped
                state = self._add(state, c, k)
                r -= k
            return True, _Children(iter([self._node(state, [c for c in und if c not in fixed], r, ecap, emin)]))
        # Cheap to get: the limits once the cross-root bound is met guide the branching.
        node.bound.get(_CROSS)
        b = self._branch_class(state, und, ecap, r, node.bound.limits(_CROSS + 1))
        rest = [c for c in und if c != b]
        rest_cap = sum(ecap[c] for c in rest)
        rest_min = sum(emin[c] for c in rest)
        counts = range(min(ecap[b], r - rest_min), max(emin[b], r - rest_cap) - 1, -1)
        return False, _Children(self._node(self._add(state, b, k) if k else state, rest, r - k, *swapped)
                                for k in counts for swapped in [self._swap_limits(b, k, ecap, emin)]
                                if swapped is not None)

    def _swap_limits(self, c: int, k: int, ecap: list[int],
                     emin: list[int]) -> tuple[list[int], list[int]] | None:
        """The limits once class c gives k devices, with its swap neighbours ordered; None if impossible."""
        before, after = self.swap_prev[c], self.swap_next[c]
        if before < 0 and after < 0:
            return ecap, emin
        ecap, emin = ecap[:], emin[:]
        ecap[c] = emin[c] = k
        if before >= 0:
            emin[before] = max(emin[before], k)
        if after >= 0:
            ecap[after] = min(ecap[after], k)
        if any(emin[x] > ecap[x] for x in (before, after) if x >= 0):
            return None
        return ecap, emin

    def _narrow(self, bound: _Bound) -> _Limits | None:
        """None when no completion can beat the best selection, else the limits that still hold.

        The first component where the bound differs from the best decides: a
        higher bound cannot win; a lower one may, and any better completion
        then meets every earlier bound exactly, so the limits derived from
        those bounds apply.
        """
        if self.best is None:
            return bound.snaps[0] if bound.get(0) is not None else None
        for j, best in enumerate(self.best):
            value = bound.get(j)
            if value != best:
                return bound.snaps[j] if value < best else None
        return None

    def _add(self, state: _State, b: int, k: int) -> _State:
        state = state.copy()
        state.picks = state.picks + ((b, k),)
        if self.numa_bit[b]:
            state.numa_mask |= self.numa_bit[b]
        else:
            state.unknown += k
        if self.card_bit[b]:
            state.card_mask |= self.card_bit[b]
        else:
            state.solo += k
        x = self.root[b]
        if x < 0:
            state.unreadable += k
            return state
        state.cross += k * (sum(state.roots) - state.roots[x])
        added = k * state.slot_sum[b] + _pairs(k) * self.intra[b]
        state.psum += added
        state.pmax = max(state.pmax, state.slot_max[b], self.intra[b] if k > 1 else 0)
        state.roots = _bump(state.roots, x, k)
        state.root_depth = _bump(state.root_depth, x, k * self.depth[b])
        state.root_sum = _bump(state.root_sum, x, added)
        state.held = state.held[:]
        for v in self.anc[b]:
            state.held[v] += k
        state.slot_sum = state.slot_sum[:]
        state.slot_max = state.slot_max[:]
        for u, d in self.links[b]:
            state.slot_sum[u] += k * d
            if d > state.slot_max[u]:
                state.slot_max[u] = d
        return state

    def _branch_class(self, state: _State, und: list[int], ecap: list[int], r: int, hint: _Limits) -> int:
        forced = [c for c in und if self.mins[c] > 0]
        if forced:
            return min(forced, key=self.first_id.__getitem__)
        _, hint_cap, hint_min = hint

        # Dive towards what the tightest limits computed so far require or
        # allow, then the class that costs least next to what is already
        # chosen, so the first complete selection is already a good bound.
        def cost(c: int) -> tuple:
            x = self.root[c]
            return (not hint_min[c], not hint_cap[c],
                    0 if self.numa_bit[c] & state.numa_mask else 1 if self.numa_bit[c] else 2,
                    0 if self.card_bit[c] & state.card_mask else 1,
                    x < 0, x >= 0 and state.roots[x] == 0,
                    state.slot_max[c], state.slot_sum[c], -min(ecap[c], r), self.first_id[c])
        return min(und, key=cost)

    # -- bounds ----------------------------------------------------------

    def _evaluate(self, state: _State, und: list[int], r: int, ecap: list[int], emin: list[int]) -> Iterator:
        """The limits that hold, then, component by component, a lower bound for every completion.

        Yields first the limits (classes left, per-class maximum `ecap`,
        per-class minimum `emin`), then (bound j, limits for j + 1) pairs. The
        limits after bound j hold for any completion meeting bounds 0..j
        exactly: each stage assumes the previous bounds are met exactly, which
        narrows what the next one may use. A stage that finds nothing feasible
        yields infinity and ends.
        """
        ecap = ecap[:]
        emin = emin[:]
        und = [c for c in und if ecap[c]]
        numa_bit, card_bit, root = self.numa_bit, self.card_bit, self.root
        limits = _Limits(und, ecap[:], emin[:])
        yield limits
        if not _feasible(und, r, ecap, emin):
            # Swap order can ask more of a class's neighbours than is left to choose.
            yield _INFEASIBLE, None
            return

        # 1. NUMA: unknown-NUMA devices only when known ones run out.
        u, known, changed = _fewest_unknown(und, numa_bit, r, ecap, emin)
        if changed:
            und = [c for c in und if ecap[c]]
            limits = _Limits(und, ecap[:], emin[:])
        yield state.unknown + u, limits
        opened = _open_groups(known, numa_bit, state.numa_mask, r - u, ecap, emin)
        if opened is None:
            yield _INFEASIBLE, None
            return
        if _pin(und, r, ecap, emin) or opened[1]:
            und = [c for c in und if ecap[c]]
            limits = _Limits(und, ecap[:], emin[:])
        yield opened[0], limits

        # 2. Cards, filled largest first after the cards already paid for.
        opened = _open_groups(und, card_bit, state.card_mask, r, ecap, emin)
        if opened is None:
            yield _INFEASIBLE, None
            return
        if _pin(und, r, ecap, emin) or opened[1]:
            und = [c for c in und if ecap[c]]
            limits = _Limits(und, ecap[:], emin[:])
        yield state.solo + opened[0], limits

        # 3. PCI roots: readable paths first, then as few cross-root pairs as possible.
        u, readable, changed = _fewest_unknown(und, self.depth, r, ecap, emin)   # depth 0: no path
        if changed:
            und = [c for c in und if ecap[c]]
            limits = _Limits(und, ecap[:], emin[:])
        yield state.unreadable + u, limits
        t = r - u
        floor = [0] * self.n_roots
        spare = [0] * self.n_roots
        for c in readable:
            floor[root[c]] += emin[c]
            spare[root[c]] += ecap[c] - emin[c]
        best_split = _best_splits([a + b for a, b in zip(state.roots, floor)], spare, t - sum(floor))
        if best_split is None:
            yield _INFEASIBLE, None
            return
        squares, splits = best_split
        total = sum(state.roots) + t
        # Squares are strictly convex, so only the best splits reach the bound:
        # a completion meeting it spreads its devices over the roots as one of them does.
        quotas = None if splits is None else [[f + a for f, a in zip(floor, split)] for split in splits]
        if quotas is not None and _pin_roots(root, readable, quotas, ecap, emin):
            und = [c for c in und if ecap[c]]
            limits = _Limits(und, ecap[:], emin[:])
        yield (total * total - squares) // 2, limits

        # 4. PCI distances: first the maximum, then, leaving out devices that
        # would exceed that maximum, the sum.
        readable = [c for c in und if root[c] >= 0]
        options = self._distance_options(state, readable, t, quotas, ecap, emin) \
            if _feasible(und, r, ecap, emin) else []
        limit = min((option[1] for option in options), default=_INFEASIBLE)
        if limit == _INFEASIBLE:
            yield _INFEASIBLE, None
            return
        options = [option for option in options if option[1] == limit]
        narrowed = False
        for c in readable:
            if state.slot_max[c] > limit or self.intra[c] > limit and ecap[c] > max(emin[c], 1):
                ecap[c] = emin[c] if state.slot_max[c] > limit else max(emin[c], 1)
                narrowed = True
        if quotas is not None:
            _pin_roots(root, readable, [option[0] for option in options], ecap, emin)
        und = [c for c in und if ecap[c]]
        yield limit, _Limits(und, ecap[:], emin[:])
        if narrowed:
            readable = [c for c in und if root[c] >= 0]
            quotas = None if quotas is None else [option[0] for option in options]
            options = self._distance_options(state, readable, t, quotas, ecap, emin) \
                if _feasible(und, r, ecap, emin) else []
        lowest = min((option[2] for option in options), default=_INFEASIBLE)
        if lowest == _INFEASIBLE:
            yield _INFEASIBLE, None
            return
        if quotas is not None:
            options = [option for option in options if option[2] == lowest]
            quotas = [option[0] for option in options]
            _pin_roots(root, readable, quotas, ecap, emin)
            if len(options) == 1:
                self._fill_tree(readable, options[0], ecap, emin)
        und = [c for c in und if ecap[c]]
        yield lowest, _Limits(und, ecap[:], emin[:])

        # 5. IDs: the chosen ones plus the smallest IDs still allowed, taking
        # from each root as many as a remaining split gives it, and from the
        # tree as that split's sum bound fills it.
        chosen = [i for c, k in state.picks for i in self._ids(c, k)]
        if quotas is None:
            yield tuple(sorted(chosen + self._smallest_ids(und, r, ecap, emin))), None
            return
        by_root: dict[int, list[int]] = {}
        for c in und:
            by_root.setdefault(root[c], []).append(c)
        chosen += self._smallest_ids(by_root.get(-1, []), r - t, ecap, emin)

        def smallest(option: tuple) -> tuple[str, ...]:
            cap, low = ecap, emin
            if len(options) > 1:
                cap, low = ecap[:], emin[:]
                self._fill_tree(readable, option, cap, low)
            return tuple(sorted(chosen + [i for x, p in enumerate(option[0]) if p
                                          for i in self._smallest_ids(by_root.get(x, []), p, cap, low)]))
        yield min(map(smallest, options)), None

    def _fill_tree(self, classes: list[int], option: tuple, ecap: list[int], emin: list[int]) -> None:
        """Narrows the limits to the completions that fill the tree as this option's sum bound does."""
        _, _, _, empty, full = option
        for c in classes:
            if not empty.isdisjoint(self.anc[c]):
                ecap[c] = emin[c]
            elif not full.isdisjoint(self.anc[c]):
                emin[c] = ecap[c]

    def _smallest_ids(self, classes: list[int], count: int, ecap: list[int], emin: list[int]) -> list[str]:
        """The IDs `classes` must give within these limits and their smallest other IDs allowed, `count` in all."""
        ids = [i for c in classes for i in self._ids(c, emin[c])]
        offered = [i for c in classes for i in self.free_ids[c][emin[c] - self.mins[c]:ecap[c] - self.mins[c]]]
        return ids + sorted(offered)[:max(0, count - len(ids))]

    def _distance_options(self, state: _State, readable: list[int], t: int, quotas: list[list[int]] | None,
                          ecap: list[int], emin: list[int]) -> list[tuple]:
        """Lower bounds on the final (max, sum) distances, per possible split between roots.

        Each option is (quota, max, sum, empty, full): the devices per root, the
        bounds, then the tree nodes that get no optional device and those that
        get all theirs in any completion meeting the sum bound exactly.
        """
        if quotas is None:
            # Unknown split between roots: only distances to chosen devices count.
            near = _nearest(_reach(readable, state.slot_sum, state.slot_max, ecap, emin), t)
            return [] if near is None else [(None, max(state.pmax, near[0]), state.psum + near[1], set(), set())]
        by_root: dict[int, list[int]] = {}
        for c in readable:
            by_root.setdefault(self.root[c], []).append(c)
        # What p more devices add under a root depends only on what is chosen
        # there and on its classes' limits: other nodes of the search share it.
        keys: dict[int, tuple] = {}
        options = []
        for quota in quotas:
            worst, total = state.pmax, state.psum
            empty, full = set(), set()
            for x, p in enumerate(quota):
                if p:
                    if x not in keys:
                        classes = by_root.get(x, [])
                        keys[x] = (x, tuple(sorted(pick for pick in state.picks if self.root[pick[0]] == x)),
                                   tuple((c, ecap[c], emin[c]) for c in classes))
                        if keys[x] not in self.root_shapes:
                            self.root_shapes[keys[x]] = self._root_shape(state, classes, ecap, emin)
                    key = keys[x], p
                    if key not in self.root_bounds:
                        self.root_bounds[key] = self._root_bound(state, x, self.root_shapes[keys[x]], p)
                    bound = self.root_bounds[key]
                    if bound is None:
                        break
                    worst, total = max(worst, bound[0]), total + bound[1]
                    empty |= bound[2]
                    full |= bound[3]
            else:
                options.append((quota, worst, total, empty, full))
        return options

    def _root_shape(self, state: _State, classes: list[int], ecap: list[int], emin: list[int]) -> tuple:
        """What the open classes of one root offer, whatever the number of devices added.

        How they stand to the chosen devices (`_reach`); per level, its nodes and
        each node's devices (chosen, or forced by the minimums) and room for optional ones;
        (devices a node can supply, closest pair meeting there); the forced
        devices' count and depth; the optional depths, shallowest first.
        """
        held = state.held[:]
        room = [0] * len(self.split)
        supply = [0] * len(self.split)
        forced = forced_depth = 0
        for c in classes:
            for v in self.anc[c]:
                held[v] += emin[c]
                room[v] += ecap[c] - emin[c]
                supply[v] += ecap[c]
            forced += emin[c]
            forced_depth += emin[c] * self.depth[c]
        x = self.root[classes[0]] if classes else -1
        levels = []
        for weight, level in self.levels[x] if classes else ():
            nodes = [v for v in level if held[v] or room[v]]
            levels.append((weight, nodes, tuple((held[v], room[v]) for v in nodes)))
        meeting = [(supply[v], self.split[v]) for v in {v for c in classes for v in self.anc[c]}
                   if self.split[v] is not None]
        depths = sorted((self.depth[c], ecap[c] - emin[c]) for c in classes if ecap[c] > emin[c])
        reach = _reach(classes, state.slot_sum, state.slot_max, ecap, emin)
        return reach, levels, meeting, forced, forced_depth, depths

    def _root_bound(self, state: _State, x: int, shape: tuple, p: int) -> tuple[int, int, set, set] | None:
        """Lower bound on the (max, sum) of distances p more devices add under root x.

        With it, the tree nodes that get no optional device, and those that get
        all theirs, in any completion meeting the sum bound exactly.
        """
        reach, levels, meeting, forced, depths, optional_depths = shape
        near = _nearest(reach, p)
        if near is None or p == 1:
            return None if near is None else (*near, set(), set())
        # p devices meet at a node that can supply p of them.
        inner_max = min((split for room, split in meeting if room >= p), default=0)
        # For any set of n devices, the distance sum is (n - 1) * (sum of
        # depths) - 2 * (over every node, pairs of devices below it), and a
        # level's pairs are bounded level by level; forced devices count as held.
        left = p - forced
        for depth, cap in optional_depths:
            take = min(cap, left)
            depths += take * depth
            left -= take
        together = 0
        empty, full = set(), set()
        for weight, nodes, counts in levels:
            pairs, none_of, all_of = _level_pairs(counts, p - forced)
            together += weight * pairs
            empty.update(nodes[i] for i in none_of)
            full.update(nodes[i] for i in all_of)
        n = state.roots[x] + p
        joint = (n - 1) * (state.root_depth[x] + depths) - 2 * together - state.root_sum[x]
        if near[1] > joint:
            # Meeting this bound says nothing about how the tree fills.
            return max(near[0], inner_max), near[1], set(), set()
        # Meeting it exactly takes each level's most pairs and the least depth.
        return max(near[0], inner_max), joint, empty, full


def _bump(values: tuple[int, ...], x: int, k: int) -> tuple[int, ...]:
    return values[:x] + (values[x] + k,) + values[x + 1:]


def _feasible(classes: list[int], r: int, ecap: list[int], emin: list[int]) -> bool:
    return sum(emin[c] for c in classes) <= r <= sum(ecap[c] for c in classes)


def _fewest_unknown(classes: list[int], known: list, r: int,
                    ecap: list[int], emin: list[int]) -> tuple[int, list[int], bool]:
    """How few of r devices must be unknown in some respect (NUMA, PCI path): only when known ones run out.

    `known[c]` is truthy when class c is known. Pins both sides to that number;
    returns it, the known classes still open and whether a limit changed.
    """
    known_classes, blind = [], []
    known_cap = blind_min = 0
    for c in classes:
        if known[c]:
            known_classes.append(c)
            known_cap += ecap[c]
        else:
            blind.append(c)
            blind_min += emin[c]
    u = max(blind_min, r - known_cap)
    if _pin(blind, u, ecap, emin) | _pin(known_classes, r - u, ecap, emin):
        return u, [c for c in known_classes if ecap[c]], True
    return u, known_classes, False


def _open_groups(classes: list[int], group: list[int], paid: int, target: int,
                 ecap: list[int], emin: list[int]) -> tuple[int, bool] | None:
    """Fewest groups (NUMA nodes, cards) that hold `target` devices of `classes`: those `paid` for, then the largest.

    `group[c]` is the bit of the group of class c; 0 makes each device a group
    of its own. Narrows the limits to the completions using that few groups.
    Returns (the groups, whether a limit changed), or None if the classes
    cannot hold `target` devices.
    """
    room: dict[int, int] = {}
    single_min = single_cap = 0
    for c in classes:
        bit = group[c]
        if bit:
            room[bit] = room.get(bit, 0) + ecap[c]
            if emin[c]:
                paid |= bit
        else:
            single_min += emin[c]
            single_cap += ecap[c]
    need = target - single_min - sum(v for bit, v in room.items() if bit & paid)
    unpaid = sorted([v for bit, v in room.items() if not bit & paid] + [1] * (single_cap - single_min), reverse=True)
    extra = _needed(unpaid, need)
    if extra is None:
        return None
    # Opening `extra` groups gives at most the largest ones' room, so the
    # devices chosen fall short of all the room in use by at most `slack`:
    # a paid group's class gives all but `slack`, and a group too small to
    # reach `need` with the largest others stays closed.
    slack = sum(unpaid[:extra]) - need
    smallest = unpaid[extra - 1] - slack if extra else _INFEASIBLE
    changed = False
    for c in classes:
        bit = group[c]
        if bit & paid:
            if ecap[c] - slack > emin[c]:
                emin[c] = ecap[c] - slack
                changed = True
        elif ecap[c] > emin[c] and (room[bit] if bit else 1) < smallest:
            ecap[c] = emin[c]
            changed = True
    return paid.bit_count() + single_min + extra, changed


def _pin(classes: list[int], picks: int, ecap: list[int], emin: list[int]) -> bool:
    """The classes must give exactly `picks` devices: at either extreme that fixes each class.

    Returns whether a limit changed.
    """
    low = high = 0
    for c in classes:
        low += emin[c]
        high += ecap[c]
    if low == high or picks not in (low, high):
        return False
    for c in classes:
        if picks == low:
            ecap[c] = emin[c]
        else:
            emin[c] = ecap[c]
    return True


def _pin_roots(root: list[int], classes: list[int], quotas: list[list[int]],
               ecap: list[int], emin: list[int]) -> bool:
    """Pin each root whose number of new devices is the same in every remaining split."""
    changed = False
    for x in range(len(quotas[0]) if quotas else 0):
        if len({quota[x] for quota in quotas}) == 1:
            changed |= _pin([c for c in classes if root[c] == x], quotas[0][x], ecap, emin)
    return changed


def _needed(caps_desc: list[int], need: int) -> int | None:
    """How many groups, largest first, hold `need` devices; None if they cannot."""
    count = 0
    for cap in caps_desc:
        if need <= 0:
            break
        need -= cap
        count += 1
    return count if need <= 0 else None


def _best_splits(base: list[int], spare: list[int], grow: int) -> tuple[int, list[tuple[int, ...]] | None] | None:
    """Most of sum(n_x ** 2) after adding `grow` devices on top of `base`, at most `spare` per root.

    Returns that maximum with every split reaching it or, with too many roots
    to try, an upper bound and None; None when the roots cannot take `grow`.
    """
    if not 0 <= grow <= sum(spare):
        return None
    growing = [x for x, s in enumerate(spare) if s > 0]
    squares = sum(b * b for b in base)
    if grow == 0:
        return squares, [(0,) * len(base)]
    if len(growing) <= 2:
        # Along the one free direction the sum is strictly convex: the ends win.
        first, last = growing[0], growing[-1]
        ends = {min(spare[first], grow), grow - min(spare[last], grow)} if len(growing) == 2 else {grow}
        values = {}
        for a in ends:
            split = [0] * len(base)
            split[first] += a
            split[last] += grow - a
            values[tuple(split)] = squares + sum(2 * b * n + n * n for b, n in zip(base, split))
        best = max(values.values())
        return best, [split for split, value in values.items() if value == best]
    if len(growing) <= _EXACT_ROOTS:
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
        return best, splits
    # Two relaxations, each an upper bound: everything on the fullest growing
    # root ignoring its limit, or the largest possible roots filled first
    # ignoring what they already hold.
    top = max(base[x] for x in growing)
    unlimited = squares + 2 * top * grow + grow * grow
    left = sum(base) + grow
    filled = 0
    for cap in sorted((b + s for b, s in zip(base, spare)), reverse=True):
        take = min(cap, left)
        filled += take * take
        left -= take
    return min(unlimited, filled), None


def _fill(caps_desc: list[int], p: int) -> int:
    """Most pairs inside groups when p devices go into empty groups of these sizes: largest first."""
    pairs = 0
    for cap in caps_desc:
        if p < 2:
            break
        take = min(cap, p)
        pairs += _pairs(take)
        p -= take
    return pairs


# Pure, and the same few levels recur across the nodes of a search and across requests.
@functools.lru_cache(maxsize=4096)
def _level_pairs(nodes: tuple[tuple[int, int], ...], p: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """An upper bound on the pairs below a level's nodes once p devices are added.

    `nodes` holds (devices held, room left) per node; a node with h devices
    gaining n has C(h + n, 2) pairs. Exact unless many nodes that already
    hold devices can grow. With the bound, when two nodes at most can grow:
    the nodes that get nothing, and those that get all their room, in every
    allocation reaching it (which need not place all p devices).
    """
    pairs = sum(_pairs(held) for held, _ in nodes)
    growing = [i for i, (_, room) in enumerate(nodes) if room]
    if len(growing) <= 2:
        # The gains are convex, so the best uses as much as possible with at
        # most one node short of its room: one of two extremes.
        if not growing:
            return pairs, (), ()
        total = min(p, sum(nodes[i][1] for i in growing))
        first, last = growing[0], growing[-1]
        ends = [min(nodes[first][1], total), total - min(nodes[last][1], total)] if first != last else [total]
        gains = [_pairs(nodes[first][0] + a) - _pairs(nodes[first][0]) +
                 (_pairs(nodes[last][0] + total - a) - _pairs(nodes[last][0]) if first != last else 0) for a in ends]
        best = max(gains)
        given = [(a, total - a) for a, gain in zip(ends, gains) if gain == best]
        none_of = tuple(i for k, i in enumerate((first, last)[:len(growing)]) if all(g[k] == 0 for g in given))
        # A lone device in a node adds no pair, so it may as well go elsewhere:
        # only a node whose last device adds pairs must be filled.
        all_of = tuple(i for k, i in enumerate((first, last)[:len(growing)])
                       if sum(nodes[i]) >= 2 and all(g[k] == nodes[i][1] for g in given))
        return pairs + best, none_of, all_of
    grown = [nodes[i] for i in growing if nodes[i][0]]
    fresh = sorted((nodes[i][1] for i in growing if not nodes[i][0]), reverse=True)
    if not grown:
        # Empty nodes: the most pairs come from filling the largest first.
        return pairs + _fill(fresh, p), (), ()
    if len(grown) > _EXACT_NODES:
        # Each node's gain is convex in what it gets, so below its chord: a
        # fractional knapsack over whole nodes bounds the sum.
        left = p
        for gain, room in sorted(((held * room + _pairs(room), room) for held, room in map(nodes.__getitem__, growing)),
                                 key=lambda item: item[0] / item[1], reverse=True):
            take = min(room, left)
            pairs += -(-gain * take // room)
            left -= take
        return pairs, (), ()
    # fill[b]: pairs from b devices on the empty nodes, largest first.
    fill = [0] * (p + 1)
    b, full = 0, 0
    for cap in fresh:
        for j in range(1, min(cap, p - b) + 1):
            fill[b + j] = full + _pairs(j)
        b, full = min(b + cap, p), full + _pairs(cap)
    for rest in range(b + 1, p + 1):
        fill[rest] = full
    # The gains are convex, so the best lies at a vertex: every held node gets
    # nothing or all its room but at most one, the rest goes to the empty nodes.
    best = 0
    for mask in range(1 << len(grown)):
        full_nodes = [grown[i] for i in range(len(grown)) if mask >> i & 1]
        left = p - sum(room for _, room in full_nodes)
        if left < 0:
            continue
        gain = sum(_pairs(held + room) - _pairs(held) for held, room in full_nodes)
        best = max(best, gain + fill[left])
        for i, (held, room) in enumerate(grown):
            if not mask >> i & 1:
                for a in range(1, min(room, left + 1)):
                    best = max(best, gain + _pairs(held + a) - _pairs(held) + fill[left - a])
    return pairs + best, (), ()


def _reach(classes: list[int], slot_sum: list[int], slot_max: list[int],
           ecap: list[int], emin: list[int]) -> tuple:
    """How the devices of `classes` stand to the chosen ones, whatever their number.

    (forced, most, forced max, forced sum, optional by sum, optional by max): the
    forced minimums, the most the classes can give, the farthest and the total
    distance of the forced devices, then the optional devices' (distance, count)
    sorted by their sum and by their maximum distance to the chosen ones.
    """
    forced = most = forced_sum = 0
    forced_max = -1
    optional = []
    for c in classes:
        forced += emin[c]
        most += ecap[c]
        forced_sum += emin[c] * slot_sum[c]
        if emin[c] and slot_max[c] > forced_max:
            forced_max = slot_max[c]
        if ecap[c] > emin[c]:
            optional.append((slot_sum[c], slot_max[c], ecap[c] - emin[c]))
    by_sum = sorted((total, n) for total, _, n in optional)
    by_max = sorted((worst, n) for _, worst, n in optional)
    return forced, most, forced_max, forced_sum, by_sum, by_max


def _nearest(reach: tuple, p: int) -> tuple[int, int] | None:
    """Least (max, sum) of distances to the chosen devices when p devices come from these classes."""
    forced, most, worst, total, by_sum, by_max = reach
    if not forced <= p <= most:
        return None
    left = p - forced
    for distance, n in by_sum:
        if left <= 0:
            break
        total += min(n, left) * distance
        left -= n
    left = p - forced
    for distance, n in by_max:
        if left <= 0:
            break
        worst = max(worst, distance)
        left -= n
    return max(worst, 0), total


def _position(path: tuple[str, ...] | None, subtree: dict[tuple[str, ...], int]) -> tuple:
    """(kind, shared path, distance between two such devices): equal positions are interchangeable.

    A device alone below some node T is, to every other device, just "h hops
    below T's parent"; devices sharing an endpoint, or with devices below them,
    keep their exact path.
    """
    if not path:
        return "unreadable", (), 0
    if subtree[path] > 1 or len(path) == 1:
        return "at", path, 0
    # Climb while the device is still alone below the node.
    top = len(path)
    while top > 2 and subtree[path[:top - 1]] == 1:
        top -= 1
    return "sibling", path[:top - 1], 2 * (len(path) - top + 1)
