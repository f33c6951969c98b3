"""DRA mode on the cluster: worker-dra publishes the node's NPUs as ResourceSlices, the scheduler allocates
claims from them, the kubelet prepares them and containerd injects the CDI devices. The scenarios run in
file order on one release."""

from __future__ import annotations

import json
import pathlib
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from shared.node.driver_status import KernelStatus
from tests.cluster.cluster import NODE
from tests.cluster.scenarios import (
    CDI_ROOT,
    IMAGE_REPOSITORY,
    READY_TIMEOUT,
    TOOLKIT_SPEC_FILE,
    WORKLOAD_NAMESPACE,
    devices_seen,
    run_pod,
    unschedulable_message,
    wait_running,
    workload_pod,
)
from tests.dra.dra_harness import DRIVER, RESOURCE_V1, exactly
from tests.support.waiting import wait_until

MODE = "dra"
MODE_VALUES = ("--set", "resourceApi=dra")
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
# Where the kubelet mounts the pod's projected service account token.
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
OTHER_NODE = "another-node"
# The kubelet's (default root dir) DRA plugin dirs, where the chart's dra.* paths point.
KUBELET_PLUGIN_DIRS = (pathlib.Path("/var/lib/kubelet/plugins") / DRIVER,
                       pathlib.Path("/var/lib/kubelet/plugins_registry"))
CLASSES = {"npu.rebellions.ai", "npu-vf1.rebellions.ai", "npu-vf4.rebellions.ai"}


def _template(name: str, device_class: str, count: int = 1,
              constraints: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [exactly("npus", device_class, count)]}
    if constraints:
        devices["constraints"] = list(constraints)
    return {"apiVersion": RESOURCE_V1, "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE}, "spec": {"spec": {"devices": devices}}}


def _slices(session) -> list[dict[str, Any]]:
    return [s for s in session.cluster.get("resourceslices")["items"]
            if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE]


def _published(session) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in _slices(session) for d in s["spec"].get("devices", [])}


def _claim_of(session, pod_name: str) -> dict[str, Any]:
    pod = session.cluster.get("pod", "-n", WORKLOAD_NAMESPACE, pod_name)
    (status,) = pod["status"]["resourceClaimStatuses"]
    return session.cluster.get("resourceclaim", "-n", WORKLOAD_NAMESPACE, status["resourceClaimName"])


def _claim_specs() -> set[str]:
    """The CDI spec files worker-dra wrote for prepared claims (the toolkit's spec aside)."""
    return {p.name for p in CDI_ROOT.iterdir() if p.name != TOOLKIT_SPEC_FILE}


def _delete_and_wait_unprepared(session, pod_name: str, claim_uid: str = "") -> None:
    """Delete the pod, then wait until the kubelet has unprepared its claim (worker-dra removes the claim's CDI
    spec, named by the claim's UID; without one, until no claim has a spec): until then its devices, free again
    for the scheduler, cannot be prepared for another claim."""
    start = time.monotonic()
    session.cluster.kubectl("delete", "pod", "-n", WORKLOAD_NAMESPACE, pod_name, "--wait=true", timeout=120)
    wait_until(lambda: not [s for s in _claim_specs() if claim_uid in s], 60,
               f"{pod_name}'s claim unprepared (its CDI spec removed)", poll=0.2)
    session.stopwatch.since("pod delete -> claim unprepared (dra)", start)


def test_the_device_classes(release, session):
    names = {c["metadata"]["name"] for c in session.cluster.get("deviceclasses")["items"]}
    assert names >= CLASSES


def test_the_slices_publish_the_nodes_devices(release, session):
    devices = wait_until(lambda: len(_published(session)) == 6 and _published(session), 60,
                         "6 devices in the node's slices")
    types = sorted(d["attributes"]["type"]["string"] for d in devices.values())
    assert types == ["npu", "npu", "vf", "vf", "vf", "vf"]


