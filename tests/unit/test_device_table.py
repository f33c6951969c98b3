"""The worker's device table: one health history fed by scans and by Allocate's final check, what it
publishes to ListAndWatch, what it logs, and how long its history lives."""

import random
import threading

import pytest

from resource_worker.allocation import AllocationError, Allocator, ErrorKind
from resource_worker.device_table import DeviceTable
from shared.node.driver_status import UNREADABLE, StatusReading
from shared.node.rbln_smi import RblnSmi
from shared.node.rsd_group import RsdGroups
from shared.resources import Resource
from tests.support.inventory import message, record

READY, BUSY, FAULT = StatusReading(0), StatusReading(1), StatusReading(4)
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


class Clock:
    """The shared monotonic clock, advanced by hand."""

    def __init__(self, now: int = 1000):
        self.now = now

    def __call__(self) -> int:
        return self.now


class Scans:
    """Scanner snapshots for one table, numbered in order."""

    def __init__(self, table: DeviceTable):
        self._table = table
        self._seq = 0

    def apply(self, at: int, **statuses: StatusReading) -> None:
        self._seq += 1
        devices = tuple(record(device_id, npu=int(device_id[4:]), bus_id=f"0000:{3 + int(device_id[4:]):02x}:00.0",
                               status=status, observed_at_ns=at)
                        for device_id, status in statuses.items())
        self._table.apply(message(devices=devices, seq=self._seq))


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def table(clock):
    return DeviceTable(Resource.NPU, clock=clock)


@pytest.fixture
def scans(table):
    return Scans(table)


def found(logs, msg, **fields):
    return [r for r in logs if r["msg"] == msg and all(r.get(k) == v for k, v in fields.items())]


def health(table):
    return {a.device_id: (a.health.health.value, a.health.status.name) for a in table.devices()}


def reader(**statuses: StatusReading):
    """A status reader for Allocate's check that counts its reads."""
    reads = []

    def read(device_id: str) -> StatusReading:
        reads.append(device_id)
        return statuses[device_id]
    read.reads = reads
    return read


# -- ordering -----------------------------------------------------------------------------------

def test_an_older_scan_delivered_after_an_allocate_read_changes_nothing(table, scans, clock):
    scans.apply(100, rbln0=READY, rbln1=FAULT)
    clock.now = 300
    table.check_status(["rbln0", "rbln1"], reader(rbln0=FAULT, rbln1=READY))
    scans.apply(200, rbln0=READY, rbln1=FAULT)  # read at t=200, delivered after the Allocate read at t=300
    assert health(table) == {"rbln0": (UNHEALTHY, "FAULT"), "rbln1": (HEALTHY, "READY")}
    scans.apply(300, rbln0=READY, rbln1=FAULT)  # a tie is not newer either
    assert health(table) == {"rbln0": (UNHEALTHY, "FAULT"), "rbln1": (HEALTHY, "READY")}
    scans.apply(400, rbln0=READY, rbln1=FAULT)
    assert health(table) == {"rbln0": (HEALTHY, "READY"), "rbln1": (UNHEALTHY, "FAULT")}


def test_allocate_stamps_each_observation_after_reading_it():
    # The scanner stamps before its read; Allocate after: a scan that read earlier is always older.
    events = []

    def read(device_id):
        events.append(("read", device_id))
        return READY

    def clock():
        events.append(("clock",))
        return 500
    table = DeviceTable(Resource.NPU, clock=clock)
    table.check_status(["rbln0", "rbln1"], read)
    assert events == [("read", "rbln0"), ("clock",), ("read", "rbln1"), ("clock",)]


def test_a_scan_arriving_during_an_allocate_read_waits_for_it(table, scans, clock):
    scans.apply(100, rbln0=READY)
    reading, release = threading.Event(), threading.Event()

    def slow_read(device_id):
        reading.set()
        release.wait(10)
        return FAULT
    clock.now = 300
    check = threading.Thread(target=table.check_status, args=(["rbln0"], slow_read))
    check.start()
    assert reading.wait(10)
    applied = threading.Event()
    scan = threading.Thread(target=lambda: (scans.apply(200, rbln0=READY), applied.set()))
    scan.start()
    assert not applied.wait(0.2)  # held back by the lock while the status is being read
    release.set()
    check.join(10)
    scan.join(10)
    assert health(table) == {"rbln0": (UNHEALTHY, "FAULT")}


# -- publication and logging ----------------------------------------------------------------------

def test_the_scan_after_an_allocate_observation_publishes_and_logs_it(table, scans, clock, logs):
    scans.apply(100, rbln0=READY, rbln1=READY)
    generation, _ = table.snapshot()
    clock.now = 300
    table.check_status(["rbln1"], reader(rbln1=FAULT))
    assert table.snapshot()[0] == generation and health(table)["rbln1"] == (HEALTHY, "READY")
    assert logs == []  # Allocate neither publishes nor logs
    scans.apply(200, rbln0=READY, rbln1=READY)  # the next snapshot, even one read before the Allocate check
    assert table.wait_for_change(generation, timeout=0)
    assert health(table)["rbln1"] == (UNHEALTHY, "FAULT")
    (changed,) = found(logs, "Device state changed")
    expected = {"level": "WARNING", "resourceName": Resource.NPU.value, "device": "rbln1", "health": UNHEALTHY,
                "status": "FAULT", "previousHealth": HEALTHY, "previousStatus": "READY", "deviceCount": 2,
                "healthyCount": 1, "unhealthyCount": 1}
    assert {key: changed.get(key) for key in expected} == expected


