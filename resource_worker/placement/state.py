"""What one request's search carries: its work meter and its view of the pool's classes.

Invariant: work is counted only through a `WorkMeter`. A step whose size is
known pays before it runs (`charge`): one that would pass the budget raises
`WorkSpent` instead, uncounted. A step whose size is known only once done (one
walk out from one centre, `record`) is counted after it, so the count passes the
budget by at most that walk. Either way nothing runs once the budget is spent.
`RequestClasses` gives each class's mandatory devices first, then its others in
ID order: a class giving n devices always gives those n.
"""

from __future__ import annotations

from resource_worker.placement.pool import PoolTables


class WorkSpent(Exception):
    """The request's work budget ran out."""


class WorkMeter:
    """The work units one request has spent, against its budget."""

    def __init__(self, budget: int) -> None:
        self.work = 0
        self.budget = budget

    def charge(self, units: int) -> None:
        """Pays for a step about to run, or raises WorkSpent if it would pass the budget."""
        if self.work + units > self.budget:
            raise WorkSpent
        self.work += units

    def record(self, units: int) -> None:
        """Counts a step that has run; raises WorkSpent if the budget is now passed."""
        self.work += units
        if self.work > self.budget:
            raise WorkSpent


class RequestClasses:
    """The classes as one request sees them: which of their devices are mandatory."""

    def __init__(self, tables: PoolTables, mandatory: set[str]) -> None:
        self.mandatory_ids = [tuple(i for i in ids if i in mandatory) for ids in tables.ids]
        self.free_ids = [tuple(i for i in ids if i not in mandatory) for ids in tables.ids]
        self.mandatory = [len(ids) for ids in self.mandatory_ids]
        pool_size = sum(tables.size)
        # A device's weight: 2 ** (pool size - 1 - its place in ID order). Of two selections of one size, the
        # one with the smaller sorted IDs is the one with the larger total weight, so the ID tie-break adds up.
        self.free_weights = []
        for ids, ranks in zip(tables.ids, tables.ranks, strict=True):
            chosen = [1 << (pool_size - 1 - rank) for i, rank in zip(ids, ranks, strict=True) if i not in mandatory]
            prefix = [0]
            for weight in chosen:
                prefix.append(prefix[-1] + weight)
            self.free_weights.append(prefix)

    def ids(self, cls: int, count: int) -> tuple[str, ...]:
        """The devices a class gives when it gives `count`: its mandatory ones, then its smallest others."""
        return self.mandatory_ids[cls] + self.free_ids[cls][:count - self.mandatory[cls]]

    def chosen(self, counts: dict[int, int]) -> list[str]:
        return [i for cls, count in counts.items() for i in self.ids(cls, count)]
