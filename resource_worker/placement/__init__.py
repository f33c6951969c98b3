"""Topology-aware preferred allocation: which devices the kubelet should take.

A selection is scored lexicographically, lower is better (`score.Score`): NUMA,
then cards, then PCI roots, then PCI distances, then the sorted IDs. `api.place`
answers a request exactly (`search`) over classes of look-alike devices
(`pool`): the counting components in closed form (`counting`), then per PCI
root the least largest distance over balls of its tree (`geometry`, `balls`)
and the least distance sum and ID tie-break by a tree dynamic program
(`tree_dp`), within a fixed amount of work; a greedy fill (`incumbent`) answers
when that work runs out first. `request` holds what crosses the boundary:
candidates, validation and the check of every answer.

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
from shared.node.device_record import card_key

__all__ = ["WORK_BUDGET", "Candidate", "Placement", "PlacementCheckError", "PlacementRequestError", "Score",
           "candidate_from_record", "card_key", "place", "preferred_allocation", "score"]
