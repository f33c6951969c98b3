"""The search's guarantees on irregular forests: bounded work, valid and deterministic answers, and a
check on every answer that turns a wrong one into the kubelet fallback."""

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from loguru import logger

from bench.placement_nodes import irregular_node
from resource_worker.allocation_calls import AllocationCalls
from resource_worker.device_table import DeviceTable
from resource_worker.placement import PlacementCheckError, place, score
from resource_worker.placement import api as placement_api
from resource_worker.placement.counting import numa_options
from resource_worker.placement.geometry import forest
from resource_worker.placement.incumbent import first_selection
from resource_worker.placement.pool import tables_for
from resource_worker.placement.score import Bound, Score, SplitScore
from resource_worker.placement.state import RequestClasses
from shared.kubelet.deviceplugin.v1beta1 import api_pb2
from shared.observability.metrics import Recorder
from shared.resources import Resource
from tests.support.inventory import message, record
from tests.support.placement_instances import placement_instances

SEEDS = range(12)


def _requests(node, seed, sizes):
    """Every size given, with 0-3 mandatory devices drawn from a seeded RNG."""
    rng = random.Random(seed)
    ids = sorted(node)
    for size in sizes:
        for count in range(min(3, size) + 1):
            yield rng.sample(ids, count), size


def _assert_valid(node, mandatory, size, devices):
    assert len(devices) == size == len(set(devices))
    assert devices[:len(mandatory)] == sorted(mandatory)
    assert set(devices) <= set(node)


def test_the_irregular_family_is_seeded_and_covers_the_hard_shapes():
    nodes = [irregular_node(seed, 64) for seed in SEEDS]
    assert nodes == [irregular_node(seed, 64) for seed in SEEDS]
    assert all(len(node) == 64 for node in nodes)
    assert irregular_node(0, 32) != irregular_node(1, 32)
    devices = [c for node in nodes for c in node.values()]
    roots = [{c.pci_path[0] for c in node.values() if c.pci_path} for node in nodes]
    depths = [{len(c.pci_path) for c in node.values() if c.pci_path} for node in nodes]
    assert {len(r) for r in roots} == {1, 2, 3}
    assert max(len(d) for d in depths) >= 4
    # NUMA follows neither the roots nor the cards.
    assert any(len({c.numa_node for c in node.values() if c.pci_path and c.pci_path[0] == root}) > 1
               for node, node_roots in zip(nodes, roots, strict=True) for root in node_roots)
    assert any(c.numa_node is None for c in devices)
    assert any(c.pci_path is None for c in devices)
    pf_cards = [c.card for c in devices if c.card is None or c.card.startswith("sid:")]
    vf_cards = [c.card for c in devices if c.card and c.card.startswith("pf:")]
    assert None in pf_cards and len(vf_cards) > len(set(vf_cards))   # invalid SIDs; VFs grouped by parent PF
    assert any(len({c.pci_path[:-1] for c in node.values() if c.card == card and c.pci_path}) > 1
               for node in nodes for card in {c.card for c in node.values() if c.card and c.card.startswith("sid:")})


