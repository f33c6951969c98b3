"""Device plugin mode on the cluster: the chart's defaults, the scheduler placing pods from the node's
allocatable, containerd giving them their devices. The scenarios run in file order on one release."""

from __future__ import annotations

import json
import pathlib
import time

from shared.node.driver_status import KernelStatus
from tests.cluster.scenarios import (
    IMAGE_REPOSITORY,
    NAMESPACE,
    WORKLOAD_NAMESPACE,
    devices_seen,
    run_pod,
    start_to_ready,
    unschedulable_message,
    workload_pod,
)
from tests.support.waiting import wait_until

MODE = "device-plugin"
MODE_VALUES: tuple[str, ...] = ()  # the chart's default
NPU, VF4 = "rebellions.ai/npu", "rebellions.ai/npu-vf4"
# The node has whole NPUs and npu-vf4 VFs: supervisord runs their workers, never worker-npu-vf1.
PROGRAMS = {"scanner", "watchdog", "worker-npu", "worker-npu-vf4"}
# Two NPUs: two one-NPU pods fit, a third does not.
FITTING_PODS = ("npu-a", "npu-b")


def _allocatable(session, resource: str) -> str | None:
    return session.cluster.allocatable().get(resource)


def test_the_daemonset_pod_is_ready_through_the_kubelets_probes_with_supervisord_as_pid_1(release):
    pod = release.ready_pod()
    argv = release.exec(pod["metadata"]["name"], "cat", "/proc/1/cmdline").split("\0")
    assert argv[1:4] == ["-m", "supervisor.supervisord", "-n"]
    programs = json.loads(release.exec(pod["metadata"]["name"], "rbln-device-plugin", "status", "--json"))
    assert set(programs["processes"]) == PROGRAMS
    assert {name: p["state"] for name, p in programs["processes"].items()} == dict.fromkeys(PROGRAMS, "RUNNING")


def test_allocatable_per_resource(release, session):
    wait_until(lambda: _allocatable(session, NPU) == "2" and _allocatable(session, VF4) == "4", 60,
               "allocatable npu 2, npu-vf4 4")
    assert "rebellions.ai/npu-vf1" not in session.cluster.allocatable() \
        or session.cluster.allocatable()["rebellions.ai/npu-vf1"] == "0"


def test_pods_placed_by_the_scheduler_see_rsd0_and_exactly_their_devices(release, session):
    seen = []
    for name in FITTING_PODS:
        run_pod(session, MODE, workload_pod(name, requests={NPU: 1}))
        devices = devices_seen(session, name)
        assert "rsd0" in devices
        npus = {d for d in devices if d.startswith("rbln")}
        assert len(npus) == 1, devices
        seen.append(npus)
    assert seen[0] != seen[1]


def test_a_pod_that_does_not_fit_stays_pending_with_the_schedulers_reason(release, session):
    session.cluster.apply(workload_pod("npu-c", requests={NPU: 1}))
    message = wait_until(lambda: unschedulable_message(session, "npu-c"), 60, "npu-c Unschedulable")
    assert f"Insufficient {NPU}" in message
    assert session.cluster.get("pod", "-n", WORKLOAD_NAMESPACE, "npu-c")["status"]["phase"] == "Pending"
    session.cluster.kubectl("delete", "pod", "-n", WORKLOAD_NAMESPACE, "npu-c", "--wait=false")


def test_a_fault_and_its_recovery_are_followed_by_allocatable(release, session):
    node = session.node
    start = time.monotonic()
    node.set_status("rbln0", int(KernelStatus.FAULT))
    wait_until(lambda: _allocatable(session, NPU) == "1", 60, "allocatable npu 1 after the FAULT", poll=0.2)
    session.stopwatch.since("FAULT -> allocatable", start)
    start = time.monotonic()
    node.set_status("rbln0", int(KernelStatus.READY))
    wait_until(lambda: _allocatable(session, NPU) == "2", 60, "allocatable npu 2 after recovery", poll=0.2)
    session.stopwatch.since("recovery -> allocatable", start)


