"""The entry point: validate a request, answer it within the work bound, check the answer.

Invariant: every call does at most `WORK_BUDGET` units of search work (and one
centre's walk more) beyond building a pool's tables, whatever the pool, so its
time is bounded on any machine and its answer depends only on its input. The
answer is the exact optimum when the search finishes (`proven_optimal`), else
the better of the best selection the search completed and the greedy fill;
either way it has passed `check_answer`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from resource_worker.placement.incumbent import first_selection
from resource_worker.placement.pool import tables_for
from resource_worker.placement.request import Candidate, check_answer, validate
from resource_worker.placement.score import Bound, Score
from resource_worker.placement.search import Search

# Search work per call: roughly one unit per class or tree node looked at, per pair of counts a
# tree merge compares, per branch made. Calibrated on CPU time (docs/placement.md): a call
# spending all of it costs at most about 13 ms of search on the reference machine, about 19 ms
# with the greedy answer such a call then also computes.
WORK_BUDGET = 40000


class Shortfall(NamedTuple):
    component: str
    """The first score component on which some selection might still beat the answer."""
    bound: object
    """The optimum's value there (None: not settled before the budget ran out)."""
    answer: object
    """The answer's own value of that component."""


@dataclasses.dataclass(frozen=True)
class Placement:
    devices: list[str]
    """Mandatory devices first, then the others sorted."""
    proven_optimal: bool
    work: int
    """Search work units spent."""
    score: Score | None
    """None when there was nothing to choose (all mandatory, or the whole pool)."""
    open_bound: Bound | None
    """When the search was cut: the optimum's components it had settled (the others None)."""

    def shortfall(self) -> Shortfall | None:
        """When cut: the first component where the answer may be beaten, the optimum there if it was settled
        (else None), and the answer's value."""
        if self.open_bound is None or self.score is None:
            return None
        # A field the bound does not have, or has not settled, is None: the loop returns there at the latest.
        for name, value in zip(Score._fields, self.score, strict=True):
            bound = getattr(self.open_bound, name, None)
            if bound != value:
                return Shortfall(name, bound, value)
        raise AssertionError("a cut search settled every component of the score")


def place(candidates: Mapping[str, Candidate], available: Sequence[str], must_include: Sequence[str], size: int,
          budget: int = WORK_BUDGET) -> Placement:
    """The best `size` devices of `available` including all of `must_include`, within `budget` work units."""
    request = validate(candidates, available, must_include, size)
    score, work, proven, open_bound = None, 0, True, None
    if size == len(request.mandatory):
        chosen: Sequence[str] = request.mandatory
    elif size == len(request.pool):
        chosen = request.pool
    else:
        tables = tables_for(tuple(candidates[i] for i in request.pool))
        search = Search(tables, set(request.mandatory), size, budget)
        outcome = search.run(lambda: first_selection(tables, search.classes, size, search.numa.options))
        chosen, score = outcome.score.device_ids, outcome.score
        work, proven, open_bound = outcome.work, outcome.proven_optimal, outcome.open_bound
    # Checked as the search gave it: putting the mandatory devices first must not hide one it dropped.
    check_answer(request, list(chosen))
    mandatory = set(request.mandatory)
    devices = request.mandatory + sorted(i for i in chosen if i not in mandatory)
    return Placement(devices, proven, work, score, open_bound)


def preferred_allocation(candidates: Mapping[str, Candidate], available: Sequence[str],
                         must_include: Sequence[str], size: int) -> list[str]:
    """The devices of `place`: mandatory ones first."""
    return place(candidates, available, must_include, size).devices
