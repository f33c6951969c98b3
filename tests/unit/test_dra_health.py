"""The health stream: the report as a function of the inventory, and NodeWatchResources over real gRPC on a unix
socket, in both versions the kubelet may pick."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from dra_worker.health import (
    HEALTH_TIMEOUT_SECONDS,
    DeviceReport,
    HealthReports,
    HealthWatch,
    add_health_services,
    health_report,
)
from dra_worker.inventory import InventoryState
from dra_worker.server import UnixServer
from shared.dra_health.v1 import api_pb2 as v1_pb2
from shared.dra_health.v1 import api_pb2_grpc as v1_grpc
from shared.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
from shared.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from shared.streams import StreamTracker
from tests.support.dra import NODE, feed, simulated_node
from tests.support.waiting import wait_until

FAULT, BUSY, READY = 4, 1, 0
ALL = ["rbln0", "rbln1", "rbln2-0", "rbln2-1", "rbln2-2", "rbln2-3"]


@pytest.fixture
def world(tmp_path):
    node = simulated_node(tmp_path)
    state = InventoryState()
    reports = HealthReports(clock=lambda: 1_700_000_000.0)
    state.on_change = lambda: reports.update(state.current())
    return node, state, reports


def test_the_report_lists_every_device_of_the_pool_with_the_status_an_unhealthy_one_is_in(world):
    node, state, _ = world
    assert health_report(state.current()) is None  # nothing before every resource's first snapshot
    feed(state, node)
    assert health_report(state.current()) == tuple(DeviceReport(d, True, "") for d in ALL)
    node.set_status("rbln1", FAULT)
    node.set_status("rbln0", BUSY)
    feed(state, node, seq=2)
    report = {r.device: r for r in health_report(state.current()) or ()}
    assert report["rbln1"] == DeviceReport("rbln1", False, "FAULT")
    assert report["rbln0"] == DeviceReport("rbln0", False, "BUSY")
    # An unreadable status keeps the fault (the spec's policy, as for ListAndWatch).
    node.set_status("rbln1", None)
    feed(state, node, seq=3)
    assert {r.device: r for r in health_report(state.current()) or ()}["rbln1"] == DeviceReport("rbln1", False,
                                                                                                  "FAULT")


def test_the_version_moves_only_when_the_report_changes(world):
    node, state, reports = world
    feed(state, node)
    version, report, at = reports.next(-1, 5, lambda: True)
    assert report is not None and at == 1_700_000_000
    feed(state, node, seq=2)  # the same health: nothing new, the wait times out with the same report
    assert reports.next(version, 0.05, lambda: True)[:2] == (version, report)
    node.set_status("rbln0", FAULT)
    feed(state, node, seq=3)
    newer, changed, _ = reports.next(version, 5, lambda: True)
    assert newer > version and changed != report


@pytest.fixture
def serving(world, short_tmp):
    node, state, reports = world
    watch = HealthWatch(reports, NODE, StreamTracker(limit=2), resend_period=0.3)
    server = UnixServer(short_tmp / "dra.sock", lambda s: add_health_services(s, watch), "test")
    server.start()
    yield node, state, watch, f"unix://{short_tmp / 'dra.sock'}"
    server.stop()


class Reader:
    """A client of the stream reading every message on its own thread."""

    def __init__(self, target: str, stub_class=v1_grpc.DRAResourceHealthStub, pb2=v1_pb2):
        self.channel = grpc.insecure_channel(target)
        self.call = stub_class(self.channel).NodeWatchResources(pb2.NodeWatchResourcesRequest())
        self.messages: queue.Queue = queue.Queue()
        self.error: list[grpc.RpcError] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for message in self.call:
                self.messages.put(message)
        except grpc.RpcError as exc:
            self.error.append(exc)

    def next(self, timeout: float = 5):
        return self.messages.get(timeout=timeout)

    def close(self):
        self.call.cancel()
        self.channel.close()


def _health(message, pb2=v1_pb2) -> dict[str, tuple[str, str]]:
    return {d.device.device_name: (pb2.HealthStatus.Name(d.health), d.message) for d in message.devices}


@pytest.mark.parametrize("stub_class, pb2", [(v1_grpc.DRAResourceHealthStub, v1_pb2),
                                             (v1alpha1_grpc.DRAResourceHealthStub, v1alpha1_pb2)])
def test_a_stream_sends_the_whole_pool_then_each_change_then_the_same_again(serving, stub_class, pb2):
    node, state, _, target = serving
    reader = Reader(target, stub_class, pb2)
    try:
        feed(state, node)  # the pool becomes known only now: the first message waits for it
        first = reader.next()
        assert _health(first, pb2) == {d: ("HEALTHY", "") for d in ALL}
        assert {(d.device.pool_name, d.health_check_timeout_seconds, d.last_updated_time)
                for d in first.devices} == {(NODE, HEALTH_TIMEOUT_SECONDS, 1_700_000_000)}
        node.set_status("rbln1", FAULT)
        feed(state, node, seq=2)
        assert _health(reader.next(), pb2)["rbln1"] == ("UNHEALTHY", "FAULT")
        assert _health(reader.next(), pb2)["rbln1"] == ("UNHEALTHY", "FAULT")  # resent without a change
        node.set_status("rbln1", READY)
        feed(state, node, seq=3)
        assert _health(reader.next(), pb2)["rbln1"] == ("HEALTHY", "")
    finally:
        reader.close()


def test_a_client_that_stops_reading_costs_only_itself_and_the_open_streams_are_bounded(serving):
    node, state, watch, target = serving
    feed(state, node)
    stalled = grpc.insecure_channel(target)
    stalled_call = v1_grpc.DRAResourceHealthStub(stalled).NodeWatchResources(v1_pb2.NodeWatchResourcesRequest())
    reader = Reader(target)
    try:
        wait_until(lambda: watch.streams.open_streams == 2, 5, "both streams open")
        # The limit is two: a third is refused at once, the open ones go on.
        third = grpc.insecure_channel(target)
        with pytest.raises(grpc.RpcError) as refused:
            next(v1_grpc.DRAResourceHealthStub(third).NodeWatchResources(v1_pb2.NodeWatchResourcesRequest(),
                                                                         timeout=5))
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        third.close()
        for seq, status in enumerate((FAULT, READY) * 20, start=2):  # many changes, the stalled client reads none
            node.set_status("rbln0", status)
            feed(state, node, seq=seq)
        wait_until(lambda: _health(reader.next())["rbln0"] == ("HEALTHY", ""), 10, "the reader follows")
        assert watch.streams.open_streams == 2
    finally:
        stalled_call.cancel()
        stalled.close()
        reader.close()
    wait_until(lambda: watch.streams.open_streams == 0, 5, "closed streams are counted out")

