"""The status parser, the status reader and the health policy, sentence by sentence of the spec's
"Device status and allocation safety" (the worker-side history is in test_device_table.py)."""

import contextlib
import errno
import os

import pytest

from shared.channels import inventory_protocol
from shared.node.device_health import Health, HealthHistory, judge
from shared.node.driver_status import (
    MAX_STATUS_BYTES,
    UNREADABLE,
    StatusReading,
    parse_status,
    read_status,
    status_path,
)
from tests.support.inventory import message, record

HEALTHY, UNHEALTHY = Health.HEALTHY, Health.UNHEALTHY
READY, BUSY, FAULT = StatusReading(0), StatusReading(1), StatusReading(4)


# READY (0) is Healthy; 1-5 and unknown numbers are Unhealthy, named by their kernel lifecycle name;
# malformed values are UNREADABLE, which alone (no unresolved fault) is the compatibility default, Healthy.
@pytest.mark.parametrize("raw,name,health_without_history", [
    (b"0\n", "READY", HEALTHY),
    (b"1\n", "BUSY", UNHEALTHY),
    (b"2\n", "PROBING", UNHEALTHY),
    (b"3\n", "INIT", UNHEALTHY),
    (b"4\n", "FAULT", UNHEALTHY),
    (b"5\n", "FINISH", UNHEALTHY),
    (b"6", "UNKNOWN(6)", UNHEALTHY),
    (b"9", "UNKNOWN(9)", UNHEALTHY),
    (b"-1", "UNKNOWN(-1)", UNHEALTHY),
    (b"9223372036854775807", "UNKNOWN(9223372036854775807)", UNHEALTHY),
    (b"-9223372036854775808", "UNKNOWN(-9223372036854775808)", UNHEALTHY),
    # whitespace is trimmed, leading zeros and a sign are still a number
    (b"  0  \n", "READY", HEALTHY),
    (b"\t4\r\n", "FAULT", UNHEALTHY),
    (b"\x0b1\x0c", "BUSY", UNHEALTHY),
    (b"004", "FAULT", UNHEALTHY),
    (b"+0", "READY", HEALTHY),
    # empty, not a number, binary junk, beyond int64, too long to be a status
    (b"", "UNREADABLE", HEALTHY),
    (b" \n", "UNREADABLE", HEALTHY),
    (b"n/a", "UNREADABLE", HEALTHY),
    (b"READY", "UNREADABLE", HEALTHY),
    (b"\x00\xff\x10", "UNREADABLE", HEALTHY),
    (b"4\x00", "UNREADABLE", HEALTHY),
    (b"1 2", "UNREADABLE", HEALTHY),
    (b"--5", "UNREADABLE", HEALTHY),
    (b"0x1", "UNREADABLE", HEALTHY),
    (b"1.0", "UNREADABLE", HEALTHY),
    (b"1_0", "UNREADABLE", HEALTHY),
    ("٣".encode(), "UNREADABLE", HEALTHY),  # a digit, but not an ASCII one
    (b"9223372036854775808", "UNREADABLE", HEALTHY),
    (b"-9223372036854775809", "UNREADABLE", HEALTHY),
    (b"4" + b" " * MAX_STATUS_BYTES, "UNREADABLE", HEALTHY),
    (b"9" * 5000, "UNREADABLE", HEALTHY),
])
def test_parser_names_and_policy_without_history(raw, name, health_without_history):
    reading = parse_status(raw)
    assert reading.name == name
    assert judge(None, reading, 1).health is health_without_history


@pytest.mark.parametrize("raw", [b"-9223372036854775808", b"9223372036854775807", b"-9999999999999999999",
                                 b"4", b"junk"])
def test_every_parsed_status_travels_in_the_inventory_message(raw):
    # A code outside int64 used to reach msgpack and crash the scanner's publish.
    original = message(devices=(record(status=parse_status(raw)),))
    assert inventory_protocol.decode(inventory_protocol.encode(original)) == original


def _missing(path, stack, monkeypatch):
    pass


def _directory(path, stack, monkeypatch):
    path.mkdir(parents=True)  # read() fails with EISDIR


def _fifo_without_writer(path, stack, monkeypatch):
    path.parent.mkdir(parents=True)
    os.mkfifo(path)  # reads end at once with nothing


def _fifo_with_idle_writer(path, stack, monkeypatch):
    _fifo_without_writer(path, stack, monkeypatch)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    stack.callback(os.close, reader)
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    stack.callback(os.close, writer)  # read() would block: EAGAIN, never a hang


