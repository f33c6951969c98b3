"""Supervision of the real stack: kubelet restarts and outages, a process killed, a program that
cannot run, stop signals, the health service and `rbln-device-plugin status`."""

from __future__ import annotations

import json
import os
import signal
import stat
import time

import grpc
import pytest

from shared.observability.log import parse_timestamp
from shared.programs import PROGRAMS, SCANNER, WATCHDOG, WORKERS
from shared.resources import Resource
from shared.supervision.client import server_proxy
from simulator.kubelet import KubeletSimulator
from tests.support.ports import free_port, listening_ports
from tests.support.supervision import (
    DEVICES,
    NODE,
    NOT_SERVING,
    NPU,
    SERVING,
    VF1,
    VF4,
    await_health,
    await_restarted_plugins,
    await_serving,
    health,
    program_info,
    registrations,
    status_command,
)
from tests.support.waiting import wait_until

FAULTED = {NPU: "rbln0", VF1: "rbln1-0", VF4: "rbln2-3"}
# supervisor.conf: startretries=3 after 1, 2 and 3 s, startsecs=2; a program failing that long is FATAL.
RETRY_WINDOW = 1 + 2 + 3 + 2
ENDED = "Kubelet ended the device list stream; registering again"


def sockets(directory) -> set[str]:
    return {entry.name for entry in directory.iterdir() if stat.S_ISSOCK(entry.lstat().st_mode)}


def test_five_kubelet_restarts_in_a_row_and_a_stream_the_kubelet_ends(make_node, kubelet, start_stack):
    node = make_node(NODE)
    stack = start_stack(node)
    await_serving(kubelet)
    pids = {name: info["pid"] for name, info in program_info(node).items()}
    for round_ in range(5):
        before = registrations(kubelet)
        kubelet.restart()
        await_restarted_plugins(stack, restarts=round_ + 1)
        await_serving(kubelet, since=before)
    detected = stack.find("Detected kubelet socket recreation; restarting device plugins")
    assert len(detected) == 5 and all(r["process"] == "watchdog" and r["level"] == "info" for r in detected)
    restarted = stack.find("Restarting device plugin for the new kubelet")
    assert sorted(r["resourceName"] for r in restarted) == sorted(5 * list(DEVICES))
    assert {r["level"] for r in restarted} == {"info"}
    # In place: every process is the one that started.
    assert {name: info["pid"] for name, info in program_info(node).items()} == pids
    assert all(len(stack.find("Starting rbln-device-plugin", process=worker)) == 1 for worker in WORKERS)
    # One registration per restart and resource: an old instance leaves the new kubelet to its successor.
    assert registrations(kubelet) == dict.fromkeys(kubelet.resources(), 6)
    assert not stack.find("No restart came after the kubelet restarted; registering with the new kubelet")
    # Each instance had its own socket; the kubelet removed the old ones, the new instances left none behind.
    assert sockets(node.plugin_dir) == {"kubelet.sock"} | {view.endpoint for view in kubelet.resources().values()}

    # The kubelet ends one stream: that worker registers again, the same instance on the same socket.
    before = registrations(kubelet)
    endpoint = kubelet.resources()[VF4].endpoint
    ended = len(stack.find(ENDED))  # old instances saw their streams end in the restarts too
    kubelet.end_stream(VF4)
    await_serving(kubelet, since={VF4: before[VF4]})
    assert registrations(kubelet) == {**before, VF4: before[VF4] + 1}
    assert kubelet.resources()[VF4].endpoint == endpoint
    record = stack.wait_for_record(ENDED, count=ended + 1)[-1]
    assert record["resourceName"] == VF4 and record["level"] == "warn"

    # HEALTHCHECK_PORT=-1 (the node's default here): no health service, nothing listening.
    assert not stack.find("Health service listening")
    assert listening_ports(program_info(node)["watchdog"]["pid"]) == set()


