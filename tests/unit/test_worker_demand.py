"""The scanner's orders to supervisord: a worker per resource the node has (scanner/worker_demand.py)."""

from __future__ import annotations

import pytest

from scanner.worker_demand import ABSENT_GRACE_MAX_SECONDS, Need, Order, State, WorkerDemand, absent_grace, plan
from shared.resources import Resource
from shared.supervision import transport

GRACE = 15.0


def test_a_resource_with_devices_has_its_worker_started_once():
    order, state = plan(State(), True, 0.0, GRACE)
    assert order is Order.START and state.need is Need.STARTED
    assert plan(state, True, 1.0, GRACE) == (None, state)


def test_a_resource_that_left_has_its_worker_stopped_after_the_grace_only():
    _, started = plan(State(), True, 0.0, GRACE)
    order, leaving = plan(started, False, 10.0, GRACE)
    assert order is None and leaving == State(Need.LEAVING, 10.0)
    assert plan(leaving, False, 10.0 + GRACE - 0.1, GRACE) == (None, leaving)
    order, stopped = plan(leaving, False, 10.0 + GRACE, GRACE)
    assert order is Order.STOP and stopped.need is Need.STOPPED
    assert plan(stopped, False, 100.0, GRACE) == (None, stopped), "ordered once"
    order, back = plan(stopped, True, 101.0, GRACE)
    assert order is Order.START and back.need is Need.STARTED


def test_a_resource_back_within_the_grace_keeps_its_worker():
    _, started = plan(State(), True, 0.0, GRACE)
    _, leaving = plan(started, False, 1.0, GRACE)
    order, state = plan(leaving, True, 2.0, GRACE)
    assert order is Order.START and state.need is Need.STARTED  # supervisord answers ALREADY_STARTED


def test_the_grace_is_three_scans_and_at_most_half_a_minute():
    assert absent_grace(5.0) == 15.0
    assert absent_grace(0.2) == pytest.approx(0.6)
    assert absent_grace(3600.0) == ABSENT_GRACE_MAX_SECONDS == 30.0


class Orders:
    def __init__(self, failing: bool = False):
        self.sent: list[tuple[Order, str]] = []
        self.failing = failing

    def __call__(self, order: Order, program: str) -> bool:
        if self.failing:
            raise OSError("supervisord at run/supervisor.sock did not answer")
        self.sent.append((order, program))
        return True


def test_scans_start_and_stop_workers_and_a_failed_scan_neither():
    now = [0.0]
    orders = Orders()
    demand = WorkerDemand(orders, lambda: now[0], GRACE)
    demand.follow({Resource.NPU: 8, Resource.NPU_VF1: 0, Resource.NPU_VF4: 0}, scan_failed=False)
    assert orders.sent == [(Order.START, "worker-npu")]
    now[0] = 5.0
    demand.follow({}, scan_failed=True)
    now[0] = 5.0 + GRACE
    demand.follow({}, scan_failed=True)
    assert orders.sent == [(Order.START, "worker-npu")], "a failed scan says nothing of what the node has"
    # Repartitioned into 4 VFs per card: npu's worker goes after the grace, vf4's starts at once.
    demand.follow({Resource.NPU_VF4: 32}, scan_failed=False)
    assert orders.sent[-1] == (Order.START, "worker-npu-vf4")
    now[0] += GRACE
    demand.follow({Resource.NPU_VF4: 32}, scan_failed=False)
    assert sorted(orders.sent[2:]) == sorted([(Order.STOP, "worker-npu"), (Order.STOP, "worker-npu-vf1")])


def test_an_order_that_fails_is_logged_once_and_sent_again_at_the_next_scan(monkeypatch):
    logged = []
    monkeypatch.setattr("scanner.worker_demand.logger.error", lambda message, **fields: logged.append(fields))
    orders = Orders(failing=True)
    demand = WorkerDemand(orders, lambda: 0.0, GRACE)
    for _ in range(3):
        demand.follow({Resource.NPU: 1}, scan_failed=False)
    assert [fields["program"] for fields in logged] == ["worker-npu"]
    orders.failing = False
    demand.follow({Resource.NPU: 1}, scan_failed=False)
    assert orders.sent == [(Order.START, "worker-npu")]


def test_the_orders_are_supervisords_methods_and_faults():
    from supervisor.xmlrpc import Faults

    assert (transport.ALREADY_STARTED_FAULT, transport.NOT_RUNNING_FAULT) == (Faults.ALREADY_STARTED,
                                                                              Faults.NOT_RUNNING)
    import xmlrpc.client

    params, method = xmlrpc.client.loads(transport.program_order(Order.START.value, "worker-npu-vf4"))
    assert (method, params) == ("supervisor.startProcess", ("worker-npu-vf4", False))
    with pytest.raises(ValueError):
        transport.program_order("startProcess", "worker</string>")