def _permission_denied(path, stack, monkeypatch):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"0\n")
    # The tests may run as root, which reads through any file mode: refuse the open itself.
    real_open = os.open

    def refusing_open(file, flags, *args, **kwargs):
        if os.fspath(file) == os.fspath(path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
        return real_open(file, flags, *args, **kwargs)
    monkeypatch.setattr(os, "open", refusing_open)


def _huge(path, stack, monkeypatch):
    path.parent.mkdir(parents=True)
    path.write_bytes(b"0" * 10_000_000)


@pytest.mark.parametrize("make", [_missing, _directory, _fifo_without_writer, _fifo_with_idle_writer,
                                  _permission_denied, _huge])
def test_missing_files_and_read_errors_are_unreadable(tmp_path, monkeypatch, make):
    with contextlib.ExitStack() as stack:
        make(status_path(tmp_path, "rbln0"), stack, monkeypatch)
        assert read_status(tmp_path, "rbln0") == UNREADABLE


def test_the_reader_reads_the_drivers_status_file(tmp_path):
    path = tmp_path / "class" / "rebellions" / "rbln3" / "status"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"4\n")
    assert read_status(tmp_path, "rbln3").name == "FAULT"
    path.write_bytes(b"0\n")
    assert read_status(tmp_path, "rbln3").name == "READY"


U = UNREADABLE


# Observed Unhealthy: unreadable keeps it Unhealthy until a READY is actually read. Without an
# unresolved Unhealthy observation an unreadable status is Healthy (drivers and VFs without the file).
@pytest.mark.parametrize("readings,healths", [
    ([FAULT, U, U, READY, U], [UNHEALTHY, UNHEALTHY, UNHEALTHY, HEALTHY, HEALTHY]),
    ([U, U, U], [HEALTHY, HEALTHY, HEALTHY]),
    ([READY, U], [HEALTHY, HEALTHY]),
    ([U, BUSY, U, READY], [HEALTHY, UNHEALTHY, UNHEALTHY, HEALTHY]),
    ([FAULT, BUSY, U, StatusReading(9), U], [UNHEALTHY] * 5),
    ([StatusReading(2), U], [UNHEALTHY, UNHEALTHY]),
    ([StatusReading(3), U], [UNHEALTHY, UNHEALTHY]),
    ([StatusReading(5), U], [UNHEALTHY, UNHEALTHY]),
    ([StatusReading(-1), U], [UNHEALTHY, UNHEALTHY]),
    ([FAULT, READY, FAULT, U, READY], [UNHEALTHY, HEALTHY, UNHEALTHY, UNHEALTHY, HEALTHY]),
])
def test_history_keeps_an_unresolved_fault_until_ready_is_read(readings, healths):
    history = HealthHistory()
    concluded = [history.observe("rbln0", reading, at) for at, reading in enumerate(readings, start=1)]
    assert [c.health for c in concluded] == healths
    # Logs and errors report what was read last, unreadable included.
    assert [c.status for c in concluded] == readings


def test_the_verdict_names_the_reading_it_rests_on():
    history = HealthHistory()
    history.observe("rbln0", FAULT, 1)
    kept = history.observe("rbln0", UNREADABLE, 2)
    assert (kept.health, kept.status, kept.decided_by) == (UNHEALTHY, UNREADABLE, FAULT)
    assert history.observe("rbln1", UNREADABLE, 1).decided_by == UNREADABLE


def test_an_observation_no_newer_than_the_last_applied_one_changes_nothing():
    history = HealthHistory()
    history.observe("rbln0", READY, 200)  # Allocate read READY at t=200
    for stale_at in (100, 200):  # a scan read at t<=200 arrives later
        kept = history.observe("rbln0", FAULT, stale_at)
        assert (kept.health, kept.status, kept.observed_at_ns) == (HEALTHY, READY, 200)
    assert history.observe("rbln0", FAULT, 201).health is UNHEALTHY


def test_history_is_per_device_id_and_a_reused_id_inherits_it_until_cleared():
    history = HealthHistory()
    history.observe("rbln3", FAULT, 1)
    assert history.observe("rbln2", UNREADABLE, 2).health is HEALTHY
    # rbln3 vanishes (nothing observed for it) and comes back without a status file
    assert history.observe("rbln3", UNREADABLE, 10).health is UNHEALTHY
    history.clear()  # a new resource plugin instance
    assert history.observe("rbln3", UNREADABLE, 11).health is HEALTHY
    assert history.observe("rbln3", BUSY, 12).health is UNHEALTHY
