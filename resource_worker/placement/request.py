"""What placement is asked and what it may answer: candidates, request validation and the answer check.

Invariant: a request reaches the search only once `validate` has accepted it,
and an answer leaves placement only once `check_answer` has: exactly `size`
distinct devices, every mandatory one among them, none that was not offered.
A request that breaks the rules is the kubelet's error (PlacementRequestError);
an answer that breaks them is placement's own (PlacementCheckError).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence

from shared.node.device_record import DeviceRecord, card_key
from shared.node.sriov import parse_numa
from shared.observability.hostile_ids import listed


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


class PlacementCheckError(RuntimeError):
    """Placement computed an answer that breaks the request's rules: a bug, never sent to the kubelet."""


@dataclasses.dataclass(frozen=True)
class Request:
    """A validated request: distinct sorted IDs, every one a known candidate."""

    pool: list[str]
    mandatory: list[str]
    size: int


def candidate_from_record(record: DeviceRecord) -> Candidate:
    return Candidate(
        device_id=record.device_id,
        numa_node=parse_numa(record.numa_node),
        card=card_key(record.sid, record.parent_pf),
        pci_path=record.pci_path or None,
    )


def validate(candidates: Mapping[str, Candidate], available: Sequence[str], must_include: Sequence[str],
             size: int) -> Request:
    pool = sorted(set(available))
    mandatory = sorted(set(must_include))
    if size < 0:
        raise PlacementRequestError(f"allocation size {size} is negative")
    if size == 0 and mandatory:
        raise PlacementRequestError(f"allocation size 0 cannot hold the {len(mandatory)} mandatory devices")
    unknown = [i for i in sorted(set(pool) | set(mandatory)) if i not in candidates]
    if unknown:
        raise PlacementRequestError(f"unknown device IDs: {listed(unknown, quote=True)}")
    missing = sorted(set(mandatory) - set(pool))
    if missing:
        raise PlacementRequestError(f"mandatory devices not available: {listed(missing, quote=True)}")
    if len(mandatory) > size:
        raise PlacementRequestError(f"{len(mandatory)} mandatory devices exceed allocation size {size}")
    if size > len(pool):
        raise PlacementRequestError(f"allocation size {size} exceeds the {len(pool)} available devices")
    return Request(pool, mandatory, size)


def check_answer(request: Request, answer: Sequence[str]) -> None:
    """Raises PlacementCheckError unless `answer` is a selection the request allows."""
    problems = []
    if len(answer) != request.size:
        problems.append(f"{len(answer)} devices for a request of {request.size}")
    repeated = sorted(i for i, count in collections.Counter(answer).items() if count > 1)
    if repeated:
        problems.append(f"repeated devices {listed(repeated, quote=True)}")
    dropped = sorted(set(request.mandatory) - set(answer))
    if dropped:
        problems.append(f"mandatory devices left out: {listed(dropped, quote=True)}")
    offered = set(request.pool)
    foreign = sorted({i for i in answer if i not in offered})
    if foreign:
        problems.append(f"devices not offered: {listed(foreign, quote=True)}")
    if problems:
        raise PlacementCheckError("placement answer rejected: " + "; ".join(problems))

