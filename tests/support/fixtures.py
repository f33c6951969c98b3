"""The fixtures the suites share: a short temporary directory, and the real stack (supervisord and all its
programs) on a simulated node, seen through the kubelet simulator over real unix sockets. A suite's
conftest imports the ones it uses (a suite may define its own node_root, which make_node then builds in)."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

from simulator.kubelet import KubeletSimulator
from simulator.node import SimulatedNode, build_node
from simulator.spec import NodeSpec
from simulator.stack import StackProcess

SCAN_INTERVAL = "200ms"


@pytest.fixture
def node_root() -> Iterator[pathlib.Path]:
    root = pathlib.Path(tempfile.mkdtemp(prefix="rbln-it-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_node(node_root) -> Callable[..., SimulatedNode]:
    def make(spec: str | NodeSpec = "2", numa_nodes: int = 1, switches: int = 2) -> SimulatedNode:
        if isinstance(spec, str):
            spec = NodeSpec.parse(spec, numa_nodes=numa_nodes, switches=switches)
        return build_node(node_root, spec)
    return make


@pytest.fixture
def kubelet(node_root) -> Iterator[KubeletSimulator]:
    (node_root / "device-plugins").mkdir(exist_ok=True)
    simulator = KubeletSimulator(node_root / "device-plugins")
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture
def start_stack() -> Iterator[Callable[..., StackProcess]]:
    """Start `rbln-device-plugin run` on a node; every stack is stopped (and checked to stop) at teardown."""
    stacks: list[StackProcess] = []

    def start(node: SimulatedNode, scan_interval: str = SCAN_INTERVAL, **env: str) -> StackProcess:
        stack = StackProcess({**os.environ, **node.env(scan_interval), **env})
        stacks.append(stack.start())
        return stack

    yield start
    for stack in stacks:
        stack.stop()


@pytest.fixture
def short_tmp():
    """A short temporary directory: unix socket paths must stay under ~107 characters."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="rbln-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