def _overrun(node):
    """What a call may spend past its budget: one walk out from one centre, a step per class of its root."""
    tables = tables_for(tuple(node[i] for i in sorted(node)))
    return max((len(tree.classes) for tree in forest(tables)), default=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_irregular_forests_get_valid_deterministic_answers(seed):
    node = irregular_node(seed, 64 if seed % 2 else 32)
    ids = sorted(node)
    # Every size for some forests (the old search crashed on some sizes), every seventh for the others.
    for mandatory, size in _requests(node, seed, range(1, len(ids) + 1, 1 if seed < 4 else 7)):
        first = place(node, ids, mandatory, size)
        _assert_valid(node, mandatory, size, first.devices)
        assert first.score is None or first.score == score(first.devices, node)
        assert first.work <= placement_api.WORK_BUDGET + _overrun(node)
        # The same request on a rebuilt pool, in another order, gets the same answer.
        tables_for.cache_clear()
        forest.cache_clear()
        rebuilt = {d: dataclasses.replace(c) for d, c in node.items()}
        assert place(rebuilt, ids[::-1], mandatory[::-1], size) == first


def test_the_partial_scores_name_a_run_of_the_score_s_components_in_its_order():
    for partial in (SplitScore, Bound):
        positions = [Score._fields.index(name) for name in partial._fields]
        assert positions == list(range(positions[0], positions[0] + len(positions)))
    assert Bound(0, 1, cards=2).settled() == (0, 1, 2)


@pytest.mark.parametrize("budget", [1, 30, 300, 3000])
def test_a_cut_search_stops_at_its_budget(budget):
    node = irregular_node(3, 64)
    ids = sorted(node)
    for mandatory, size in _requests(node, budget, range(5, 60, 9)):
        answer = place(node, ids, mandatory, size, budget=budget)
        assert answer.work <= budget + _overrun(node)


@pytest.mark.parametrize("budget", [1, 30, 300])
def test_a_cut_search_still_answers_at_least_as_well_as_its_first_answer(budget):
    node = irregular_node(3, 64)
    ids = sorted(node)
    cut = 0
    for mandatory, size in _requests(node, budget, range(5, 60, 9)):
        answer = place(node, ids, mandatory, size, budget=budget)
        _assert_valid(node, mandatory, size, answer.devices)
        assert answer.score == score(answer.devices, node)
        tables = tables_for(tuple(node[i] for i in ids))
        classes = RequestClasses(tables, set(mandatory))
        first = first_selection(tables, classes, size, numa_options(tables, classes.mandatory, size).options)
        assert first == score(first.device_ids, node)
        assert answer.score <= first
        if not answer.proven_optimal:
            cut += 1
            shortfall = answer.shortfall()
            assert shortfall.component in answer.score._fields
            assert shortfall.bound is None or shortfall.bound < shortfall.answer
            # What the cut search had settled is the optimum's: the full search agrees.
            full = place(node, ids, mandatory, size)
            assert full.proven_optimal
            settled = answer.open_bound.settled()
            assert full.score[:len(settled)] == settled
        else:
            assert answer.shortfall() is None
    if budget == 1:
        assert cut > 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placement_instances())
def test_a_small_instance_is_never_cut(instance):
    node, available, mandatory = instance
    for size in range(max(1, len(set(mandatory))), len(set(available)) + 1):
        assert place(node, available, mandatory, size).proven_optimal


# -- the check on every answer ----------------------------------------------------------------

NODE = irregular_node(5, 32)
IDS = sorted(NODE)
MANDATORY = IDS[3:5]


def _broken_search(monkeypatch, wrong):
    """Make the search return `wrong(right answer)` instead of its answer."""
    run = placement_api.Search.run

    def broken(self, incumbent):
        outcome = run(self, incumbent)
        return dataclasses.replace(outcome, score=outcome.score._replace(
            device_ids=tuple(wrong(list(outcome.score.device_ids)))))
    monkeypatch.setattr(placement_api.Search, "run", broken)


@pytest.mark.parametrize("wrong, words", [
    (lambda ids: ids[:-1], ["7 devices for a request of 8"]),
    (lambda ids: ids[:-1] + ids[-2:-1], ["repeated"]),
    (lambda ids: [i for i in IDS if i not in ids and i not in MANDATORY][:1] + [i for i in ids if i != MANDATORY[0]],
     ["mandatory devices left out", repr(MANDATORY[0])]),
    (lambda ids: ids[:-1] + ["rbln999"], ["not offered", "rbln999"]),
])
def test_an_answer_breaking_the_request_is_an_internal_error(monkeypatch, wrong, words):
    assert len(place(NODE, IDS, MANDATORY, 8).devices) == 8
    _broken_search(monkeypatch, wrong)
    with pytest.raises(PlacementCheckError) as error:
        place(NODE, IDS, MANDATORY, 8)
    for word in words:
        assert word in str(error.value)


class _Context:
    """A call's context, as far as GetPreferredAllocation uses it: its metrics are written at the call's end."""

    def add_callback(self, callback) -> bool:
        callback()
        return True


def _preferred(servicer, ids, size):
    request = api_pb2.PreferredAllocationRequest(container_requests=[api_pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=ids, allocation_size=size)])
    return list(servicer.preferred_allocation(request, _Context()).container_responses[0].deviceIDs)


