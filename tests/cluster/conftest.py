"""Fixtures of the cluster scenarios: one cluster for the session (tests/cluster/cluster.py) on a simulated
node, and per mode the chart installed as the README says.

A mode's scenarios are one module (test_device_plugin.py, test_dra.py): its MODE_VALUES are the values that
choose the mode, and its scenarios run in file order on one release, installed by the first that asks for
`release` and uninstalled by the module's last scenario (or at its end). A new scenario of a mode is a
function in that module, placed where the release is in the state it needs; a scenario that needs the
release installed differently is a module of its own with its own MODE_VALUES.

tests/cluster/run.sh builds the parts and runs these in private namespaces; the project's default test run
leaves this directory out (tests/support/suites.py).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time
from collections.abc import Iterator

import pytest

from simulator.node import SimulatedNode, build_node
from simulator.spec import NodeSpec
from tests.cluster.cluster import Cluster, Stopwatch
from tests.cluster.scenarios import (
    CDI_ROOT,
    IMAGE_PYTHON,
    NODE_SPEC,
    READY_TIMEOUT,
    RSD_GROUPS,
    TOOLKIT_SPEC,
    TOOLKIT_SPEC_FILE,
    WORKLOAD_NAMESPACE,
    Release,
    Session,
    start_to_ready,
    tools,
)
from tests.support.deploy import project_version
from tests.support.waiting import wait_until

_stopwatch = Stopwatch()


def _env_path(name: str) -> pathlib.Path:
    value = os.environ.get(name)
    if not value:
        raise pytest.UsageError(f"{name} is not set: run the cluster scenarios with tests/cluster/run.sh")
    return pathlib.Path(value)


def _device_nodes(node: SimulatedNode) -> None:
    """The simulated NPUs as character devices in the namespace's /dev, where containerd and runc look for
    the host paths the stack hands out (the stack itself looks in the node's dev dir, regular files)."""
    for name in ["rsd0", *node.devices(), *(f"rsd{g}" for g in range(1, RSD_GROUPS + 1))]:
        os.mknod(f"/dev/{name}", 0o666 | 0o020000, os.makedev(1, 3))


@pytest.fixture(scope="session")
def session() -> Iterator[Session]:
    work = _env_path("CLUSTER_WORK")
    runc = work / "bin" / "runc"
    runc.parent.mkdir(exist_ok=True)
    shutil.copy(pathlib.Path(__file__).with_name("runc_oom_clamp.py"), runc.with_name("runc-oom-clamp"))
    cluster = Cluster(work, _env_path("CLUSTER_HARNESS"), _env_path("CONTAINERD_BIN"),
                      runc.with_name("runc-oom-clamp"), pathlib.Path("/usr/lib/cni"), tools.kubectl())
    start = time.monotonic()
    try:
        cluster.start_runtime()
        for archive in os.environ["IMAGE_ARCHIVES"].split():
            cluster.import_image(pathlib.Path(archive))
        cluster.start()
        _stopwatch.since("cluster up (certificates, control plane, containerd, images, node Ready)", start)
        node = build_node(work / "node", NodeSpec.parse(NODE_SPEC, switches=1), smi_python=IMAGE_PYTHON)
        _device_nodes(node)
        CDI_ROOT.mkdir(parents=True, exist_ok=True)
        (CDI_ROOT / TOOLKIT_SPEC_FILE).write_bytes(TOOLKIT_SPEC)
        yield Session(cluster, node, _stopwatch, project_version())
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def release(request: pytest.FixtureRequest, session: Session, tmp_path_factory) -> Iterator[Release]:
    mode = request.module.MODE
    installed = Release(session, request.module.MODE_VALUES, tmp_path_factory.mktemp(mode))
    start = time.monotonic()
    installed.upgrade_install(session.image_tag)
    pod = installed.ready_pod()
    session.stopwatch.since(f"helm install -> DaemonSet pod Ready ({mode})", start)
    session.stopwatch.record(f"plugin container start -> pod Ready, whole seconds ({mode})", start_to_ready(pod))
    yield installed
    for workload in session.cluster.pods(WORKLOAD_NAMESPACE):
        session.cluster.kubectl("delete", "pod", "-n", WORKLOAD_NAMESPACE, workload["metadata"]["name"],
                                "--grace-period=0", "--force", check=False)
    if installed.installed:
        installed.uninstall()
        wait_until(lambda: not installed.pods(), READY_TIMEOUT, "the release's pods gone")


def pytest_terminal_summary(terminalreporter) -> None:
    if _stopwatch.seconds:
        terminalreporter.section("timings")
        for line in _stopwatch.lines():
            terminalreporter.write_line(line)
