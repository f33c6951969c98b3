"""Fixtures of the conformance scenarios: a simulated node, the kubelet's own device manager (the Go
harness, in a mount namespace of its own) and the real stack, run inside that namespace.

These scenarios need root (a mount namespace each) and the built harness: tests/conformance/run.sh
builds it and runs them with this directory's pytest.ini. The project's default test run leaves
this directory out (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable, Iterator

import pytest

from simulator.node import SimulatedNode
from simulator.stack import RUN_COMMAND, StackProcess
from tests.conformance.kubelet_harness import PLUGIN_DIR, KubeletHarness
from tests.support.fixtures import make_node  # noqa: F401
from tests.support.kept_on_failure import (  # noqa: F401
    pytest_runtest_makereport,
    pytest_terminal_summary,
    scenario_dir,
    start_keeping,
)

HARNESS_BINARY = "KUBELET_HARNESS"
SCAN_INTERVAL = "500ms"


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(HARNESS_BINARY):
        raise pytest.UsageError(f"{HARNESS_BINARY} is not set: run the conformance scenarios with "
                                "tests/conformance/run.sh, which builds the kubelet harness")
    start_keeping(config)


@pytest.fixture
def node_root(request: pytest.FixtureRequest) -> Iterator[pathlib.Path]:
    """The node's directory; it holds the stack's logs and the harness's, and is kept when the scenario fails."""
    with scenario_dir(request, "rbln-cf-") as root:
        yield root


@pytest.fixture
def kubelet_factory(node_root) -> Iterator[Callable[..., KubeletHarness]]:
    started: list[KubeletHarness] = []

    def start(numa_nodes: int = 1) -> KubeletHarness:
        harness = KubeletHarness(pathlib.Path(os.environ[HARNESS_BINARY]), node_root / "kubelet.log")
        started.append(harness)
        return harness.start(numa_nodes=numa_nodes)

    yield start
    for harness in started:
        harness.close()


@pytest.fixture
def start_stack(node_root, kubelet_factory) -> Iterator[Callable[..., StackProcess]]:
    """`rbln-device-plugin run` in the kubelet's namespace, serving its plugin directory; debug records
    show the per-request flow (each scan, each preferred allocation)."""
    stacks: list[StackProcess] = []

    def start(node: SimulatedNode, kubelet: KubeletHarness, scan_interval: str = SCAN_INTERVAL) -> StackProcess:
        environ = {**os.environ, **node.env(scan_interval), "KUBELET_DEVICE_PLUGIN_PATH": PLUGIN_DIR,
                   "RBLN_DEVICE_PLUGIN_LOG_LEVEL": "debug"}
        stack = StackProcess(environ, command=[*kubelet.enter_namespace(), *RUN_COMMAND])
        stacks.append(stack.start())
        return stack

    yield start
    # Depending on kubelet_factory, this ends before the kubelet does: the stack's shutdown is on record.
    for stack in stacks:
        stack.stop()
        (node_root / "stack.stderr").write_text("\n".join(stack.stderr_lines))


@dataclasses.dataclass(frozen=True)
class Serving:
    node: SimulatedNode
    kubelet: KubeletHarness
    stack: StackProcess


@pytest.fixture
def serve(make_node, kubelet_factory, start_stack) -> Callable[..., Serving]:  # noqa: F811 (the fixture)
    """A node, a kubelet that knows its NUMA nodes and the stack, once each resource of `counts` is
    registered with that many devices, all healthy."""
    def serve(spec: str, counts: dict[str, int], numa_nodes: int = 1, switches: int = 2,
              scan_interval: str = SCAN_INTERVAL) -> Serving:
        node = make_node(spec, numa_nodes=numa_nodes, switches=switches)
        kubelet = kubelet_factory(numa_nodes=numa_nodes)
        stack = start_stack(node, kubelet, scan_interval=scan_interval)
        kubelet.wait_for_counts(counts, timeout=30)
        return Serving(node, kubelet, stack)
    return serve