def test_a_claim_template_is_allocated_prepared_injected_and_unprepared(release, session):
    session.cluster.apply(_template("one-npu", "npu.rebellions.ai"))
    run_pod(session, MODE, workload_pod("dra-one", claims={"npu": "one-npu"}))
    claim = _claim_of(session, "dra-one")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER
    devices = devices_seen(session, "dra-one")
    assert "rsd0" in devices and len({d for d in devices if d.startswith("rbln")}) == 1, devices
    assert _claim_specs(), "no CDI spec for the prepared claim"
    _delete_and_wait_unprepared(session, "dra-one")


def test_two_npus_on_one_pcie_root(release, session):
    constraint = {"requests": ["npus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    session.cluster.apply(_template("two-npus", "npu.rebellions.ai", count=2, constraints=[constraint]))
    run_pod(session, MODE, workload_pod("dra-two", claims={"npu": "two-npus"}))
    assert len(_claim_of(session, "dra-two")["status"]["allocation"]["devices"]["results"]) == 2
    devices = devices_seen(session, "dra-two")
    assert "rsd0" in devices and len({d for d in devices if d.startswith("rbln")}) == 2, devices
    _delete_and_wait_unprepared(session, "dra-two")


def test_a_vf_claim(release, session):
    session.cluster.apply(_template("one-vf", "npu-vf4.rebellions.ai"))
    run_pod(session, MODE, workload_pod("dra-vf", claims={"vf": "one-vf"}))
    (result,) = _claim_of(session, "dra-vf")["status"]["allocation"]["devices"]["results"]
    assert _published(session)[result["device"]]
    _delete_and_wait_unprepared(session, "dra-vf")


def test_the_extended_resource_name_is_served_through_the_device_class(release, session):
    run_pod(session, MODE, workload_pod("dra-extended", requests={"rebellions.ai/npu": 1}))
    pod = session.cluster.get("pod", "-n", WORKLOAD_NAMESPACE, "dra-extended")
    assert pod["status"].get("extendedResourceClaimStatus"), json.dumps(pod["status"])
    devices = devices_seen(session, "dra-extended")
    assert len({d for d in devices if d.startswith("rbln")}) == 1, devices
    _delete_and_wait_unprepared(session, "dra-extended")


def _taints(session, device: str) -> list[dict[str, Any]]:
    return _published(session).get(device, {}).get("taints", [])


def _set_status(session, device: str, status: KernelStatus) -> None:
    """The device's driver status on the simulated node (a slice's device is named as the node's)."""
    session.node.set_status(device, int(status))


def _allocated_device(session, pod_name: str) -> str:
    (result,) = _claim_of(session, pod_name)["status"]["allocation"]["devices"]["results"]
    return result["device"]


def test_tainted_devices_are_not_allocated_and_recovery_removes_the_taint(release, session):
    first, second = sorted(name for name, d in _published(session).items()
                           if d["attributes"]["type"]["string"] == "npu")  # slice order: allocation priority
    start = time.monotonic()
    for device in (first, second):
        _set_status(session, device, KernelStatus.FAULT)
    taints = wait_until(lambda: all(_taints(session, d) for d in (first, second))
                        and {d: _taints(session, d) for d in (first, second)}, 60, "both NPUs tainted", poll=0.2)
    session.stopwatch.since("FAULT -> device tainted in the slice (dra)", start)
    for (taint,) in taints.values():
        assert (taint["key"], taint["value"], taint["effect"]) == (UNHEALTHY_TAINT, "FAULT", "NoSchedule"), taint
    session.cluster.apply(workload_pod("dra-tainted", claims={"npu": "one-npu"}))
    wait_until(lambda: unschedulable_message(session, "dra-tainted"), 60,
               "the claim's pod Unschedulable while every NPU is tainted", poll=0.2)
    start = time.monotonic()
    _set_status(session, second, KernelStatus.READY)
    wait_running(session, "dra-tainted")
    session.stopwatch.since("one NPU recovered -> the Pending claim's pod Running (dra)", start)
    assert _allocated_device(session, "dra-tainted") == second  # not the first, still tainted
    assert _taints(session, first)
    start = time.monotonic()
    _set_status(session, first, KernelStatus.READY)
    wait_until(lambda: first in _published(session) and not _taints(session, first), 60,
               f"{first}'s taint removed after recovery", poll=0.2)
    session.stopwatch.since("recovery -> taint removed from the slice (dra)", start)
    _delete_and_wait_unprepared(session, "dra-tainted")


def _device_health(session, pod_name: str, claim: str) -> str | None:
    """The health the kubelet reports in the pod's status for the claim's one device."""
    pod = session.cluster.get("pod", "-n", WORKLOAD_NAMESPACE, pod_name)
    for container in pod["status"].get("containerStatuses", []):
        for status in container.get("allocatedResourcesStatus", []):
            if status["name"] == f"claim:{claim}":
                (resource,) = status["resources"]
                return resource["health"]
    return None


def test_device_health_in_the_pods_status(release, session):
    run_pod(session, MODE, workload_pod("dra-health", claims={"npu": "one-npu"}))
    device = _allocated_device(session, "dra-health")
    wait_until(lambda: _device_health(session, "dra-health", "npu") == "Healthy", 60,
               "the pod's status: its device Healthy", poll=0.2)
    start = time.monotonic()
    _set_status(session, device, KernelStatus.FAULT)
    wait_until(lambda: _device_health(session, "dra-health", "npu") == "Unhealthy", 60,
               "the pod's status: its device Unhealthy after the FAULT", poll=0.2)
    session.stopwatch.since("FAULT -> pod status Unhealthy (dra)", start)
    start = time.monotonic()
    _set_status(session, device, KernelStatus.READY)
    wait_until(lambda: _device_health(session, "dra-health", "npu") == "Healthy", 60,
               "the pod's status: its device Healthy after recovery", poll=0.2)
    session.stopwatch.since("recovery -> pod status Healthy (dra)", start)
    wait_until(lambda: not _taints(session, device), 60, f"{device}'s taint removed", poll=0.2)
    _delete_and_wait_unprepared(session, "dra-health")


def _slice_of(node_name: str) -> dict[str, Any]:
    return {"apiVersion": RESOURCE_V1, "kind": "ResourceSlice", "metadata": {"generateName": f"{node_name}-test-"},
            "spec": {"driver": DRIVER, "nodeName": node_name, "devices": [],
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1}}}


def test_the_plugins_pod_bound_token_writes_no_other_nodes_slice(release, session):
    pod = release.ready_pod()["metadata"]["name"]
    token = release.exec(pod, "cat", TOKEN_FILE).strip()

    def create(node_name: str, *flags: str):
        return session.cluster.kubectl("--token", token, "create", *flags, "-o", "name", "-f", "-",
                                       input=json.dumps(_slice_of(node_name)), check=False)
    # The same token, the same request, its own node: admitted (a server-side dry run passes admission).
    own = create(NODE, "--dry-run=server")
    assert own.returncode == 0, own.stderr
    other = create(OTHER_NODE)
    if other.returncode == 0:
        session.cluster.kubectl("delete", other.stdout.strip())
    assert other.returncode != 0, f"a slice of {OTHER_NODE} created with {NODE}'s plugin token: {other.stdout}"
    assert f"the DRA plugin of node {NODE} may write only ResourceSlices of its own node" in other.stderr, \
        other.stderr


class _ClaimFlow(threading.Thread):
    """Pods with a claim from one template, created and deleted one after another until stopped: each must run
    (its claim prepared by whichever instance of the plugin the kubelet calls) and its claim be unprepared."""

    def __init__(self, session, template: str):
        super().__init__(name=f"claim-flow-{template}", daemon=True)
        self.session = session
        self.template = template
        self.stopping = threading.Event()
        self.created: list[float] = []  # when each pod was created (monotonic)
        self.ran = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                name = f"dra-flow-{self.template}-{len(self.created)}"
                self.created.append(time.monotonic())
                run_pod(self.session, f"{MODE}, during a surge upgrade",
                        workload_pod(name, claims={"device": self.template}))
                self.ran += 1
                claim_uid = _claim_of(self.session, name)["metadata"]["uid"]
                _delete_and_wait_unprepared(self.session, name, claim_uid)
        except BaseException as error:  # reported by the scenario's thread
            self.failure = error

    def await_pods(self, count: int, what: str) -> None:
        wait_until(lambda: self.failure is not None or self.ran >= count, READY_TIMEOUT, what, poll=0.2)
        if self.failure is not None:
            raise AssertionError(f"a {self.template} claim pod failed while {what}") from self.failure


def _sockets_of(pod_uid: str) -> list[pathlib.Path]:
    """The plugin instance's DRA and registration sockets (named by its pod UID) in the kubelet's dirs."""
    return [path for directory in KUBELET_PLUGIN_DIRS for path in directory.rglob(f"*{pod_uid}*")]


def test_a_surge_upgrade_with_claims_flowing(release, session):
    old = release.ready_pod()["metadata"]
    assert len(_sockets_of(old["uid"])) == 2, _sockets_of(old["uid"])
    new_tag = f"{session.image_tag}-surge"
    session.cluster.tag_image(f"docker.io/library/{IMAGE_REPOSITORY}:{session.image_tag}",
                              f"docker.io/library/{IMAGE_REPOSITORY}:{new_tag}")
    # One flow of NPU claims and one of VF claims, so that some claim is being prepared or unprepared most of
    # the time the two instances overlap.
    flows = [_ClaimFlow(session, "one-npu"), _ClaimFlow(session, "one-vf")]
    for flow in flows:
        flow.start()
    try:
        for flow in flows:
            flow.await_pods(1, "claims flow before the upgrade")
        start = time.monotonic()
        release.upgrade_install(new_tag)
        new = release.ready_pod(other_than=old["name"])
        session.stopwatch.since("helm upgrade -> new pod Ready (dra surge)", start)
        # A surge: the old pod is stopped only once the new one is Ready.
        surged = old["uid"] in {p["metadata"]["uid"] for p in release.pods()}
        wait_until(lambda: not [p for p in release.pods() if p["metadata"]["uid"] == old["uid"]], READY_TIMEOUT,
                   "the old pod gone", poll=0.2)
        end = time.monotonic()
        session.stopwatch.record("helm upgrade -> old pod gone (dra surge)", end - start)
        for flow in flows:
            flow.await_pods(flow.ran + 2, "claims flow after the upgrade")
    finally:
        for flow in flows:
            flow.stopping.set()
        for flow in flows:
            flow.join(READY_TIMEOUT)
    for flow in flows:
        assert flow.failure is None, flow.failure
    during = sum(1 for flow in flows for created in flow.created if start <= created <= end)
    assert during, "no claim pod was created while the upgrade ran"
    assert surged, "the old pod was gone before the new one was Ready"
    assert new["spec"]["containers"][0]["image"].endswith(f":{new_tag}")
    failed = [f"{e['involvedObject']['name']}: {e['message']}" for e in session.cluster.get(
        "events", "-n", WORKLOAD_NAMESPACE)["items"] if e["reason"] == "FailedPrepareDynamicResources"]
    assert not failed, failed
    assert not _sockets_of(old["uid"]), _sockets_of(old["uid"])
    assert len(_sockets_of(new["metadata"]["uid"])) == 2, _sockets_of(new["metadata"]["uid"])


def test_helm_uninstall_stops_the_stack(release, session):
    release.uninstall()
    wait_until(lambda: not release.pods(), 60, "the pod gone", poll=0.2)
