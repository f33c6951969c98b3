import os

import pytest

from resource_worker.health import Health, HealthHistory, judge
from shared.status import UNREADABLE, StatusReading, parse_status, read_status, status_path


@pytest.mark.parametrize("raw,name,healthy_alone", [
    (b"0\n", "READY", True), (b"1", "BUSY", False), (b"2", "PROBING", False), (b"3", "INIT", False),
    (b"4", "FAULT", False), (b"5", "FINISH", False), (b"9", "UNKNOWN(9)", False),
    (b"-1", "UNKNOWN(-1)", False), (b"  0  \n", "READY", True), (b"+0", "READY", True),
    (b"", "UNREADABLE", True), (b"n/a", "UNREADABLE", True), (b"\x00\xff\x10", "UNREADABLE", True),
    (b"1 2", "UNREADABLE", True), (b"--5", "UNREADABLE", True), (b"0x1", "UNREADABLE", True),
    ("٣".encode(), "UNREADABLE", True), (b"9" * 30, "UNREADABLE", True),
])
def test_status_parser_and_policy_without_history(raw, name, healthy_alone):
    reading = parse_status(raw)
    assert reading.name == name
    assert (judge(None, reading, 1).health is Health.HEALTHY) is healthy_alone


def _write(tmp_path, device, data):
    path = status_path(tmp_path, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_reader_handles_every_broken_file(tmp_path):
    _write(tmp_path, "rbln0", b"4\n")
    assert read_status(tmp_path, "rbln0").name == "FAULT"
    assert read_status(tmp_path, "missing") == UNREADABLE
    _write(tmp_path, "huge", b"0" * 1_000_000)
    assert read_status(tmp_path, "huge").name == "UNREADABLE"
    status_path(tmp_path, "dir").mkdir(parents=True)
    assert read_status(tmp_path, "dir").name == "UNREADABLE"
    path = _write(tmp_path, "locked", b"0")
    os.chmod(path, 0)
    if os.geteuid() != 0:  # root reads through any mode
        assert read_status(tmp_path, "locked").name == "UNREADABLE"


FAULT = StatusReading(4)
READY = StatusReading(0)


def test_unreadable_keeps_an_unresolved_fault_until_ready():
    history = HealthHistory()
    assert history.observe("rbln0", FAULT, 1).health is Health.UNHEALTHY
    assert history.observe("rbln0", UNREADABLE, 2).health is Health.UNHEALTHY
    assert history.observe("rbln0", UNREADABLE, 3).status.name == "UNREADABLE"
    assert history.observe("rbln0", READY, 4).health is Health.HEALTHY
    assert history.observe("rbln0", UNREADABLE, 5).health is Health.HEALTHY


def test_any_numeric_non_ready_status_is_unhealthy_and_busy_too():
    history = HealthHistory()
    for code in (1, 2, 3, 4, 5, 42):
        assert history.observe(f"d{code}", StatusReading(code), 1).health is Health.UNHEALTHY


def test_older_observation_never_overrides_a_newer_one():
    history = HealthHistory()
    history.observe("rbln0", READY, 200)  # Allocate read READY at t=200
    stale = history.observe("rbln0", FAULT, 100)  # scan snapshot read at t=100 arrives later
    assert stale.health is Health.HEALTHY and stale.observed_at_ns == 200


def test_history_survives_disappearance_and_is_inherited_by_a_reused_id():
    history = HealthHistory()
    history.observe("rbln3", FAULT, 1)
    # rbln3 vanishes from inventory (nothing observed), then comes back without a status file
    assert history.observe("rbln3", UNREADABLE, 10).health is Health.UNHEALTHY
    history.clear()  # a new resource plugin instance
    assert history.observe("rbln3", UNREADABLE, 11).health is Health.HEALTHY