def test_a_removed_plugin_socket_is_served_anew_and_registered_by_that_worker_alone(make_node, kubelet, start_stack):
    node = make_node(NODE)
    stack = start_stack(node)
    await_serving(kubelet)
    before = registrations(kubelet)
    old = kubelet.resources()[VF1].endpoint
    (node.plugin_dir / old).unlink()  # by something other than the kubelet: nothing else tells the worker
    await_serving(kubelet, since={VF1: before[VF1]})
    (removed,) = stack.wait_for_record("Device plugin socket was removed; serving on a new one")
    assert (removed["resourceName"], removed["endpoint"], removed["level"]) == (VF1, old, "warn")
    assert kubelet.resources()[VF1].endpoint != old
    assert registrations(kubelet) == {**before, VF1: before[VF1] + 1}
    assert sockets(node.plugin_dir) == {"kubelet.sock"} | {view.endpoint for view in kubelet.resources().values()}


def test_a_kubelet_restart_while_a_worker_is_stopped_orders_the_others_and_the_stopped_one_starts_fresh(
        make_node, kubelet, start_stack):
    node = make_node(NODE)
    stack = start_stack(node)
    await_serving(kubelet)
    supervisor = server_proxy(node.run_dir).supervisor
    supervisor.stopProcess("worker-npu-vf1")  # no process: supervisord refuses to signal it
    before = registrations(kubelet)
    kubelet.restart()
    restarted = stack.wait_for_record("Restarting device plugin for the new kubelet", count=2)
    assert sorted(r["resourceName"] for r in restarted) == sorted([NPU, VF4])
    supervisor.startProcess("worker-npu-vf1", False)
    await_serving(kubelet, since=before)
    assert registrations(kubelet) == {resource: count + 1 for resource, count in before.items()}
    assert not stack.find("Restarting device plugins failed")
    assert len(stack.find("Starting rbln-device-plugin", process="worker-npu-vf1")) == 2


def test_without_the_watchdog_each_worker_registers_with_a_restarted_kubelet_itself(make_node, kubelet,
                                                                                    start_stack):
    node = make_node(NODE)
    stack = start_stack(node)
    await_serving(kubelet)
    server_proxy(node.run_dir).supervisor.stopProcess("watchdog")  # stopProcess returns once it is stopped
    before = registrations(kubelet)
    kubelet.restart()
    # Nobody restarts the workers: after their wait each registers the instance it has, once.
    await_serving(kubelet, since=before)
    waited = stack.wait_for_record("Kubelet restarted; waiting for the watchdog's order to restart the device plugin",
                                   count=len(DEVICES))
    gave_up = stack.wait_for_record("No restart came after the kubelet restarted; registering with the new kubelet",
                                    count=len(DEVICES))
    assert sorted(r["resourceName"] for r in waited) == sorted(r["resourceName"] for r in gave_up) == sorted(DEVICES)
    assert {r["level"] for r in gave_up} == {"warn"}
    assert registrations(kubelet) == {resource: count + 1 for resource, count in before.items()}
    assert all(len(stack.find("Starting rbln-device-plugin", process=worker)) == 1 for worker in WORKERS)
    assert not stack.find("Restarting device plugin for the new kubelet")
    assert {name: view.devices.keys() for name, view in kubelet.resources().items()} == DEVICES


