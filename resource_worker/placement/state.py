"""A partial selection as the search sees it: how many devices each class gives, and what they add up to.

Invariant: a `State` holds exactly the score components of the devices its
picks name (each class giving its mandatory devices, then its smallest other
IDs), plus the per-class distances to them that the bounds read; adding a pick
makes a new state, so a state seen by one search node never changes.
"""

from __future__ import annotations

from typing import NamedTuple

from resource_worker.placement.pool import PoolTables
from resource_worker.placement.relaxations import pairs


class WorkMeter:
    """The work units one request's search has spent, against its budget; shared by the search and its bounds."""

    def __init__(self, budget: int) -> None:
        self.work = 0
        self.budget = budget

    def spent(self) -> bool:
        return self.work >= self.budget


class Pick(NamedTuple):
    cls: int
    count: int


class RequestClasses:
    """The classes as one request sees them: which of their devices are mandatory."""

    def __init__(self, tables: PoolTables, mandatory: set[str]) -> None:
        self.mandatory_ids = [tuple(i for i in ids if i in mandatory) for ids in tables.ids]
        self.free_ids = [tuple(i for i in ids if i not in mandatory) for ids in tables.ids]
        self.mandatory = [len(ids) for ids in self.mandatory_ids]

    def ids(self, cls: int, count: int) -> tuple[str, ...]:
        """The devices a class gives when it gives `count`: its mandatory ones, then its smallest others."""
        return self.mandatory_ids[cls] + self.free_ids[cls][:count - self.mandatory[cls]]

    def chosen(self, picks: tuple[Pick, ...]) -> list[str]:
        return [i for pick in picks for i in self.ids(pick.cls, pick.count)]


def _bump(values: tuple[int, ...], index: int, count: int) -> tuple[int, ...]:
    return values[:index] + (values[index] + count,) + values[index + 1:]


class State:
    """What the chosen devices add up to.

    Besides the score's counts: `solo` devices with a card of their own; per
    root, `roots` devices, `root_depth` their depths and `root_sum` their
    distances; `held` devices below each tree node; per class, `slot_sum` and
    `slot_max` the total and farthest distance from one of its devices to the
    chosen ones (-1: none under its root); `picks` what was chosen.
    """

    __slots__ = ("unknown", "numa_mask", "card_mask", "solo", "unreadable", "cross", "max_distance",
                 "distance_sum", "roots", "root_depth", "root_sum", "held", "slot_sum", "slot_max", "picks")

    @classmethod
    def empty(cls, tables: PoolTables) -> State:
        state = cls.__new__(cls)
        state.unknown = state.numa_mask = state.card_mask = state.solo = state.unreadable = 0
        state.cross = state.max_distance = state.distance_sum = 0
        state.roots = state.root_depth = state.root_sum = (0,) * tables.n_roots
        state.held = [0] * len(tables.split)
        state.slot_sum = [0] * len(tables.size)
        state.slot_max = [-1] * len(tables.size)
        state.picks = ()
        return state

    def _copy(self) -> State:
        other = State.__new__(State)
        for name in State.__slots__:
            setattr(other, name, getattr(self, name))
        return other

    def score_values(self, classes: RequestClasses) -> list:
        """The score of a complete selection, component by component."""
        return [self.unknown, self.numa_mask.bit_count(), self.card_mask.bit_count() + self.solo,
                self.unreadable, self.cross, self.max_distance, self.distance_sum,
                tuple(sorted(classes.chosen(self.picks)))]

    def add(self, tables: PoolTables, cls: int, count: int) -> State:
        state = self._copy()
        state.picks = self.picks + (Pick(cls, count),)
        if tables.numa_bit[cls]:
            state.numa_mask |= tables.numa_bit[cls]
        else:
            state.unknown += count
        if tables.card_bit[cls]:
            state.card_mask |= tables.card_bit[cls]
        else:
            state.solo += count
        root = tables.root[cls]
        if root < 0:
            state.unreadable += count
            return state
        state.cross += count * (sum(self.roots) - self.roots[root])
        added = count * self.slot_sum[cls] + pairs(count) * tables.intra[cls]
        state.distance_sum += added
        state.max_distance = max(self.max_distance, self.slot_max[cls], tables.intra[cls] if count > 1 else 0)
        state.roots = _bump(self.roots, root, count)
        state.root_depth = _bump(self.root_depth, root, count * tables.depth[cls])
        state.root_sum = _bump(self.root_sum, root, added)
        state.held = self.held[:]
        for v in tables.above[cls]:
            state.held[v] += count
        state.slot_sum = self.slot_sum[:]
        state.slot_max = self.slot_max[:]
        for other, d in tables.links[cls]:
            state.slot_sum[other] += count * d
            if d > state.slot_max[other]:
                state.slot_max[other] = d
        return state