def test_first_snapshot_is_not_logged_later_changes_are(table, scans, logs):
    scans.apply(100, rbln0=READY, rbln1=FAULT)
    assert logs == []  # announced by `Device exposed` when the plugin registers
    scans.apply(200, rbln0=READY, rbln1=FAULT)
    assert logs == []  # a steady node logs nothing
    scans.apply(300, rbln0=BUSY, rbln2=READY, rbln3=StatusReading(9))
    counts = {"deviceCount": 3, "healthyCount": 1, "unhealthyCount": 2}
    assert found(logs, "Device appeared in inventory", device="rbln2", level="INFO", health=HEALTHY,
                 status="READY", **counts)
    # A device first seen already faulted is reported at warn.
    assert found(logs, "Device appeared in inventory", device="rbln3", level="WARNING", health=UNHEALTHY,
                 status="UNKNOWN(9)", **counts)
    assert found(logs, "Device disappeared from inventory", device="rbln1", level="WARNING", **counts)
    assert found(logs, "Device state changed", device="rbln0", level="WARNING", health=UNHEALTHY, status="BUSY",
                 previousHealth=HEALTHY, previousStatus="READY", **counts)
    assert len(logs) == 4


def test_a_status_change_within_the_same_health_is_logged_but_not_published(table, scans, logs):
    scans.apply(100, rbln0=FAULT)
    generation, _ = table.snapshot()
    scans.apply(200, rbln0=UNREADABLE)
    assert table.snapshot()[0] == generation
    assert found(logs, "Device state changed", level="WARNING", health=UNHEALTHY, status="UNREADABLE",
                 previousHealth=UNHEALTHY, previousStatus="FAULT")
    scans.apply(300, rbln0=READY)
    assert table.snapshot()[0] != generation
    assert found(logs, "Device state changed", level="INFO", health=HEALTHY, status="READY",
                 previousHealth=UNHEALTHY, previousStatus="UNREADABLE")


def _changes(logs, device):
    return [(r["previousHealth"], r["previousStatus"], r["health"], r["status"], r["level"])
            for r in found(logs, "Device state changed", device=device)]


def test_a_verdict_decided_by_allocate_is_logged_with_the_reading_that_decided_it(table, scans, clock, logs):
    scans.apply(100, rbln0=FAULT, rbln1=READY)
    clock.now = 300
    table.check_status(["rbln0", "rbln1"], reader(rbln0=READY, rbln1=FAULT))
    scans.apply(400, rbln0=UNREADABLE, rbln1=UNREADABLE)  # both status files vanished after the check
    assert health(table) == {"rbln0": (HEALTHY, "UNREADABLE"), "rbln1": (UNHEALTHY, "UNREADABLE")}
    # The recovery shows READY, the fault FAULT; the unreadable read follows as its own change.
    assert _changes(logs, "rbln0") == [(UNHEALTHY, "FAULT", HEALTHY, "READY", "INFO"),
                                       (HEALTHY, "READY", HEALTHY, "UNREADABLE", "INFO")]
    assert _changes(logs, "rbln1") == [(HEALTHY, "READY", UNHEALTHY, "FAULT", "WARNING"),
                                       (UNHEALTHY, "FAULT", UNHEALTHY, "UNREADABLE", "WARNING")]


def test_unreadable_is_never_logged_as_a_recovery(table, scans, clock, logs):
    rng = random.Random(3)
    statuses = [READY, READY, BUSY, FAULT, StatusReading(9), UNREADABLE, UNREADABLE]
    ids = ["rbln0", "rbln1", "rbln2"]
    for step in range(3000):
        clock.now = 10 * step + 5
        action = rng.random()
        if action < 0.3:
            wanted = rng.sample(ids, rng.randint(1, 3))
            table.check_status(wanted, reader(**{d: rng.choice(statuses) for d in wanted}))
        elif action < 0.33:
            table.forget_history()
        else:
            present = [d for d in ids if rng.random() < 0.9]
            # Scans arrive late now and then: older than the last Allocate read.
            scans.apply(10 * step - rng.choice([0, 0, 0, 20]), **{d: rng.choice(statuses) for d in present})
    changes = found(logs, "Device state changed")
    recoveries = [r for r in changes if r["previousHealth"] == UNHEALTHY and r["health"] == HEALTHY]
    assert len(recoveries) > 50 and {r["status"] for r in recoveries} == {"READY"}
    assert all(r["level"] == ("INFO" if r["health"] == HEALTHY else "WARNING")
               for r in logs if "health" in r)


# -- lifecycle --------------------------------------------------------------------------------------

