"""The score of a selection: one field per component, compared in field order, lower is better.

Invariant: `score` is the definition. The search computes the same values
component by component, and the tests compare its answers and their scores with
this function on every selection of small pools; nothing else decides what
"better" means. The search carries what it knows of a score in the types here,
never in bare tuples: `SplitScore` for the components a split of the devices
over the PCI roots settles, `Bound` for the optimum's components settled so far,
`Score` for a complete selection. Their fields are `Score`'s, in its order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from resource_worker.placement.request import Candidate


class Score(NamedTuple):
    unknown_numa: int
    """Devices whose NUMA node is unknown."""
    numa_nodes: int
    """Distinct known NUMA nodes."""
    cards: int
    """Distinct cards; a device with no known card is a card of its own."""
    unreadable_paths: int
    """Devices whose PCI path could not be read."""
    cross_root_pairs: int
    """Pairs of readable devices under different PCI roots."""
    max_distance: int
    """The longest tree distance between two devices under one root (0 when there is no such pair)."""
    distance_sum: int
    """The sum of those distances."""
    device_ids: tuple[str, ...]
    """The selection's IDs, sorted: the deterministic tie-break."""


class SplitScore(NamedTuple):
    """What every selection of one split of the devices over the places (PCI roots, unreadable paths) scores
    on the components the split settles; the NUMA components before them are the same for every split."""

    cards: int
    unreadable_paths: int
    cross_root_pairs: int


class Bound(NamedTuple):
    """The optimum's components as far as a search has settled them, in order; None: not settled (nor any
    after it). The components after `max_distance` are settled only with the answer itself."""

    unknown_numa: int
    numa_nodes: int
    cards: int | None = None
    unreadable_paths: int | None = None
    cross_root_pairs: int | None = None
    max_distance: int | None = None

    def settled(self) -> tuple[int, ...]:
        """The settled components, in order."""
        settled = []
        for value in self:
            if value is None:
                break
            settled.append(value)
        return tuple(settled)


def distance(first: tuple[str, ...], second: tuple[str, ...]) -> int:
    """Hops between two devices under one root: the depths of both less twice their lowest common ancestor's."""
    common = 0
    while common < min(len(first), len(second)) and first[common] == second[common]:
        common += 1
    return len(first) + len(second) - 2 * common


def score(selection: Iterable[str], candidates: Mapping[str, Candidate]) -> Score:
    devices = [candidates[d] for d in selection]
    cards = {d.card for d in devices if d.card is not None}
    readable = [d.pci_path for d in devices if d.pci_path]
    cross, distances = 0, []
    for a, b in itertools.combinations(readable, 2):
        if a[0] != b[0]:
            cross += 1
        else:
            distances.append(distance(a, b))
    return Score(unknown_numa=sum(d.numa_node is None for d in devices),
                 numa_nodes=len({d.numa_node for d in devices if d.numa_node is not None}),
                 cards=len(cards) + sum(d.card is None for d in devices),
                 unreadable_paths=len(devices) - len(readable),
                 cross_root_pairs=cross,
                 max_distance=max(distances, default=0),
                 distance_sum=sum(distances),
                 device_ids=tuple(sorted(d.device_id for d in devices)))