def test_each_process_killed_in_turn_is_replaced_without_interrupting_the_others(make_node, kubelet, start_stack):
    node = make_node(NODE)
    stack = start_stack(node)
    await_serving(kubelet)
    for program in PROGRAMS:
        before = registrations(kubelet)
        victim = program_info(node)[program]["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda program=program, victim=victim: (info := program_info(node)[program])["statename"]
                   == "RUNNING" and info["pid"] != victim, 20, f"a new {program}")
        if program in WORKERS:
            resource = Resource.from_process_name(program).value
            await_serving(kubelet, since={resource: before[resource]})
            # The others' streams never broke: a broken stream only comes back through a new Register.
            assert registrations(kubelet) == {**before, resource: before[resource] + 1}
        else:
            await_serving(kubelet)
            assert registrations(kubelet) == before
        if program == "scanner":
            # The workers served their last inventory meanwhile (no stream broke); they follow the new scanner.
            for resource, device in FAULTED.items():
                node.set_status(device, 4)
                kubelet.wait_for_devices(resource, lambda view, device=device: view.connected
                                         and view.health.get(device) == "Unhealthy")
            assert registrations(kubelet) == before
    # Killed workers left their sockets; each new instance removed its resource's stale ones.
    assert sockets(node.plugin_dir) == {"kubelet.sock"} | {view.endpoint for view in kubelet.resources().values()}
    # The new watchdog watches the kubelet socket too.
    before = registrations(kubelet)
    kubelet.restart()
    await_restarted_plugins(stack, restarts=1)
    await_serving(kubelet, since=before)


def test_a_kubelet_absent_past_the_retry_window_then_appearing_and_the_health_service(make_node, start_stack):
    node = make_node(NODE)
    kubelet = KubeletSimulator(node.plugin_dir)  # not started: the kubelet is not there yet
    port = free_port()
    stack = start_stack(node, scan_interval="1s", HEALTHCHECK_PORT=str(port))
    env = {**os.environ, **node.env("1s"), "HEALTHCHECK_PORT": str(port)}
    try:
        stack.wait_for_record("Health service listening", port=port)
        # Every program runs: live. No resource is registered: not ready. Unknown names are not found.
        await_health(port, default=SERVING, liveness=SERVING, readiness=NOT_SERVING)
        assert health(port, "device-plugin") == grpc.StatusCode.NOT_FOUND
        for worker in WORKERS:
            waiting = stack.wait_for_record("Waiting for the kubelet socket", process=worker)
            assert waiting[0]["path"] == str(node.plugin_dir / "kubelet.sock")

        # Longer than supervisord would retry a failing program: every worker is still its first instance.
        started = program_info(node)
        wait_until(lambda: all(info["statename"] == "RUNNING" and info["now"] - info["start"] > RETRY_WINDOW
                               for name, info in program_info(node).items() if name in WORKERS),
                   RETRY_WINDOW + 10, "the workers to outlast the retry window")
        assert {name: info["pid"] for name, info in program_info(node).items()} == \
            {name: info["pid"] for name, info in started.items()}
        assert all(len(stack.find("Waiting for the kubelet socket", process=w)) == 1 for w in WORKERS)
        assert health(port, "readiness") == NOT_SERVING

        report = json.loads(status_command(env, "--json").stdout)
        assert {name: p["state"] for name, p in report["processes"].items()} == dict.fromkeys(PROGRAMS, "RUNNING")
        assert {name: (r["registered"], r["deviceCount"]) for name, r in report["resources"].items()} == \
            {NPU: (False, 1), VF1: (False, 1), VF4: (False, 4)}

        kubelet.start()
        await_serving(kubelet)
        await_health(port, default=SERVING, liveness=SERVING, readiness=SERVING)
        assert listening_ports(program_info(node)["watchdog"]["pid"]) == {port}

        text = status_command(env)
        assert text.returncode == 0
        rows = {line.split()[0]: line.split()[1:] for line in text.stdout.splitlines() if line.strip()}
        assert rows["worker-npu-vf4"][:2] == ["RUNNING", str(program_info(node)["worker-npu-vf4"]["pid"])]
        # resource: registered, streams, devices, healthy, unhealthy, last scan
        assert rows[VF4][:5] == ["yes", "1", "4", "4", "0"] and rows[VF4][5].endswith("s")
        report = json.loads(status_command(env, "--json").stdout)
        assert report["resources"][NPU] == {**report["resources"][NPU], "registered": True, "streams": 1,
                                            "deviceCount": 1, "healthyCount": 1, "unhealthyCount": 0}
        assert 0 <= report["resources"][NPU]["lastScanAgeSeconds"] < 3 * 1.0

        # A program that is not running: not live (and so not the default either).
        supervisor = server_proxy(node.run_dir).supervisor
        supervisor.stopProcess("worker-npu-vf1")
        await_health(port, default=NOT_SERVING, liveness=NOT_SERVING)
        assert json.loads(status_command(env, "--json").stdout)["processes"]["worker-npu-vf1"]["state"] == "STOPPED"
        supervisor.startProcess("worker-npu-vf1")
        await_health(port, default=SERVING, liveness=SERVING, readiness=SERVING)
    finally:
        stack.stop()
        kubelet.stop()
    assert status_command(env).returncode == 1  # nobody to ask