def test_history_survives_disappearance_and_a_reused_id_inherits_it_until_ready(table, scans, logs):
    scans.apply(100, rbln0=FAULT, rbln1=READY)
    scans.apply(200, rbln1=READY)
    scans.apply(300, rbln0=UNREADABLE, rbln1=READY)  # back, without a status file
    assert health(table)["rbln0"] == (UNHEALTHY, "UNREADABLE")
    assert found(logs, "Device appeared in inventory", device="rbln0", level="WARNING", health=UNHEALTHY,
                 status="UNREADABLE")
    # The ID is reused by another device (another PCI address): it inherits the history until READY.
    reused = record("rbln0", npu=7, bus_id="0000:99:00.0", status=UNREADABLE, observed_at_ns=400)
    table.apply(message(devices=(reused,), seq=10))
    assert health(table)["rbln0"] == (UNHEALTHY, "UNREADABLE")
    scans.apply(500, rbln0=READY)
    scans.apply(600, rbln0=UNREADABLE)
    assert health(table)["rbln0"] == (HEALTHY, "UNREADABLE")


def test_a_new_resource_plugin_instance_starts_with_an_empty_history(clock, scans, table):
    scans.apply(100, rbln0=FAULT)
    scans.apply(200)  # the resource is absent: the worker stops serving it
    table.forget_history()
    scans.apply(300, rbln0=UNREADABLE)
    assert health(table) == {"rbln0": (HEALTHY, "UNREADABLE")}  # the compatibility default again
    scans.apply(400, rbln0=BUSY)
    assert health(table) == {"rbln0": (UNHEALTHY, "BUSY")}
    restarted = DeviceTable(Resource.NPU, clock=clock)  # a new worker process
    Scans(restarted).apply(500, rbln0=UNREADABLE)
    assert health(restarted) == {"rbln0": (HEALTHY, "UNREADABLE")}


def test_devices_back_before_the_history_is_forgotten_are_judged_afresh(table, scans, logs):
    scans.apply(100, rbln0=FAULT)
    scans.apply(200)
    scans.apply(300, rbln0=UNREADABLE)  # back while the old instance was still stopping
    assert health(table) == {"rbln0": (UNHEALTHY, "UNREADABLE")}
    generation, _ = table.snapshot()
    table.forget_history()
    assert health(table) == {"rbln0": (HEALTHY, "UNREADABLE")}
    assert table.snapshot()[0] != generation
    del logs[:]
    scans.apply(400, rbln0=UNREADABLE)
    assert logs == []  # nothing rested on the dropped history, so nothing "recovers"


# -- Allocate's final check -------------------------------------------------------------------------

@pytest.fixture
def allocator(table, tmp_path):
    """An Allocator over `table` whose status reads return `statuses` and are counted."""
    def make(**statuses):
        read = reader(**statuses)
        return Allocator(table, RsdGroups(RblnSmi(tmp_path / "no-rbln-smi"), tmp_path / "rsd.lock"), tmp_path,
                         read), read
    return make


def test_allocate_reads_each_distinct_requested_device_once(scans, allocator):
    scans.apply(100, rbln0=READY, rbln1=READY, rbln2=READY)
    checker, read = allocator(rbln0=READY, rbln1=READY, rbln2=READY)
    containers = checker.validate([["rbln1", "rbln0", "rbln1"], ["rbln0", "rbln1"]])
    assert sorted(read.reads) == ["rbln0", "rbln1"]  # once each; rbln2 was not requested, so not read
    assert [[d.device_id for d in devices] for devices in containers] == [["rbln1", "rbln0"], ["rbln0", "rbln1"]]


def test_allocate_rejects_every_device_unhealthy_now_and_names_its_status(scans, clock, allocator):
    scans.apply(100, rbln0=READY, rbln1=READY, rbln2=FAULT)
    clock.now = 300
    checker, read = allocator(rbln0=READY, rbln1=FAULT, rbln2=UNREADABLE)
    with pytest.raises(AllocationError) as rejected:
        checker.validate([["rbln0", "rbln1"], ["rbln1", "rbln0"], ["rbln2"]])
    assert rejected.value.kind is ErrorKind.UNHEALTHY_DEVICE
    assert rejected.value.device_ids == ["rbln1", "rbln2"]
    message_text = str(rejected.value)
    assert "rbln1 is Unhealthy (FAULT)" in message_text and "rbln2 is Unhealthy (UNREADABLE)" in message_text
    assert "rbln0" not in message_text
    assert sorted(read.reads) == ["rbln0", "rbln1", "rbln2"]


def test_allocate_accepts_a_device_that_recovered_since_the_last_scan(scans, clock, allocator):
    scans.apply(100, rbln0=FAULT)
    clock.now = 300
    checker, _ = allocator(rbln0=READY)
    (devices,) = checker.validate([["rbln0"]])
    assert [d.device_id for d in devices] == ["rbln0"]


def test_allocate_reads_nothing_for_a_request_naming_an_unknown_device(scans, allocator):
    scans.apply(100, rbln0=READY)
    checker, read = allocator(rbln0=READY)
    with pytest.raises(AllocationError) as rejected:
        checker.validate([["rbln0", "rbln9"]])
    assert rejected.value.kind is ErrorKind.UNKNOWN_DEVICE and read.reads == []
