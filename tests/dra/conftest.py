"""Fixtures of the DRA scenarios: one real kube-apiserver (with etcd) for the session, holding what the chart
renders for DRA (its ValidatingAdmissionPolicy included); per scenario a simulated node, the kubelet's own DRA
manager (the Go harness) for it and the real stack in DRA mode, whose worker reaches the API server as the
chart's service account with a token bound to a pod on its node, as the kubelet mounts it.

tests/dra/run.sh builds the harness and runs these with this directory's pytest.ini; the project's default
test run leaves this directory out (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from simulator.node import SimulatedNode, build_node
from simulator.spec import NodeSpec
from simulator.stack import StackProcess
from tests.dra.dra_harness import DRIVER, ApiServer, DraKubelet
from tests.support.deploy import load_deploy_module

# A failed scenario's directory is kept and named in the summary, as in the conformance scenarios.
from tests.support.kept_on_failure import (  # noqa: F401
    pytest_runtest_makereport,
    pytest_terminal_summary,
    scenario_dir,
    start_keeping,
)
from tests.support.waiting import wait_until

HARNESS_BINARY = "DRA_HARNESS"
SCAN_INTERVAL = "500ms"
CHART = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "helm" / "k8s-device-plugin-chart"
RELEASE_NAMESPACE = "kube-system"
# The chart values that turn a node's stack to DRA (agreed in the DRA interface notes).
DRA_VALUES = ("--set", "resourceApi=dra")
_CHART_KINDS = ("DeviceClass", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding")
_NAMES = itertools.count(1)
tools = load_deploy_module("tools")


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(HARNESS_BINARY):
        raise pytest.UsageError(f"{HARNESS_BINARY} is not set: run the DRA scenarios with tests/dra/run.sh, "
                                "which builds the harness")
    start_keeping(config)


def _binary() -> pathlib.Path:
    return pathlib.Path(os.environ[HARNESS_BINARY])


@pytest.fixture(scope="session")
def chart() -> dict[str, list[dict[str, Any]]]:
    """What `helm template` renders with the DRA values, by kind."""
    render = subprocess.run([str(tools.helm()), "template", "rbln", str(CHART), "--namespace", RELEASE_NAMESPACE,
                             *DRA_VALUES], capture_output=True, text=True, timeout=120)
    assert render.returncode == 0, f"helm template failed: {render.stderr}"
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for document in yaml.safe_load_all(render.stdout):
        if document:
            by_kind.setdefault(document["kind"], []).append(document)
    return by_kind


@pytest.fixture(scope="session")
def cluster(chart, tmp_path_factory) -> Iterator[ClusterAccess]:
    """The API server, with the chart's DeviceClasses, RBAC and service account applied as the chart has them."""
    accounts = chart.get("ServiceAccount") or []
    assert len(accounts) == 1, f"the DRA render has {len(accounts)} ServiceAccounts, not one"
    account = accounts[0]["metadata"]
    namespace = account.get("namespace", RELEASE_NAMESPACE)
    state = pathlib.Path(tempfile.mkdtemp(prefix="rbln-dra-api-", dir="/tmp"))
    server = ApiServer(_binary(), state, f"{namespace}/{account['name']}").start()
    admin = DraKubelet(_binary(), state / "admin-client.log", server.admin_kubeconfig, "none", state / "unused",
                       state / "unused")
    admin.start_client()
    try:
        admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        admin.apply(*[obj for kind in _CHART_KINDS for obj in chart.get(kind) or ()], *accounts)
        wait_until(lambda: _policy_refuses(server), 30, "the chart's ValidatingAdmissionPolicy in force")
        yield ClusterAccess(server, admin, tuple(d["metadata"]["name"] for d in chart.get("DeviceClass") or ()),
                            namespace, account["name"])
    finally:
        admin.close()
        server.close()
    shutil.rmtree(state, ignore_errors=True)


def _policy_refuses(server: ApiServer) -> bool:
    """Whether the API server applies the chart's policy yet (it loads new policies asynchronously): a dry-run
    slice by the worker's static token, which names no node."""
    token = yaml.safe_load(pathlib.Path(server.worker_kubeconfig).read_text())["users"][0]["user"]["token"]
    probe = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "policy-probe"},
             "spec": {"driver": DRIVER, "nodeName": "probe", "pool": {"name": "probe", "generation": 1,
                                                                       "resourceSliceCount": 1}}}
    answer = server.request("POST", "/apis/resource.k8s.io/v1/resourceslices?dryRun=All", token=token, body=probe)
    return answer.status_code == 422 and "name no node" in answer.text