def supervisord_exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as process:
            return process.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_program_that_cannot_run_makes_supervisord_shut_the_stack_down(make_node, kubelet, start_stack):
    node = make_node("1")
    # Something holds the path of the scanner's publisher socket: every start of the scanner fails.
    (node.run_dir / "inventory-updates.ipc").mkdir()
    stack = start_stack(node)
    wait_until(lambda: supervisord_exited(stack.pid), RETRY_WINDOW + 30, "supervisord to exit")
    (fatal,) = stack.find("Program failed permanently; shutting the stack down")
    assert fatal["programs"] == ["scanner"] and fatal["level"] == "error"
    # No scan, so no worker: the watchdog is the one other program, and it stopped with the stack.
    assert stack.find(process=WATCHDOG)[-1]["msg"] == "Shutdown"
    assert not stack.find(process="worker-npu")
    # The start and 3 retries at least: on a loaded machine a start can take longer than startsecs to
    # fail, which supervisord counts as a run and answers with a fresh set of retries.
    assert len(stack.find("Starting rbln-device-plugin", process="scanner")) >= 4
    assert stack.stop() == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP],
                         ids=lambda signum: signum.name)
def test_a_stop_signal_to_supervisord_stops_the_whole_stack_cleanly(make_node, kubelet, start_stack, signum):
    node = make_node(NODE)
    stack = start_stack(node)
    await_serving(kubelet)
    # The watchdog, started last, serves nothing the kubelet waits for: let it start before the stop.
    stack.wait_for_record("Starting rbln-device-plugin", count=len(PROGRAMS))
    pids = {name: info["pid"] for name, info in program_info(node).items()}
    assert server_proxy(node.run_dir).wakeup.installed() is True  # supervisor.conf's hook in place
    started = time.monotonic()
    assert stack.stop(signum) == 0
    assert time.monotonic() - started < 10
    # One program at a time, each signalled once the one before has exited: the watchdog first, so that
    # nothing restarts anything, then the workers, then the scanner, whose inventory they served.
    stops = sorted((parse_timestamp(r["ts"]), r["process"], r["msg"]) for r in stack.records
                   if r["msg"] in ("Shutdown signal received", "Shutdown"))
    order = [process for _ts, process, msg in stops if msg == "Shutdown"]
    assert [msg for _ts, _process, msg in stops] == ["Shutdown signal received", "Shutdown"] * len(PROGRAMS)
    assert order[0] == WATCHDOG and set(order[1:-1]) == set(WORKERS) and order[-1] == SCANNER
    # SIGHUP means reload to supervisord; here it stopped everything and started nothing again.
    assert any(f"received {signum.name}" in line for line in stack.stderr_lines)
    for process in PROGRAMS:
        own = stack.find(process=process)
        assert [r["msg"] for r in own].count("Starting rbln-device-plugin") == 1
        received = [r for r in own if r["msg"] == "Shutdown signal received"]
        assert len(received) == 1 and received[0]["signal"] == "SIGTERM"  # what supervisord sends its programs
        assert own[-1]["msg"] == "Shutdown"
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert sockets(node.plugin_dir) == {"kubelet.sock"}
    assert sockets(node.run_dir) == set()
