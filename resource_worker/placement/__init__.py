"""Topology-aware preferred allocation: which devices the kubelet should take.

A selection is scored lexicographically, lower is better (`score.Score`): NUMA,
then cards, then PCI roots, then PCI distances, then the sorted IDs. `api.place`
answers a request exactly by branch and bound (`search`) over classes of
look-alike devices (`pool`), pruning with per-component lower bounds (`bounds`)
built from pure relaxations (`relaxations`), starting from a greedy first
answer (`incumbent`), within a fixed amount of work. `request` holds what
crosses the boundary: candidates, validation and the check of every answer.

Invariant: callers use only what this module exports; everything else is the
search's own and may change with it.
"""

from resource_worker.placement.api import WORK_BUDGET, Placement, place, preferred_allocation
from resource_worker.placement.request import (
    Candidate,
    PlacementCheckError,
    PlacementRequestError,
    candidate_from_record,
)
from resource_worker.placement.score import Score, score
from shared.inventory import card_key

__all__ = ["WORK_BUDGET", "Candidate", "Placement", "PlacementCheckError", "PlacementRequestError", "Score",
           "candidate_from_record", "card_key", "place", "preferred_allocation", "score"]
