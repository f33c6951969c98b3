import json
import os
import pathlib
import time

import pytest

from shared.node.rbln_smi import (
    GROUP_COMMANDS,
    RblnSmi,
    RblnSmiError,
    SmiCommand,
    SmiUsage,
    locate,
    parse_listing,
    run_bounded,
)


def tool(tmp_path: pathlib.Path, body: str) -> pathlib.Path:
    path = tmp_path / "rbln-smi"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


LISTING = {"KMD_version": "1.2.3", "devices": [
    {"npu": 0, "name": "RBLN-CA25", "device": "rbln0", "sid": "s0", "uuid": "u", "group_id": "0",
     "status": "normal", "pci": {"bus_id": "0000:03:00.0", "numa_node": "1"}, "extra": [1, 2]},
    {"npu": "5", "name": "RBLN-CA25", "device": "rbln0-1", "sid": "s0", "group_id": 3,
     "pci": {"bus_id": "0000:03:00.1", "numa_node": -1}},
    {"npu": 1, "device": "rbln1"},
    {"npu": True, "device": "rbln2", "pci": {"bus_id": "0000:05:00.0"}},
    "not an object",
]}


def test_listing_accepts_int_and_string_fields_and_reports_unusable_entries():
    listing = parse_listing(json.dumps(LISTING).encode())
    assert [(d.device, d.npu, d.group_id, d.numa_node) for d in listing.devices] == [
        ("rbln0", 0, 0, "1"), ("rbln0-1", "5", 3, "-1")]
    assert len(listing.rejected) == 3
    assert any("rbln1" in r and "bus_id" in r for r in listing.rejected)
    assert any("rbln2" in r and "npu" in r for r in listing.rejected)


@pytest.mark.parametrize("output,fragment", [
    (b"garbage", "invalid JSON"), (b'{"devices": [', "invalid JSON"), (b'{"devices": 3}', "no 'devices' list"),
    (b"[]", "no 'devices' list"),
])
def test_unusable_output_is_an_error(output, fragment):
    with pytest.raises(RblnSmiError, match=fragment):
        parse_listing(output)


def test_a_hung_tool_is_killed_at_its_timeout(tmp_path):
    started = time.monotonic()
    with pytest.raises(RblnSmiError, match="timed out"):
        run_bounded([str(tool(tmp_path, "sleep 30"))], timeout=0.3)
    assert time.monotonic() - started < 5


def test_the_tool_gets_only_a_minimal_environment(tmp_path):
    stack_environment = {"PATH": "/opt/driver/bin:/usr/bin:/bin", "LANG": "ko_KR.UTF-8", "TMPDIR": str(tmp_path),
                         "SUPERVISOR_SERVER_URL": "unix:///run/rbln-device-plugin/supervisor.sock",
                         "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer token", "RBLN_SMI": "/x/rbln-smi"}
    result = run_bounded(["/usr/bin/env"], timeout=10, environ=stack_environment)
    assert sorted(result.output.decode().splitlines()) == [
        "LANG=ko_KR.UTF-8", "PATH=/opt/driver/bin:/usr/bin:/bin", f"TMPDIR={tmp_path}"]
    bare = run_bounded(["/usr/bin/env"], timeout=10, environ={"HOME": "/root"})
    assert sorted(bare.output.decode().splitlines()) == [
        "LANG=C.UTF-8", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


def test_a_babbling_tool_is_cut_off(tmp_path):
    with pytest.raises(RblnSmiError, match="more than"):
        run_bounded([str(tool(tmp_path, "yes"))], timeout=10)


def test_non_zero_exit_names_the_command_and_output(tmp_path):
    smi = RblnSmi(tool(tmp_path, "echo 'driver not loaded' >&2; exit 3"))
    with pytest.raises(RblnSmiError) as caught:
        smi.inventory()
    assert "-j" in str(caught.value) and "status 3" in str(caught.value) and "driver not loaded" in str(caught.value)


def test_a_counted_tool_adds_every_call_to_its_usage_failed_and_timed_out_ones_too(tmp_path):
    flag = tmp_path / "fail"
    smi = RblnSmi(tool(tmp_path, f'[ -e {flag} ] && sleep 5; echo \'{{"devices": []}}\''), list_timeout=0.3)
    usage = SmiUsage()
    counted = smi.counted(usage)
    counted.groups()
    smi.groups()  # the tool it was counted from stays uncounted
    assert usage.calls == 1 and 0 < usage.seconds < 0.3
    flag.touch()
    with pytest.raises(RblnSmiError, match="timed out"):
        counted.groups()
    assert usage.calls == 2 and usage.seconds >= 0.3


def test_commands_are_built_as_the_contract_says(tmp_path):
    record = tmp_path / "argv"
    smi = RblnSmi(tool(tmp_path, f'echo "$@" >> {record}; echo \'{{"devices": []}}\''))
    smi.inventory()
    smi.groups()
    smi.destroy_groups([3, 4])
    smi.create_group(5, [0, "7"])
    assert record.read_text().splitlines() == ["-j", "-g -j", "group -d 3,4", "group -c 5 -a 0,7"]


def test_locate_prefers_the_configured_binary_and_rejects_a_non_executable(tmp_path):
    binary = tool(tmp_path, "true")
    assert locate(binary) == binary
    binary.chmod(0o644)
    if os.geteuid() != 0:
        with pytest.raises(RblnSmiError, match="not an executable"):
            locate(binary)
    with pytest.raises(RblnSmiError, match="not an executable"):
        locate(tmp_path / "absent")


def test_locate_falls_back_to_path(tmp_path, monkeypatch):
    monkeypatch.setattr("shared.node.rbln_smi.SEARCH_PATHS", ())
    binary = tool(tmp_path, "true")
    assert locate(None, search_path=str(tmp_path)) == binary
    with pytest.raises(RblnSmiError, match="not found"):
        locate(None, search_path=str(tmp_path / "nowhere"))


def test_every_call_is_observed_by_command_with_its_time_and_outcome(tmp_path):
    """What the rbln-smi metrics are made of: each of the four commands, a failure, a timeout, a missing tool."""
    flag = tmp_path / "slow"
    seen = []
    smi = RblnSmi(tool(tmp_path, f'[ -e {flag} ] && sleep 5; [ "$1" = group ] && [ "$2" = -d ] && exit 1; '
                                 f'echo \'{{"devices": []}}\''), list_timeout=0.3,
                  observe=lambda command, seconds, ok: seen.append((command, seconds, ok)))
    smi.inventory()
    smi.counted(SmiUsage()).groups()  # a counted copy reports to the same observer
    with pytest.raises(RblnSmiError):
        smi.destroy_groups([2])
    smi.create_group(3, [0])
    flag.touch()
    with pytest.raises(RblnSmiError, match="timed out"):
        smi.inventory()
    assert [(command, ok) for command, _, ok in seen] == [
        (SmiCommand.LIST.value, True), (SmiCommand.GROUP_LIST.value, True), (SmiCommand.GROUP_DESTROY.value, False),
        (SmiCommand.GROUP_CREATE.value, True), (SmiCommand.LIST.value, False)]
    assert all(0 < seconds < 0.3 for _, seconds, _ in seen[:-1]) and seen[-1][1] >= 0.3
    seen.clear()
    with pytest.raises(RblnSmiError, match="not an executable"):
        RblnSmi(tmp_path / "absent", observe=lambda *call: seen.append(call)).groups()
    assert [(command, ok) for command, _, ok in seen] == [(SmiCommand.GROUP_LIST.value, False)]
    assert {command.value for command in GROUP_COMMANDS} == {"group-list", "group-destroy", "group-create"}