@dataclasses.dataclass(frozen=True)
class ClusterAccess:
    server: ApiServer
    admin: DraKubelet
    device_classes: tuple[str, ...]
    namespace: str
    service_account: str

    def pod_bound_token(self, node_name: str) -> str:
        """A token of the chart's service account bound to a pod on `node_name` (a TokenRequest, as the kubelet
        makes for the pod's projected token): it names the node (authentication.kubernetes.io/node-name)."""
        (bound,) = self.admin.apply({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"plugin-{node_name}", "namespace": self.namespace},
            "spec": {"nodeName": node_name, "serviceAccountName": self.service_account,
                     "containers": [{"name": "plugin", "image": "none"}]}})
        answer = self.server.request(
            "POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{self.service_account}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
                "expirationSeconds": 7200, "boundObjectRef": {
                    "apiVersion": "v1", "kind": "Pod", "name": bound["metadata"]["name"],
                    "uid": bound["metadata"]["uid"]}}})
        assert answer.status_code == 201, f"TokenRequest: {answer.status_code} {answer.text}"
        return answer.json()["status"]["token"]

    def kubeconfig_with(self, token: str, path: pathlib.Path) -> str:
        """The worker's kubeconfig with another bearer token."""
        config = yaml.safe_load(pathlib.Path(self.server.worker_kubeconfig).read_text())
        config["users"][0]["user"] = {"token": token}
        path.write_text(yaml.safe_dump(config))
        return str(path)


@pytest.fixture
def node_root(request: pytest.FixtureRequest, cluster) -> Iterator[pathlib.Path]:
    """The scenario's directory: node, stack logs, kubelet state and log; kept when the scenario fails."""
    with scenario_dir(request, "rbln-dra-",
                      on_failure=lambda root: shutil.copy(cluster.server.log_path, root / "apiserver.log")) as root:
        yield root


@dataclasses.dataclass
class DraNode:
    """A simulated node with its own Node object and namespace in the shared API server, and its worker's
    kubeconfig (a token bound to a pod on the node)."""
    node: SimulatedNode
    name: str
    namespace: str
    kubeconfig: str

    @property
    def registry(self) -> pathlib.Path:
        return self.node.root / "plugins_registry"

    @property
    def plugins(self) -> pathlib.Path:
        return self.node.root / "plugins"

    def env(self, cluster: ClusterAccess, scan_interval: str = SCAN_INTERVAL) -> dict[str, str]:
        return {**self.node.env(scan_interval), "RESOURCE_API": "dra", "NODE_NAME": self.name,
                "KUBECONFIG": self.kubeconfig, "KUBELET_PLUGINS_PATH": str(self.plugins),
                "KUBELET_PLUGIN_REGISTRY_PATH": str(self.registry), "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "debug"}


@pytest.fixture
def make_node(node_root, cluster) -> Callable[..., DraNode]:
    def make(spec: str, numa_nodes: int = 1, switches: int = 2) -> DraNode:
        number = next(_NAMES)
        name = f"dra-node-{number}"
        cluster.admin.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
                            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"dra-{number}"}})
        kubeconfig = cluster.kubeconfig_with(cluster.pod_bound_token(name), node_root / f"{name}.kubeconfig")
        return DraNode(build_node(node_root, NodeSpec.parse(spec, numa_nodes=numa_nodes, switches=switches)),
                       name, f"dra-{number}", kubeconfig)
    return make


@pytest.fixture
def kubelet_factory(node_root, cluster) -> Iterator[Callable[[DraNode], DraKubelet]]:
    started: list[DraKubelet] = []

    def start(dra_node: DraNode) -> DraKubelet:
        kubelet = DraKubelet(_binary(), node_root / f"kubelet-{len(started)}.log", cluster.server.admin_kubeconfig,
                             dra_node.name, dra_node.registry, node_root / "kubelet-state")
        started.append(kubelet)
        return kubelet.start()

    yield start
    for kubelet in started:
        kubelet.close()


@pytest.fixture
def start_stack(node_root, cluster, kubelet_factory) -> Iterator[Callable[..., StackProcess]]:
    """`rbln-device-plugin run` in DRA mode on the node, as the chart's service account."""
    stacks: list[StackProcess] = []

    def start(dra_node: DraNode, **env: str) -> StackProcess:
        stack = StackProcess({**os.environ, **dra_node.env(cluster), **env})
        stacks.append(stack.start())
        return stack

    yield start
    # Depending on kubelet_factory, this ends before the kubelets do: the stack's shutdown is on record.
    for index, stack in enumerate(stacks):
        stack.stop()
        (node_root / f"stack-{index}.stderr").write_text("\n".join(stack.stderr_lines))


@dataclasses.dataclass(frozen=True)
class Serving:
    dra_node: DraNode
    kubelet: DraKubelet
    stack: StackProcess

    @property
    def node(self) -> SimulatedNode:
        return self.dra_node.node

    @property
    def namespace(self) -> str:
        return self.dra_node.namespace


@pytest.fixture
def serve(make_node, kubelet_factory, start_stack) -> Callable[..., Serving]:
    """A node, its kubelet and the stack, once the kubelet has the driver registered and the node's slices
    list `devices` (every published device name)."""
    def serve(spec: str, devices: set[str], numa_nodes: int = 1, switches: int = 2, **env: str) -> Serving:
        dra_node = make_node(spec, numa_nodes=numa_nodes, switches=switches)
        kubelet = kubelet_factory(dra_node)
        stack = start_stack(dra_node, **env)
        wait_until(kubelet.registered, 30, f"{DRIVER} registered with the kubelet")
        wait_until(lambda: set(kubelet.published_devices()) == devices, 30,
                   f"the slices of {dra_node.name} list {sorted(devices)}")
        return Serving(dra_node, kubelet, stack)
    return serve
