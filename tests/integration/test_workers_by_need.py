"""One worker per resource the node has: the real stack (supervisord and all) on a simulated node, the kubelet
simulator, the health service and `rbln-device-plugin status` asked throughout.

- A node with one resource runs exactly supervisord, the scanner, that resource's worker and the watchdog,
  every one RUNNING (not STARTING) once it serves.
- A resource that appears later gets its worker, which registers.
- A resource that leaves (a partition change) loses its worker: the node runs only what it has, and the probes
  and `status` stay right: a worker never needed, or no longer needed, is absent, not down.
"""

from __future__ import annotations

import json
import os
import pathlib

from shared.channels.status_files import status_file
from shared.programs import SCANNER, WATCHDOG
from shared.resources import Resource
from tests.support.ports import free_port
from tests.support.supervision import SERVING, await_health, health, program_info, status_command
from tests.support.waiting import wait_until

NPU, VF4 = Resource.NPU, Resource.NPU_VF4
VF4_DEVICES = [f"rbln1-{k}" for k in range(4)]
TIMEOUT = 30.0
RESOURCE_OF = {r.process_name: r.value for r in Resource}


def _children(supervisord: int) -> list[str]:
    """The command lines of supervisord's children (the stack's processes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
            cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_text().replace("\0", " ")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == supervisord:
            found.append(cmdline)
    return found


def _supervisord_pid(node) -> int:
    return int((node.run_dir / "supervisord.pid").read_text())


def _running(node) -> dict[str, str]:
    return {name: info["statename"] for name, info in program_info(node).items()}


def _status(stack_env) -> dict:
    answer = status_command(stack_env, "--json")
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)


def _registered(kubelet, resource: Resource, devices: list[str]) -> bool:
    view = kubelet.resources().get(resource.value)
    return view is not None and view.connected and sorted(view.devices) == sorted(devices)


def _serves_only(node, stack_env, port: int, workers: set[str]) -> None:
    """The stack runs the scanner, `workers` and the watchdog, all RUNNING; the probes pass; status says so."""
    expected = {SCANNER, WATCHDOG} | workers
    wait_until(lambda: {n for n, s in _running(node).items() if s == "RUNNING"} == expected, TIMEOUT,
               f"exactly {sorted(expected)} running")
    await_health(port, liveness=SERVING, readiness=SERVING)
    status = _status(stack_env)
    shown = {name: p["state"] for name, p in status["processes"].items() if p["state"] != "STOPPED"}
    assert shown == dict.fromkeys(expected, "RUNNING")
    commands = _children(_supervisord_pid(node))
    assert len(commands) == len(expected), commands
    assert sorted(c.split("--resource ")[1].strip() for c in commands if "--resource" in c) \
        == sorted(RESOURCE_OF[name] for name in workers)
    assert set(status["resources"]) == {RESOURCE_OF[name] for name in workers}


def test_a_node_runs_one_worker_per_resource_it_has_through_every_partition_change(
        make_node, kubelet, start_stack):
    node = make_node("1,1:vf4")
    for device in VF4_DEVICES:
        node.remove_device(device)
    port = free_port()
    stack = start_stack(node, HEALTHCHECK_PORT=str(port))
    stack_env = {**os.environ, **node.env()}

    # One resource: supervisord, the scanner, worker-npu and the watchdog; nothing of the other two workers.
    kubelet.wait_for(lambda k: _registered(k, NPU, ["rbln0"]), TIMEOUT, "npu registered")
    _serves_only(node, stack_env, port, {NPU.process_name})
    assert set(program_info(node)) == {SCANNER, NPU.process_name, WATCHDOG}, "the others never started"
    assert not stack.find("Starting rbln-device-plugin", process=VF4.process_name)

    # The card is partitioned into 4 VFs: its worker starts and registers, without a restart of the others.
    pids = {name: info["pid"] for name, info in program_info(node).items()}
    for device in VF4_DEVICES:
        node.restore_device(device)
    kubelet.wait_for(lambda k: _registered(k, VF4, VF4_DEVICES), TIMEOUT, "npu-vf4 registered")
    _serves_only(node, stack_env, port, {NPU.process_name, VF4.process_name})
    assert {name: info["pid"] for name, info in program_info(node).items() if name in pids} == pids

    # And back: npu-vf4 stops serving at once, and its worker is stopped after the grace; the stack stays live
    # and ready all along.
    for device in VF4_DEVICES:
        node.remove_device(device)
    stack.wait_for_record("Stopped device plugin for absent resource", resourceName=VF4.value, timeout=TIMEOUT)
    stack.wait_for_record("Stopped worker of absent resource", program=VF4.process_name, timeout=TIMEOUT)
    _serves_only(node, stack_env, port, {NPU.process_name})
    assert health(port, "liveness") == SERVING
    assert not status_file(node.run_dir, VF4.process_name).exists()
