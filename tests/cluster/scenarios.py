"""What the cluster scenarios share: the session (cluster, simulated node, timings), the chart release installed
as the README says, workload pods and what they see. The fixtures that make them are in conftest.py."""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from simulator.node import SimulatedNode
from tests.cluster.cluster import NODE, Cluster, Stopwatch, pod_ready
from tests.cluster.images import BUSYBOX_IMAGE
from tests.support.deploy import ROOT, load_deploy_module
from tests.support.waiting import wait_until

tools = load_deploy_module("tools")

CHART = ROOT / "deploy" / "helm" / "k8s-device-plugin-chart"
# The README's install command: release, namespace, and the image by repository and tag.
RELEASE = "rbln-device-plugin"
NAMESPACE = "rbln-device-plugin"
IMAGE_REPOSITORY = "rbln-device-plugin-image-test"  # deploy/image_test.sh's name for the image it builds
# The image's own interpreter runs the node's rbln-smi stand-in inside the pod (deploy/container/Dockerfile).
IMAGE_PYTHON = "/opt/rbln-device-plugin/bin/python"
# Two NPUs and one PF partitioned into four VFs, on one PCIe switch: npu 2, npu-vf4 4.
NODE_SPEC = "2,1:vf4"
# rsd<G> nodes for the groups the stack may make (one per NPU at most).
RSD_GROUPS = 8
# What the RBLN container toolkit installs defines rebellions.ai/npu=runtime, which the chart's default
# cdiAnnotation (always) names; its edits here are an environment variable alone (the toolkit's mount the
# node's rbln-smi, which this node does not have).
TOOLKIT_SPEC = b"""cdiVersion: 0.5.0
kind: rebellions.ai/npu
devices:
- name: runtime
  containerEdits:
    env: [RBLN_TOOLKIT=cluster-test]
"""
# The chart's cdiRoot (its default, /var/run/cdi), where the toolkit's spec lies and worker-dra writes its claims'.
CDI_ROOT = pathlib.Path("/var/run/cdi")
TOOLKIT_SPEC_FILE = "rbln-toolkit.yaml"
READY_TIMEOUT = 120.0
WORKLOAD_NAMESPACE = "default"


@dataclasses.dataclass
class Session:
    cluster: Cluster
    node: SimulatedNode
    stopwatch: Stopwatch
    image_tag: str


def node_values(node: SimulatedNode) -> dict[str, Any]:
    """The values that point the chart at the simulated node: its paths, and its dir mounted at the same path
    (the rbln-smi stand-in and its state). No /etc/cdi (the chart's default spec dir would be made on the
    host): the toolkit's spec is in cdiRoot."""
    return {"paths": {"sysfsRoot": str(node.sysfs_root), "devRoot": str(node.dev_root),
                      "rblnSmi": str(node.rbln_smi), "rsdLockFile": str(node.lock_file)},
            "devicePlugin": {"cdiSpecDirs": []},
            "extraVolumes": [{"name": "simulated-node", "hostPath": {"path": str(node.root), "type": "Directory"}}],
            "extraVolumeMounts": [{"name": "simulated-node", "mountPath": str(node.root)}]}