def test_the_servicer_weighs_the_records_of_the_latest_scan():
    # The servicer keeps its placement candidates between calls: a scan that changes only what placement
    # weighs (here the SIDs, not health or NUMA) must still reach the next answer.
    ids = [f"rbln{i}" for i in range(4)]

    def scanned(sids):
        return message(devices=tuple(record(f"rbln{i}", npu=i, bus_id=f"0000:{3 + i:02x}:00.0", sid=sid,
                                            pci_path=("pci0000:00", f"0000:{3 + i:02x}:00.0"))
                                     for i, sid in enumerate(sids)))
    table = DeviceTable(Resource.NPU)
    table.apply(scanned(["SN0", "SN1", "SN2", "SN3"]))
    servicer = AllocationCalls(table, allocator=None, tracer=None, metrics=Recorder(None))
    assert _preferred(servicer, ids, 2) == ["rbln0", "rbln1"]
    assert _preferred(servicer, ids, 2) == ["rbln0", "rbln1"]
    table.apply(scanned(["SN0", "SN1", "CARD", "CARD"]))
    assert _preferred(servicer, ids, 2) == ["rbln2", "rbln3"]


def test_the_servicer_falls_back_to_the_kubelet_when_the_check_fires(monkeypatch):
    table = DeviceTable(Resource.NPU)
    table.apply(message(devices=tuple(record(f"rbln{i}", npu=i, bus_id=f"0000:{3 + i:02x}:00.0",
                                                          pci_path=("pci0000:00", f"0000:{3 + i:02x}:00.0"))
                                                   for i in range(4))))
    servicer = AllocationCalls(table, allocator=None, tracer=None, metrics=Recorder(None))
    request = api_pb2.PreferredAllocationRequest(container_requests=[api_pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=["rbln0", "rbln1", "rbln2", "rbln3"], allocation_size=2)])
    records = []
    sink = logger.add(lambda m: records.append(m.record), level="DEBUG")
    try:
        assert list(servicer.preferred_allocation(request, _Context()).container_responses[0].deviceIDs) == \
            ["rbln0", "rbln1"]
        _broken_search(monkeypatch, lambda ids: ids + ids)
        assert list(servicer.preferred_allocation(request, _Context()).container_responses[0].deviceIDs) == []
    finally:
        logger.remove(sink)
    fallbacks = [r for r in records if r["message"] == "Preferred allocation fallback to kubelet"]
    assert len(fallbacks) == 1 and fallbacks[0]["level"].name == "WARNING"
    assert "PlacementCheckError" in fallbacks[0]["extra"]["err"] and "repeated" in fallbacks[0]["extra"]["err"]


def test_a_search_the_work_bound_cuts_is_told_in_a_debug_record_and_still_answers(monkeypatch):
    # Eight devices of their own cards on two NUMA nodes: a budget of one unit cuts the search.
    table = DeviceTable(Resource.NPU)
    table.apply(message(devices=tuple(record(f"rbln{i}", npu=i, numa_node=i % 2, sid=f"SN{i}",
                                             bus_id=f"0000:{3 + i:02x}:00.0",
                                             pci_path=("pci0000:00", f"0000:{3 + i:02x}:00.0"))
                                      for i in range(8))))
    servicer = AllocationCalls(table, allocator=None, tracer=None, metrics=Recorder(None))
    monkeypatch.setattr("resource_worker.allocation_calls.place", lambda *args: place(*args, budget=1))
    records = []
    sink = logger.add(lambda m: records.append(m.record), level="DEBUG")
    try:
        chosen = _preferred(servicer, [f"rbln{i}" for i in range(8)], 3)
    finally:
        logger.remove(sink)
    assert len(chosen) == 3 and len({int(i[4:]) % 2 for i in chosen}) == 1, "the first answer keeps one NUMA node"
    answered = [r for r in records if r["message"] == "Preferred allocation"]
    assert len(answered) == 1 and answered[0]["extra"]["provenOptimal"] is False
    cut = [r for r in records if r["message"] == "Preferred allocation search stopped at its work bound"]
    assert len(cut) == 1 and cut[0]["level"].name == "DEBUG"
    fields = cut[0]["extra"]
    assert fields["workBudget"] == placement_api.WORK_BUDGET
    assert fields["searchWork"] == answered[0]["extra"]["searchWork"] <= 1, "the work of the call, within its budget"
    assert fields["openComponent"] in placement_api.Score._fields and "answerValue" in fields and "openBound" in fields
