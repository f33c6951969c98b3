"""A worker's lifecycle alone: its plugin instances, the kubelet's socket and the clock are fakes, the device
table and the status file are real (in tmp_path). No supervisord, no gRPC, no waiting on a wall clock."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Callable

import pytest
from loguru import logger

from resource_worker.device_table import DeviceTable
from resource_worker.lifecycle import (
    BACKOFF_MAX,
    BACKOFF_START,
    HANDOVER_SECONDS,
    IDLE_CHECK_SECONDS,
    UNTIL_SIGNALLED,
    Backoff,
    Phase,
    RegistrationError,
    Worker,
)
from shared.channels import status_files
from shared.node.driver_status import UNREADABLE, StatusReading
from shared.resources import Resource
from tests.support.inventory import message, record

RESOURCE = Resource.NPU
KUBELET_SOCKET = pathlib.Path("/kubelet/kubelet.sock")
FIRST_KUBELET = (1, 7, 1_000)
RESTARTED_KUBELET = (1, 7, 2_000)  # the same inode number again, bound later
WAITING = "Kubelet restarted; waiting for the watchdog's order to restart the device plugin"
RESTARTING = "Restarting device plugin for the new kubelet"
NO_ORDER = "No restart came after the kubelet restarted; registering with the new kubelet"


class FakeRegistration:
    def __init__(self, on_done: Callable[[], None]) -> None:
        self._on_done = on_done
        self._outcome: Exception | str | None = "pending"
        self.cancelled = False

    def done(self) -> bool:
        return self._outcome != "pending"

    def result(self) -> None:
        if isinstance(self._outcome, Exception):
            raise self._outcome

    def cancel(self) -> None:
        self.cancelled = True

    def answer(self, error: Exception | None = None) -> None:
        self._outcome = error
        self._on_done()


class FakeStreams:
    def __init__(self) -> None:
        self.open_streams = 0
        self.dropped = False

    def take_dropped(self) -> bool:
        dropped, self.dropped = self.dropped and self.open_streams == 0, False
        return dropped


class FakePlugin:
    def __init__(self, socket_name: str, on_stream_change: Callable[[], None], asked: threading.Event) -> None:
        self.socket_name = socket_name
        self.asked = asked
        self.on_stream_change = on_stream_change
        self.streams = FakeStreams()
        self.socket_exists = False
        self.socket_watched = False  # most tests: a socket the worker has to look at
        self.stopped = False
        self.registrations: list[FakeRegistration] = []
        self.announced = 0

    def serve(self) -> None:
        self.socket_exists = True

    def register(self, kubelet_socket: pathlib.Path, on_done: Callable[[], None]) -> FakeRegistration:
        assert kubelet_socket == KUBELET_SOCKET and self.socket_exists, "serving before Register"
        self.registrations.append(FakeRegistration(on_done))
        self.asked.set()
        return self.registrations[-1]

    def log_registered(self) -> None:
        self.announced += 1

    def stop(self) -> None:
        self.stopped = True
        self.socket_exists = False


class Rig:
    """A worker with fakes around it, and what it did to them."""

    def __init__(self, run_dir: pathlib.Path) -> None:
        self.now = 1000.0
        self.kubelet: tuple[int, int, int] | None = FIRST_KUBELET  # kubelet.sock's identity
        self.plugins: list[FakePlugin] = []
        self.asked = threading.Event()  # set at every Register call
        self.shutdown = threading.Event()
        self.run_dir = run_dir
        self.worker = Worker(RESOURCE, DeviceTable(RESOURCE), self._new_plugin, KUBELET_SOCKET, run_dir,
                             self.shutdown, kubelet_identity=lambda: self.kubelet, clock=lambda: self.now)

    def _new_plugin(self, on_stream_change: Callable[[], None]) -> FakePlugin:
        self.plugins.append(FakePlugin(f"plugin-{len(self.plugins)}.sock", on_stream_change, self.asked))
        return self.plugins[-1]

    @property
    def plugin(self) -> FakePlugin:
        return self.plugins[-1]

    def inventory(self, *device_ids: str, seq: int = 1) -> None:
        self.worker.on_inventory(message(devices=[record(i, bus_id=f"0000:0{n + 3}:00.0")
                                                  for n, i in enumerate(device_ids)], seq=seq))

    def status(self) -> dict | None:
        return status_files.read_status(self.run_dir, RESOURCE.process_name)

    def registered(self) -> FakePlugin:
        """Drive the worker to REGISTERED on a fresh inventory."""
        self.inventory("rbln0", "rbln1")
        assert self.worker.step() == IDLE_CHECK_SECONDS
        self.plugin.registrations[-1].answer()
        assert self.worker.step() == IDLE_CHECK_SECONDS
        assert self.worker.phase is Phase.REGISTERED
        return self.plugin


@pytest.fixture
def rig(tmp_path) -> Rig:
    return Rig(tmp_path)


@pytest.fixture
def logged():
    records: list[tuple[str, str]] = []
    sink = logger.add(lambda m: records.append((m.record["level"].name, m.record["message"])), level="DEBUG")
    yield records
    logger.remove(sink)


def test_without_an_inventory_nothing_is_served_until_something_wakes_it(rig):
    assert rig.worker.step() is UNTIL_SIGNALLED
    assert rig.plugins == [] and not rig.worker.serving
    assert rig.status()["registered"] is False and rig.status()["endpoint"] is None


def test_devices_start_serving_then_register_and_the_status_file_says_so(rig, logged):
    rig.inventory("rbln0", "rbln1")
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    plugin = rig.plugin
    assert plugin.socket_exists and len(plugin.registrations) == 1
    assert rig.worker.phase is Phase.REGISTERING
    assert rig.worker.step() == IDLE_CHECK_SECONDS, "no answer yet: still registering, nothing new asked"
    assert len(plugin.registrations) == 1 and rig.worker.phase is Phase.REGISTERING
    plugin.registrations[0].answer()
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    assert rig.worker.phase is Phase.REGISTERED and plugin.announced == 1
    status = rig.status()
    assert (status["registered"], status["endpoint"], status["deviceCount"]) == (True, "plugin-0.sock", 2)
    assert sorted(status["devices"]) == ["rbln0", "rbln1"]
    assert rig.worker.step() == IDLE_CHECK_SECONDS and len(plugin.registrations) == 1, "registered: left alone"


def test_a_register_answer_and_a_stream_change_wake_the_loop(rig):
    rig.inventory("rbln0")
    rig.worker.step()
    rig.worker._attention.clear()
    rig.plugin.registrations[0].answer()
    assert rig.worker._attention.is_set()
    rig.worker._attention.clear()
    rig.plugin.on_stream_change()
    assert rig.worker._attention.is_set()


def test_a_refused_registration_is_retried_after_a_growing_backoff_that_success_resets(rig, logged):
    rig.inventory("rbln0")
    rig.worker.step()
    waits = []
    for attempt in range(8):
        rig.plugin.registrations[attempt].answer(RegistrationError("UNAVAILABLE: kubelet is restarting"))
        refused_at = rig.now
        waits.append(rig.worker.step())
        assert rig.worker.phase is Phase.UNREGISTERED
        rig.now = refused_at + waits[-1] / 2
        assert rig.worker.step() == pytest.approx(waits[-1] / 2), "asked again too early"
        assert len(rig.plugin.registrations) == attempt + 1
        rig.now = refused_at + waits[-1]
        assert rig.worker.step() == IDLE_CHECK_SECONDS and len(rig.plugin.registrations) == attempt + 2
    assert waits == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    failures = [level for level, msg in logged if msg == "Registration with kubelet failed; retrying"]
    assert failures == ["WARNING"] + ["DEBUG"] * 7, "the reason is logged once, retries at debug"
    rig.plugin.registrations[-1].answer()
    rig.worker.step()
    assert rig.worker.phase is Phase.REGISTERED
    rig.plugin.streams.dropped = True
    rig.worker.step()
    rig.plugin.registrations[-1].answer(RegistrationError("UNAVAILABLE"))
    assert rig.worker.step() == BACKOFF_START, "success reset the backoff"
    assert [level for level, msg in logged if msg == "Registration with kubelet failed; retrying"][-1] == "WARNING"


def test_without_the_kubelet_socket_the_worker_serves_and_waits_without_calling_register(rig, logged):
    rig.kubelet = None
    rig.inventory("rbln0")
    assert rig.worker.step() == BACKOFF_START
    assert rig.plugin.socket_exists and rig.plugin.registrations == []
    rig.now += BACKOFF_START
    assert rig.worker.step() == 2 * BACKOFF_START
    assert [lv for lv, msg in logged if msg == "Waiting for the kubelet socket"] == ["INFO", "DEBUG"]
    rig.kubelet = FIRST_KUBELET
    rig.now += 2 * BACKOFF_START
    rig.worker.step()
    assert len(rig.plugin.registrations) == 1 and rig.worker.phase is Phase.REGISTERING


def test_a_removed_socket_is_replaced_by_a_new_instance_that_registers_again(rig, logged):
    old = rig.registered()
    old.socket_exists = False
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    assert old.stopped and len(rig.plugins) == 2
    new = rig.plugin
    assert new.socket_exists and len(new.registrations) == 1 and rig.worker.phase is Phase.REGISTERING
    assert ("WARNING", "Device plugin socket was removed; serving on a new one") in logged
    assert rig.status()["endpoint"] == "plugin-1.sock" and rig.status()["registered"] is False


@pytest.mark.parametrize("noticed", ["socket removed", "stream ended"])
def test_after_a_kubelet_restart_the_worker_leaves_the_new_registration_to_the_watchdogs_restart(rig, logged,
                                                                                               noticed):
    old = rig.registered()
    rig.kubelet = None  # the restarting kubelet removed every socket and has no kubelet.sock yet
    if noticed == "socket removed":
        old.socket_exists = False
    else:
        old.streams.dropped = True
    assert rig.worker.step() == BACKOFF_START
    assert old.stopped and len(rig.plugins) == 1 and rig.worker.phase is Phase.UNREGISTERED
    assert rig.status()["registered"] is False and rig.status()["endpoint"] is None
    assert ("INFO", WAITING) in logged
    assert not [msg for _, msg in logged if msg.startswith(("Device plugin socket was", "Kubelet ended"))]
    # However long the new kubelet takes to make its socket, it is looked for after a growing pause.
    pauses = []
    for _ in range(8):
        rig.now += HANDOVER_SECONDS
        pauses.append(rig.worker.step())
    assert pauses == [2 * BACKOFF_START, 4 * BACKOFF_START, 8 * BACKOFF_START, 16 * BACKOFF_START] + 4 * [BACKOFF_MAX]
    assert len(rig.plugins) == 1

    rig.kubelet = RESTARTED_KUBELET
    assert rig.worker.step() == HANDOVER_SECONDS, "the wait runs from the new kubelet.sock, the watchdog's cue"
    rig.now += 1.0
    assert rig.worker.step() == pytest.approx(HANDOVER_SECONDS - 1.0)
    assert len(rig.plugins) == 1
    assert [msg for _, msg in logged].count(WAITING) == 1
    # No restart came (the watchdog is down, say): the worker registers with the new kubelet itself, once.
    rig.now += HANDOVER_SECONDS - 1.0
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    assert len(rig.plugins) == 2 and len(rig.plugin.registrations) == 1
    assert ("WARNING", "No restart came after the kubelet restarted; registering with the new kubelet") in logged
    rig.plugin.registrations[0].answer()
    rig.worker.step()
    assert rig.worker.phase is Phase.REGISTERED
    rig.plugin.socket_exists = False
    rig.worker.step()
    assert len(rig.plugins) == 3, "registered with the new kubelet: a lost socket is served anew at once"


def test_a_register_refused_by_a_kubelet_going_away_waits_for_the_restart_once_the_new_one_is_there(rig, logged):
    plugin = rig.registered()
    plugin.streams.dropped = True
    rig.worker.step()  # kubelet.sock still the old one: the worker asks again
    plugin.registrations[-1].answer(RegistrationError("UNAVAILABLE: connection refused"))
    assert rig.worker.step() == BACKOFF_START
    rig.kubelet = RESTARTED_KUBELET
    rig.now += BACKOFF_START
    assert rig.worker.step() == HANDOVER_SECONDS
    assert len(plugin.registrations) == 2 and plugin.stopped


def test_a_kubelet_sock_out_of_sight_for_a_moment_is_the_same_kubelet_and_a_later_restart_still_waits(rig, logged):
    old = rig.registered()
    rig.kubelet = None
    old.socket_exists = False  # removed by someone else while kubelet.sock could not be read
    rig.worker.step()
    rig.kubelet = FIRST_KUBELET
    rig.now += 2 * HANDOVER_SECONDS
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    new = rig.plugin
    assert len(rig.plugins) == 2 and len(new.registrations) == 1, "the same kubelet: registered again at once"
    new.registrations[0].answer()
    rig.worker.step()
    rig.kubelet = RESTARTED_KUBELET
    new.streams.dropped = True
    assert rig.worker.step() == HANDOVER_SECONDS
    assert new.stopped and len(new.registrations) == 1


def test_a_kubelet_restart_during_the_first_registration_is_left_to_the_watchdog_too(rig):
    rig.inventory("rbln0")
    rig.worker.step()
    plugin = rig.plugin
    rig.kubelet = RESTARTED_KUBELET
    plugin.registrations[0].answer(RegistrationError("UNAVAILABLE: the kubelet went away"))
    assert rig.worker.step() == BACKOFF_START
    rig.now += BACKOFF_START
    assert rig.worker.step() == HANDOVER_SECONDS
    assert plugin.stopped and len(plugin.registrations) == 1


def health(rig: Rig) -> dict[str, str]:
    return {d.device_id: d.health.health.value for d in rig.worker.table.devices()}


def registered_with_a_health_history(rig: Rig) -> FakePlugin:
    """REGISTERED, rbln0 unhealthy only through its history (it faulted, its status is unreadable now)."""
    plugin = rig.registered()
    for seq, status in ((2, StatusReading(4)), (3, UNREADABLE)):
        rig.worker.on_inventory(message(devices=[record("rbln0", status=status, observed_at_ns=seq * 100)],
                                        seq=seq))
        rig.worker.step()
    assert health(rig) == {"rbln0": "Unhealthy"} and len(plugin.registrations) == 1
    return plugin


def test_the_watchdogs_order_before_the_worker_notices_the_new_kubelet_replaces_the_instance(rig, logged):
    old = registered_with_a_health_history(rig)
    rig.kubelet = RESTARTED_KUBELET
    rig.worker.order_restart()
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    assert old.stopped and len(rig.plugins) == 2
    new = rig.plugin
    assert new.socket_exists and len(new.registrations) == 1 and rig.worker.phase is Phase.REGISTERING
    assert health(rig) == {"rbln0": "Healthy"}, "the new instance starts with no health history"
    assert ("INFO", RESTARTING) in logged and not [m for _, m in logged if m in (WAITING, NO_ORDER)]
    new.registrations[0].answer()
    rig.worker.step()
    assert rig.worker.phase is Phase.REGISTERED
    rig.worker.order_restart()  # the same kubelet.sock again (a repeated order): it has this instance already
    rig.now += 2 * HANDOVER_SECONDS
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    assert len(rig.plugins) == 2 and len(new.registrations) == 1 and rig.worker.phase is Phase.REGISTERED


@pytest.mark.parametrize("noticed", ["socket removed", "stream ended"])
def test_the_watchdogs_order_ends_the_wait_of_a_worker_that_noticed_the_new_kubelet_first(rig, logged, noticed):
    old = registered_with_a_health_history(rig)
    rig.kubelet = None
    if noticed == "socket removed":
        old.socket_exists = False
    else:
        old.streams.dropped = True
    rig.worker.step()
    assert old.stopped and ("INFO", WAITING) in logged
    rig.kubelet = RESTARTED_KUBELET
    assert rig.worker.step() == HANDOVER_SECONDS
    rig.worker.order_restart()
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    assert len(rig.plugins) == 2 and len(rig.plugin.registrations) == 1
    assert health(rig) == {"rbln0": "Healthy"}
    rig.plugin.registrations[0].answer()
    rig.now += 2 * HANDOVER_SECONDS
    rig.worker.step()
    assert rig.worker.phase is Phase.REGISTERED and len(rig.plugin.registrations) == 1
    assert ("INFO", RESTARTING) in logged and ("WARNING", NO_ORDER) not in logged


def test_an_order_while_a_register_to_the_old_kubelet_is_in_flight_cancels_it(rig):
    rig.inventory("rbln0")
    rig.worker.step()
    in_flight = rig.plugin.registrations[0]
    rig.kubelet = RESTARTED_KUBELET
    rig.worker.order_restart()
    rig.worker.step()
    assert in_flight.cancelled and rig.plugins[0].stopped
    assert len(rig.plugins) == 2 and len(rig.plugin.registrations) == 1


def test_an_order_for_an_instance_the_new_kubelet_already_has_replaces_nothing(rig, logged):
    rig.kubelet = RESTARTED_KUBELET  # the worker started after the kubelet did: its first Register went there
    plugin = rig.registered()
    rig.worker.order_restart()
    rig.worker.step()
    assert len(rig.plugins) == 1 and not plugin.stopped and len(plugin.registrations) == 1
    assert rig.worker.phase is Phase.REGISTERED and ("INFO", RESTARTING) not in logged


def test_an_order_to_a_worker_waiting_for_the_kubelet_socket_registers_at_once(rig):
    rig.kubelet = None
    rig.inventory("rbln0")
    for _ in range(4):  # the pause before the next look has grown
        rig.now += rig.worker.step()
    rig.kubelet = RESTARTED_KUBELET
    rig.worker.order_restart()
    rig.worker.step()
    assert len(rig.plugins) == 1 and len(rig.plugin.registrations) == 1


def test_an_order_when_the_new_kubelet_sock_is_gone_again_serves_a_new_instance_that_waits_for_it(rig, logged):
    old = rig.registered()
    rig.kubelet = None
    rig.worker.order_restart()
    assert rig.worker.step() == BACKOFF_START
    assert old.stopped and len(rig.plugins) == 2 and rig.plugin.socket_exists and not rig.plugin.registrations
    assert ("INFO", "Waiting for the kubelet socket") in logged
    rig.kubelet = RESTARTED_KUBELET
    rig.worker.order_restart()  # the watchdog's order for the kubelet.sock made since
    rig.worker.step()
    assert len(rig.plugins) == 2 and len(rig.plugin.registrations) == 1


def test_an_order_to_a_worker_serving_nothing_does_nothing_and_devices_later_register_at_once(rig, logged):
    rig.worker.order_restart()
    assert rig.worker.step() is UNTIL_SIGNALLED and not rig.plugins
    rig.registered()
    rig.inventory(seq=2)
    rig.worker.step()  # the resource is gone
    rig.kubelet = RESTARTED_KUBELET
    rig.worker.order_restart()
    assert rig.worker.step() is UNTIL_SIGNALLED and len(rig.plugins) == 1
    assert ("INFO", RESTARTING) not in logged
    rig.inventory("rbln0", seq=3)
    rig.worker.step()
    # A new instance meets the kubelet there as a newcomer: nothing to hand over.
    assert len(rig.plugins) == 2 and len(rig.plugin.registrations) == 1 and ("INFO", WAITING) not in logged


def test_with_its_socket_watched_a_serving_worker_waits_for_a_wake_and_not_the_clock(rig, logged):
    rig.inventory("rbln0")
    rig.worker.step()
    rig.plugin.socket_watched = True
    assert rig.worker.step() is UNTIL_SIGNALLED, "a Register answer wakes it"
    rig.plugin.registrations[0].answer()
    assert rig.worker.step() is UNTIL_SIGNALLED and rig.worker.phase is Phase.REGISTERED
    assert rig.worker.step() is UNTIL_SIGNALLED
    # The watch woke it: the socket is gone.
    rig.plugin.socket_exists = False
    rig.plugin.on_stream_change()
    rig.worker.step()
    assert len(rig.plugins) == 2 and ("WARNING", "Device plugin socket was removed; serving on a new one") in logged


def test_a_stream_the_kubelet_drops_means_registering_again_on_the_same_socket(rig, logged):
    plugin = rig.registered()
    plugin.streams.dropped = True
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    assert rig.worker.phase is Phase.REGISTERING and len(plugin.registrations) == 2 and not plugin.stopped
    assert ("WARNING", "Kubelet ended the device list stream; registering again") in logged


def test_a_dropped_stream_while_another_is_open_changes_nothing(rig):
    plugin = rig.registered()
    plugin.streams.open_streams, plugin.streams.dropped = 1, True
    assert rig.worker.step() == IDLE_CHECK_SECONDS
    assert rig.worker.phase is Phase.REGISTERED and len(plugin.registrations) == 1


def test_the_last_device_gone_stops_the_instance_and_a_new_one_comes_with_devices(rig, logged):
    plugin = rig.registered()
    rig.inventory(seq=2)
    assert rig.worker.step() is UNTIL_SIGNALLED
    assert plugin.stopped and not rig.worker.serving and rig.worker.phase is Phase.UNREGISTERED
    assert ("INFO", "Stopped device plugin for absent resource") in logged
    assert rig.status()["registered"] is False and rig.status()["deviceCount"] == 0
    rig.inventory("rbln0", seq=3)
    rig.worker.step()
    assert len(rig.plugins) == 2 and rig.worker.phase is Phase.REGISTERING


def test_resource_gone_while_registering_cancels_the_call_in_flight(rig):
    rig.inventory("rbln0")
    rig.worker.step()
    in_flight = rig.plugin.registrations[0]
    rig.inventory(seq=2)
    rig.worker.step()
    assert in_flight.cancelled and rig.plugin.stopped


def test_run_serves_until_shutdown_then_stops_and_removes_its_status_file(rig):
    rig.inventory("rbln0")
    loop = threading.Thread(target=rig.worker.run)
    loop.start()
    try:
        assert rig.asked.wait(5), "the loop served and called Register by itself"
        rig.plugin.registrations[0].answer()
    finally:
        rig.shutdown.set()
        rig.worker.wake()
        loop.join(5)
    assert not loop.is_alive()
    assert rig.plugin.stopped and rig.status() is None


def test_backoff_doubles_to_its_cap_and_starts_over_when_reset():
    backoff = Backoff()
    assert [backoff.next() for _ in range(7)] == [BACKOFF_START * 2**n for n in range(5)] + [BACKOFF_MAX] * 2
    backoff.reset()
    assert backoff.next() == BACKOFF_START
    small = Backoff(1.0, 3.0)
    assert [small.next() for _ in range(4)] == [1.0, 2.0, 3.0, 3.0]


def test_an_instance_that_cannot_serve_is_tried_again_after_a_pause_and_the_worker_lives_on(rig, logged):
    failures = [RuntimeError("Failed to bind to address unix:///missing/plugin-0.sock")]
    serve = FakePlugin.serve

    def flaky_serve(plugin: FakePlugin) -> None:
        if failures:
            raise failures.pop()
        serve(plugin)

    FakePlugin.serve = flaky_serve  # type: ignore[method-assign]
    try:
        rig.inventory("rbln0")
        pause = rig.worker.step()
        assert pause is not None and pause > 0 and not rig.worker.serving
        assert rig.plugins[0].stopped, "the half-made instance is stopped"
        assert ("ERROR", "Cannot serve the device plugin; retrying") in logged
        assert rig.worker.step() == pytest.approx(pause), "not before the pause is over"
        rig.now += pause
        assert rig.worker.step() == IDLE_CHECK_SECONDS
        assert rig.worker.serving and len(rig.plugin.registrations) == 1
    finally:
        FakePlugin.serve = serve  # type: ignore[method-assign]