class Release:
    """The chart installed by `helm upgrade --install` as the README says, plus the node's values and the
    mode's."""

    def __init__(self, session: Session, mode_values: Sequence[str], work: pathlib.Path):
        self.session = session
        self.cluster = session.cluster
        self.mode_values = list(mode_values)
        self.values_file = work / "node-values.yaml"
        self.values_file.write_text(yaml.safe_dump(node_values(session.node)))
        self.installed = False

    def helm(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        result = subprocess.run([str(tools.helm()), f"--kubeconfig={self.cluster.admin_kubeconfig}", *args],
                                capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
        return result

    def upgrade_install(self, tag: str) -> None:
        self.helm("upgrade", "--install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
                  "--set", f"image.repository={IMAGE_REPOSITORY}", "--set", f"image.tag={tag}",
                  "-f", str(self.values_file), *self.mode_values)
        self.installed = True

    def uninstall(self) -> None:
        self.helm("uninstall", RELEASE, "-n", NAMESPACE)
        self.installed = False

    def pods(self) -> list[dict[str, Any]]:
        return self.cluster.pods(NAMESPACE, f"app.kubernetes.io/instance={RELEASE}")

    def ready_pod(self, other_than: str = "", timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """The release's one pod once Ready (and not named `other_than`, the pod an upgrade replaces)."""
        def ready() -> dict[str, Any] | None:
            pods = [p for p in self.pods() if p["metadata"]["name"] != other_than
                    and not p["metadata"].get("deletionTimestamp")]
            return pods[0] if len(pods) == 1 and pod_ready(pods[0]) else None
        return wait_until(ready, timeout, f"the {RELEASE} pod Ready", poll=0.2)

    def exec(self, pod: str, *argv: str) -> str:
        return self.cluster.kubectl("exec", "-n", NAMESPACE, pod, "-c", "plugin", "--", *argv).stdout


def start_to_ready(pod: Mapping[str, Any]) -> float:
    """Seconds from the container's start to the pod's Ready condition, as the kubelet reports them (whole
    seconds): how long the readiness probe made a ready stack wait."""
    def moment(text: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    (container,) = pod["status"]["containerStatuses"]
    (ready,) = [c for c in pod["status"]["conditions"] if c["type"] == "Ready"]
    return (moment(ready["lastTransitionTime"]) - moment(container["state"]["running"]["startedAt"])).total_seconds()


def workload_pod(name: str, requests: Mapping[str, int] | None = None,
                 claims: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A busybox pod that lists its /dev and sleeps; `requests` are extended resources, `claims` pod claim
    name -> ResourceClaimTemplate name."""
    container: dict[str, Any] = {"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
                                 "command": ["sh", "-c", "ls /dev; sleep 3600"]}
    if requests:
        container["resources"] = {"limits": {k: str(v) for k, v in requests.items()}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 0,
                            "nodeSelector": {"kubernetes.io/hostname": NODE}}
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()]
        container["resources"] = {**container.get("resources", {}), "claims": [{"name": c} for c in claims]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": WORKLOAD_NAMESPACE},
            "spec": spec}


def run_pod(session: Session, mode: str, pod: Mapping[str, Any]) -> dict[str, Any]:
    """Create the pod and wait until it runs; the time from create to Running is recorded for the mode."""
    start = time.monotonic()
    session.cluster.apply(pod)
    running_pod = wait_running(session, pod["metadata"]["name"])
    session.stopwatch.since(f"pod create -> Running ({mode})", start)
    return running_pod


def wait_running(session: Session, name: str) -> dict[str, Any]:
    """The workload pod once its container runs; its events and status in the error if it does not."""
    cluster = session.cluster

    def running() -> dict[str, Any] | None:
        """The pod once its container runs (the phase is Running while a container fails to start)."""
        current = cluster.get("pod", "-n", WORKLOAD_NAMESPACE, name)
        statuses = current["status"].get("containerStatuses", [])
        return current if statuses and all("running" in s["state"] for s in statuses) else None
    try:
        return wait_until(running, READY_TIMEOUT, f"pod {name} Running", poll=0.1)
    except TimeoutError:
        events = [f"{e['reason']}: {e['message']}" for e in cluster.events(WORKLOAD_NAMESPACE, name)]
        status = cluster.get("pod", "-n", WORKLOAD_NAMESPACE, name)["status"]
        raise AssertionError(f"pod {name} not Running; events: {events}; status: {status}") from None


def unschedulable_message(session: Session, name: str) -> str | None:
    """The scheduler's message once it has found no place for the workload pod."""
    pod = session.cluster.get("pod", "-n", WORKLOAD_NAMESPACE, name)
    for condition in pod["status"].get("conditions", []):
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return condition["message"]
    return None


def devices_seen(session: Session, pod_name: str) -> set[str]:
    """The NPU device nodes in the pod's /dev (what its `ls /dev` printed)."""
    last: list[subprocess.CompletedProcess] = []

    def listed() -> str:
        last[:] = [session.cluster.kubectl("logs", "-n", WORKLOAD_NAMESPACE, pod_name, check=False)]
        return last[0].stdout
    try:
        output = wait_until(listed, 30, f"{pod_name}'s ls /dev", poll=0.2)
    except TimeoutError as error:
        files = {str(f): f.read_text() for f in pathlib.Path("/var/log/pods").glob(f"*_{pod_name}_*/*/*")}
        status = session.cluster.get("pod", "-n", WORKLOAD_NAMESPACE, pod_name)["status"]
        raise AssertionError(f"{error}: kubectl logs said {last[0].stderr!r}; {files}; {status}") from None
    return {name for name in output.split() if name.startswith(("rbln", "rsd"))}
