"""The real stack's /metrics and `status`: one endpoint for every process, series that follow the node,
nothing left behind by a killed worker, and which pod holds which device."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import grpc
import pytest

from shared.config import ResourceApi
from shared.observability.metrics import DRA_ONLY_FAMILIES, FAMILIES, metrics_dir
from shared.programs import expected_programs
from shared.resources import Resource
from simulator.stack import ENTRYPOINT
from tests.support.metrics_scrape import families, metrics_port, parse, scrape_text, series, value, wait_for_scrape
from tests.support.ports import listening_ports
from tests.support.supervision import program_info
from tests.support.waiting import wait_until

NPU, VF1, VF4 = (r.value for r in Resource)
NODE = "2,1:vf4"


def registered(*resources: str):
    return lambda samples: all(value(samples, "rbln_device_plugin_registered", resource=r) == 1 for r in resources)


def test_every_family_from_every_process_and_a_killed_worker_counts_once(make_node, kubelet, start_stack):
    node = make_node(NODE)
    # A run dir left by an earlier container of the pod: its counts must not come back.
    stale = metrics_dir(node.run_dir) / "counter_1.db"
    stale.parent.mkdir(mode=0o700)
    stale.write_bytes(b"an old run's counts")
    stack = start_stack(node, METRICS_PORT="0")
    port = metrics_port(stack)
    assert not stale.exists()
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy"}, timeout=30)
    kubelet.wait_for_devices(VF4, {f"rbln2-{i}": "Healthy" for i in range(4)}, timeout=30)
    kubelet.allocate(NPU, [["rbln0"]])
    kubelet.preferred_allocation(VF4, ["rbln2-0", "rbln2-1", "rbln2-9"], size=1)
    with pytest.raises(grpc.RpcError):
        kubelet.allocate(NPU, [["rbln9"]])  # refused: no such device
    # Readiness follows the watchdog's next judgement, which may come a moment after both have registered.
    wait_for_scrape(port, lambda s: registered(NPU, VF4)(s) and value(s, "rbln_device_plugin_ready") == 1,
                    "npu and npu-vf4 registered, the stack ready")
    text = scrape_text(port)
    # In device plugin mode: every family but worker-dra's own.
    assert families(text) == {family.name for family in FAMILIES} - {family.name for family in DRA_ONLY_FAMILIES}
    samples = parse(text)
    # No device of npu-vf1: its worker never ran, and the resource has no series (absent, not down).
    assert not series(samples, "rbln_device_plugin_registered", resource=VF1)
    assert value(samples, "rbln_device_plugin_devices", resource=NPU, health="Healthy") == 2
    assert value(samples, "rbln_device_plugin_devices", resource=VF4, health="Healthy") == 4
    assert value(samples, "rbln_device_plugin_allocations_total", resource=NPU, result="success") == 1
    assert value(samples, "rbln_device_plugin_allocations_total", resource=NPU, result="failure") == 1
    assert value(samples, "rbln_device_plugin_allocate_duration_seconds_count", resource=NPU) == 2
    assert value(samples, "rbln_device_plugin_preferred_allocation_duration_seconds_count", resource=VF4) == 1
    assert value(samples, "rbln_device_plugin_preferred_allocation_fallbacks_total", resource=VF4) == 1  # rbln2-9
    # The scanner's commands and a worker's, in one page.
    assert value(samples, "rbln_device_plugin_rbln_smi_duration_seconds_count", command="list") >= 1
    assert value(samples, "rbln_device_plugin_rbln_smi_duration_seconds_count", command="group-create") == 1
    assert value(samples, "rbln_device_plugin_scan_duration_seconds_count") >= 1
    assert value(samples, "rbln_device_plugin_ready") == 1
    assert value(samples, "rbln_device_plugin_discovery_failing") == 0
    watchdog = program_info(node)["watchdog"]["pid"]
    assert port in listening_ports(watchdog)

    # SIGKILL: no goodbye, its status file and value files stay behind.
    victim = program_info(node)["worker-npu"]["pid"]
    before = kubelet.resources()[NPU].registrations
    os.kill(victim, signal.SIGKILL)
    kubelet.wait_for(lambda k: k.resources()[NPU].registrations > before and k.resources()[NPU].connected, 30,
                     "the new worker-npu to register")
    successor = program_info(node)["worker-npu"]["pid"]
    def victims_files() -> list[str]:
        return [path.name for path in metrics_dir(node.run_dir).iterdir() if path.name.endswith(f"_{victim}.db")]

    # A scrape within PAGE_REUSE_SECONDS of an earlier one answers with that page: the fold comes with the first
    # collection after the kill, so the scrape awaited is one that has folded.
    samples = wait_for_scrape(port, lambda s: registered(NPU)(s) and value(
        s, "rbln_device_plugin_list_and_watch_streams", resource=NPU) == 1 and not victims_files(),
        "the new worker-npu serving and the dead one's files folded")
    assert series(samples, "rbln_device_plugin_registered", resource=NPU) == [{"resource": NPU}]
    assert value(samples, "rbln_device_plugin_devices", resource=NPU, health="Healthy") == 2
    assert len(series(samples, "rbln_device_plugin_device_status", resource=NPU)) == 2
    # The dead worker's allocations still count, once; its files were folded away at the scrape.
    assert value(samples, "rbln_device_plugin_allocations_total", resource=NPU, result="success") == 1
    assert {"counter_archive.db", "histogram_archive.db"} <= {path.name for path in metrics_dir(node.run_dir).iterdir()}
    kubelet.allocate(NPU, [["rbln1"]])
    samples = wait_for_scrape(port, lambda s: value(s, "rbln_device_plugin_allocations_total", resource=NPU,
                                                    result="success") == 2, "the successor's allocation")
    assert value(samples, "rbln_device_plugin_allocate_duration_seconds_count", resource=NPU) == 3
    assert successor != victim and watchdog == program_info(node)["watchdog"]["pid"]


def test_a_fault_shows_as_the_device_status_and_an_unhealthy_count(make_node, kubelet, start_stack):
    node = make_node("3")
    port = metrics_port(start_stack(node, METRICS_PORT="0"))
    wait_for_scrape(port, lambda s: value(s, "rbln_device_plugin_devices", resource=NPU, health="Healthy") == 3,
                    "three healthy devices")
    node.set_status("rbln1", 4)
    node.set_status("rbln2", 9)
    samples = wait_for_scrape(port, lambda s: value(s, "rbln_device_plugin_devices", resource=NPU,
                                                    health="Unhealthy") == 2, "two unhealthy devices")
    assert series(samples, "rbln_device_plugin_device_status", device="rbln1") == [
        {"resource": NPU, "device": "rbln1", "status": "FAULT"}]
    assert series(samples, "rbln_device_plugin_device_status", device="rbln2") == [
        {"resource": NPU, "device": "rbln2", "status": "UNKNOWN"}]
    assert value(samples, "rbln_device_plugin_ready") == 1  # unhealthy devices are still served
    node.set_status("rbln1", 0)
    samples = wait_for_scrape(port, lambda s: value(s, "rbln_device_plugin_device_status", resource=NPU,
                                                    device="rbln1", status="READY") == 1, "rbln1 READY again")
    assert len(series(samples, "rbln_device_plugin_device_status", device="rbln1")) == 1


def test_metrics_off_listen_nowhere_and_write_nothing(make_node, kubelet, start_stack):
    node = make_node("1")
    stack = start_stack(node)  # the simulated node's environment turns metrics off
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy"}, timeout=30)
    kubelet.allocate(NPU, [["rbln0"]])
    stack.wait_for_record("Completed container allocation")
    # Every program started (the watchdog last), so that what it would listen on or write is there to see.
    running = expected_programs(ResourceApi.DEVICE_PLUGIN, [NPU])
    started = stack.wait_for_record("Starting rbln-device-plugin", count=len(running))
    assert {r["process"] for r in started} == set(running) and all(r["metricsPort"] == -1 for r in started)
    assert not stack.find("Metrics endpoint listening")
    assert not metrics_dir(node.run_dir).exists()
    assert listening_ports(program_info(node)["watchdog"]["pid"]) == set()


def status(node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENTRYPOINT, "status", *args],
                          env={**os.environ, **node.env()}, capture_output=True, text=True, timeout=30)


def test_status_names_the_pod_holding_each_device_and_unknown_without_the_kubelet(make_node, kubelet,
                                                                                  start_stack):
    node = make_node(NODE)
    start_stack(node)
    kubelet.wait_for_devices(VF4, {f"rbln2-{i}": "Healthy" for i in range(4)}, timeout=30)
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy"}, timeout=30)
    kubelet.allocate(VF4, [["rbln2-1", "rbln2-2"]], pod="infer-0", namespace="ml")
    kubelet.allocate(NPU, [["rbln1"]], pod="train-0", namespace="ml")
    wait_until(lambda: all(r["registered"] for name, r in json.loads(status(node, "--json").stdout)[
        "resources"].items() if name != VF1), 10, "the status files to show both resources registered")

    report = json.loads(status(node, "--json").stdout)
    held = {d["device"]: d["heldBy"] for d in report["devices"]}
    assert held == {"rbln0": [], "rbln1": ["ml/train-0/ctr-0"], "rbln2-0": [], "rbln2-1": ["ml/infer-0/ctr-0"],
                    "rbln2-2": ["ml/infer-0/ctr-0"], "rbln2-3": []}
    assert report["podResources"] == {"error": None}
    text = status(node)
    assert text.returncode == 0
    rows = {line.split()[0]: line.split()[1:] for line in text.stdout.splitlines() if line.strip()}
    assert rows["rbln2-1"] == [VF4, "Healthy", "UNREADABLE", "ml/infer-0/ctr-0"]
    assert rows["rbln0"][-1] == "-"

    kubelet.stop()  # the kubelet is gone: the holders are unknown, the rest of the report is the same
    text = status(node)
    assert text.returncode == 0
    rows = {line.split()[0]: line.split()[1:] for line in text.stdout.splitlines() if line.strip()}
    assert rows["rbln2-1"][-1] == "unknown"
    assert all(rows[program][1].isdigit() for program in expected_programs(ResourceApi.DEVICE_PLUGIN, [NPU, VF4])), \
        "each process still shown with its pid"
    assert "held by: unknown; the kubelet's PodResources API cannot be asked: no socket at" in text.stdout
    # An explicit flag wins over the environment.
    flagged = json.loads(status(node, "--json", "--kubelet-pod-resources-socket", str(node.root / "elsewhere.sock"))
                         .stdout)
    assert str(node.root / "elsewhere.sock") in flagged["podResources"]["error"]
