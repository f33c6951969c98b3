"""The search's answers held to answers recorded from an earlier version of it, over the seeded node families.

A refactoring of placement must not change a single answer, nor the work it spends (the work decides where
the budget cuts a search, and so the answer of a cut one). The recorded file holds, per request, the
devices, whether the answer was proven optimal, the work units spent, the score and what a cut search had
settled. The requests cover the irregular family at 32, 64 and 128 devices, the spec's shapes, the pools
made to spend the work bound, and searches cut by small budgets, so both the exact search and the greedy
fill are held.

Record again only from a version whose answers are known good (a change meant to alter them, checked
against the oracle tests):

    python -m tests.unit.test_placement_recorded
"""

from __future__ import annotations

import functools
import json
import pathlib
import random
from collections.abc import Iterator

import pytest

from bench.placement_nodes import STRESS, irregular_node, pf_node, vf_node
from resource_worker.placement import WORK_BUDGET, Candidate, place

RECORDED = pathlib.Path(__file__).with_name("test_placement_answers.json")
# Cut budgets: the greedy fill answers at the smallest, a mix of fill and partial search above.
CUT_BUDGETS = (30, 300, 3000)


def _node(name: str) -> dict[str, Candidate]:
    family, _, argument = name.partition(":")
    if family == "irregular":
        seed, devices = argument.split("/")
        return irregular_node(int(seed), int(devices))
    if family == "stress":
        return STRESS[argument]()
    return vf_node(roots=int(argument)) if family == "vf" else pf_node()


def _nodes() -> Iterator[tuple[str, int, tuple[int, ...]]]:
    """(node name, size step, budgets) for each node the recording covers."""
    for seed in range(6):
        yield f"irregular:{seed}/32", 3, (WORK_BUDGET,)
        yield f"irregular:{seed}/64", 5, (WORK_BUDGET,)
    yield "irregular:0/128", 9, (WORK_BUDGET,)
    for seed in range(3):
        yield f"irregular:{seed}/64", 7, CUT_BUDGETS
    yield "vf:1", 5, (WORK_BUDGET, 300)
    yield "vf:2", 5, (WORK_BUDGET,)
    yield "pf:", 5, (WORK_BUDGET,)
    for name in STRESS:
        yield f"stress:{name}", 16, (WORK_BUDGET,)


def _requests() -> Iterator[tuple[str, dict[str, Candidate], list[str], int, int]]:
    """(node name, node, mandatory devices, size, budget): every step-th size with 0-3 mandatory devices."""
    for name, step, budgets in _nodes():
        node = _node(name)
        ids = sorted(node)
        rng = random.Random(f"recorded/{name}")
        for size in range(1, len(ids) + 1, step):
            for count in range(min(3, size) + 1):
                mandatory = sorted(rng.sample(ids, count))
                for budget in budgets:
                    yield name, node, mandatory, size, budget


def _answer(node: dict[str, Candidate], mandatory: list[str], size: int, budget: int) -> list:
    """[devices as a mask, proven optimal, work, score less the IDs, open bound]."""
    placement = place(node, sorted(node), mandatory, size, budget=budget)
    return [_mask(node, placement.devices), placement.proven_optimal, placement.work,
            None if placement.score is None else list(placement.score[:-1]),
            None if placement.open_bound is None else list(placement.open_bound.settled())]


def _mask(node: dict[str, Candidate], devices: list[str]) -> str:
    """The devices as a hex bit mask over the node's sorted IDs (their order is fixed: mandatory, then sorted)."""
    chosen = set(devices)
    return f"{sum(1 << i for i, device in enumerate(sorted(node)) if device in chosen):x}"


def _devices(node: dict[str, Candidate], mask: str) -> list[str]:
    return [device for i, device in enumerate(sorted(node)) if int(mask, 16) >> i & 1]


def _by_node() -> dict[str, list[tuple[dict[str, Candidate], list[str], int, int]]]:
    cases: dict[str, list[tuple[dict[str, Candidate], list[str], int, int]]] = {}
    for name, node, mandatory, size, budget in _requests():
        cases.setdefault(name, []).append((node, mandatory, size, budget))
    return cases


def _record() -> None:
    """One line per node: its answers in the order of `_requests`."""
    lines = [f"{json.dumps(name)}:{json.dumps([_answer(*case) for case in cases], separators=(',', ':'))}"
             for name, cases in _by_node().items()]
    RECORDED.write_text("{\n" + ",\n".join(lines) + "\n}\n")


CASES = _by_node()


@functools.cache
def _recording() -> dict[str, list]:
    return json.loads(RECORDED.read_text())


def test_the_recording_covers_exact_cut_and_fallback_answers():
    assert list(_recording()) == list(CASES)
    assert [len(answers) for answers in _recording().values()] == [len(cases) for cases in CASES.values()]
    answers = [answer for answers in _recording().values() for answer in answers]
    _, proven, _, scores, bounds = zip(*answers, strict=True)
    assert any(proven) and not all(proven)
    assert any(bound is not None and len(bound) < 6 for bound in bounds)
    assert None in scores


@pytest.mark.parametrize("name", list(CASES))
def test_answers_match_the_recorded_ones(name):
    for (node, mandatory, size, budget), expected in zip(CASES[name], _recording()[name], strict=True):
        answer = _answer(node, mandatory, size, budget)
        if answer != expected:
            # Shown with the devices' IDs: a mask says little.
            shown = [[_devices(node, a[0]), *a[1:]] for a in (answer, expected)]
            assert shown[0] == shown[1], (mandatory, size, budget)


if __name__ == "__main__":
    _record()