def _workloads(session) -> dict[str, tuple[str, str]]:
    """Each workload pod's (uid, container id): what a restart or a re-creation would change."""
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["status"]["containerStatuses"][0]["containerID"])
            for p in session.cluster.pods(WORKLOAD_NAMESPACE) if p["metadata"]["name"] in FITTING_PODS}


def test_helm_upgrade_rolls_the_daemonset_and_leaves_running_pods_untouched(release, session):
    before = _workloads(session)
    old = release.ready_pod()["metadata"]["name"]
    # A new image tag, as the README's upgrade: the same image under another name.
    new_tag = f"{session.image_tag}-upgrade"
    session.cluster.tag_image(f"docker.io/library/{IMAGE_REPOSITORY}:{session.image_tag}",
                              f"docker.io/library/{IMAGE_REPOSITORY}:{new_tag}")
    start = time.monotonic()
    release.upgrade_install(new_tag)
    pod = release.ready_pod(other_than=old)
    session.stopwatch.since("helm upgrade -> new pod Ready", start)
    session.stopwatch.record("plugin container start -> pod Ready, whole seconds (upgrade)", start_to_ready(pod))
    assert pod["spec"]["containers"][0]["image"].endswith(f":{new_tag}")
    assert _workloads(session) == before
    assert all(p["status"]["phase"] == "Running" for p in session.cluster.pods(WORKLOAD_NAMESPACE)
               if p["metadata"]["name"] in FITTING_PODS)
    wait_until(lambda: _allocatable(session, NPU) == "2", 60, "allocatable npu 2 after the upgrade")


def _registrations(release, pod_name: str) -> int:
    """How often the plugin's rebellions.ai/npu worker registered with the kubelet (its log, through kubectl)."""
    logs = release.cluster.kubectl("logs", "-n", NAMESPACE, pod_name, "-c", "plugin", check=False)
    if logs.returncode != 0:  # the kubelet, which serves them, is down
        return -1
    records = [json.loads(line) for line in logs.stdout.splitlines() if line.startswith("{")]
    return sum(1 for r in records
               if r["msg"] == "Registered device plugin with kubelet" and r.get("resourceName") == NPU)


def test_a_kubelet_restart_is_followed_by_registration(release, session):
    before = _workloads(session)
    pod_name = release.ready_pod()["metadata"]["name"]
    registered = _registrations(release, pod_name)
    start = time.monotonic()
    session.cluster.restart_kubelet()
    wait_until(lambda: _registrations(release, pod_name) > registered, 60, "the worker registered again", poll=0.2)
    session.stopwatch.since("kubelet restart -> registered again", start)
    wait_until(session.cluster.node_ready, 60, "the node Ready again")
    wait_until(lambda: _allocatable(session, NPU) == "2", 60, "allocatable npu 2 after the restart")
    assert release.ready_pod()["metadata"]["name"] == pod_name
    assert _workloads(session) == before


def test_the_plugins_log_in_the_kubelets_files_is_a_json_stream(release):
    pod = release.ready_pod()
    uid = pod["metadata"]["uid"]
    (log_dir,) = pathlib.Path("/var/log/pods").glob(f"{NAMESPACE}_{pod['metadata']['name']}_{uid}")
    lines = [line for file in sorted((log_dir / "plugin").glob("*.log")) for line in file.read_text().splitlines()]
    # CRI log format: "<time> <stream> <tag> <content>"; the stack writes JSON to stdout only.
    records = []
    for line in lines:
        _time, stream, _tag, content = line.split(" ", 3)
        assert stream == "stdout", line
        records.append(json.loads(content))
    assert records
    assert all({"ts", "level", "msg", "process"} <= set(record) for record in records)
    starting = {r["process"] for r in records if r["msg"] == "Starting rbln-device-plugin"}
    assert starting == PROGRAMS


def test_helm_uninstall_stops_the_stack_within_its_grace_period(release, session):
    pod = release.ready_pod()
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    start = time.monotonic()
    release.uninstall()
    wait_until(lambda: not release.pods(), grace, "the pod gone within its grace period", poll=0.2)
    session.stopwatch.since("helm uninstall -> pod gone", start)
