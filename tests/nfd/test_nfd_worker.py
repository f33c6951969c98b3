"""The node-label file the real stack writes, read by the real nfd-worker (one-shot, local source, not
publishing): exactly the expected labels, following the node, gone when the stack stops or the file expires."""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Iterator

import pytest

from scanner.feature_file import render
from simulator.node import SimulatedNode, build_node
from simulator.spec import NodeSpec
from simulator.stack import StackProcess
from tests.nfd.nfd_tools import worker_labels

UPDATED = "Node labels updated"
# `rbln-device-plugin simulate`'s node: 2 plain PFs, one in vf1 mode (1 VF), one in vf4 mode (4 VFs).
SIMULATE_NODE = "2,1:vf1,1:vf4"
EXPECTED = {
    "rebellions.ai/npu.present": "true",
    "rebellions.ai/npu.count": "7",
    "rebellions.ai/npu.family": "ATOM",
    "rebellions.ai/npu.product": "RBLN-CA25",
    "rebellions.ai/driver-version.full": "1.3.73",
    "rebellions.ai/driver-version.major": "1",
    "rebellions.ai/driver-version.minor": "3",
    "rebellions.ai/driver-version.patch": "73",
    "rebellions.ai/npu-vf1.count": "1",
    "rebellions.ai/npu-vf4.count": "4",
    "rebellions.ai/npu.healthy": "7",
}


@pytest.fixture
def node(short_tmp: pathlib.Path) -> SimulatedNode:
    return build_node(short_tmp / "node", NodeSpec.parse(SIMULATE_NODE, numa_nodes=2))


@pytest.fixture
def features(short_tmp: pathlib.Path) -> pathlib.Path:
    path = short_tmp / "features.d"
    path.mkdir()
    return path


@pytest.fixture
def stack(node: SimulatedNode, features: pathlib.Path) -> Iterator[StackProcess]:
    environ = {**os.environ, **node.env("200ms"), "NFD_FEATURE_FILE": str(features / "rbln-features")}
    with StackProcess(environ) as running:
        running.wait_for_record(UPDATED)
        yield running


def updated(stack: StackProcess, after: int) -> dict[str, str]:
    """Await the stack's next label change after the first `after`, and return what nfd-worker makes of it."""
    stack.wait_for_record(UPDATED, count=after + 1)
    return worker_labels(pathlib.Path(stack.find(UPDATED)[after]["path"]).parent)


def test_nfd_worker_reads_exactly_the_expected_labels_from_the_stacks_file(stack, features):
    labels = worker_labels(features)
    print("nfd-worker labels for the simulated node of `rbln-device-plugin simulate`:")
    for name, value in sorted(labels.items()):
        print(f"  {name}={value}")
    assert labels == EXPECTED


def test_the_labels_follow_health_devices_and_the_driver(stack, node, features):
    node.set_status("rbln0", 4)  # FAULT
    assert updated(stack, 1) == {**EXPECTED, "rebellions.ai/npu.healthy": "6"}
    node.set_status("rbln0", 0)  # recovered
    assert updated(stack, 2) == EXPECTED
    node.remove_device("rbln3-2")
    assert updated(stack, 3) == {**EXPECTED, "rebellions.ai/npu.count": "6", "rebellions.ai/npu-vf4.count": "3",
                                 "rebellions.ai/npu.healthy": "6"}
    node.restore_device("rbln3-2")
    assert updated(stack, 4) == EXPECTED
    node.set_driver_version("1.4.2-9f1c2e0")
    assert updated(stack, 5) == {**EXPECTED, "rebellions.ai/driver-version.full": "1.4.2",
                                 "rebellions.ai/driver-version.minor": "4", "rebellions.ai/driver-version.patch": "2"}


def test_the_labels_go_when_the_stack_stops(stack, features):
    assert worker_labels(features) == EXPECTED
    assert stack.stop() == 0
    assert os.listdir(features) == []
    assert worker_labels(features) == {}


def test_nfd_ignores_the_labels_of_an_expired_file(features):
    (features / "rbln-features").write_text(render(EXPECTED, time.time() + 600))
    assert worker_labels(features) == EXPECTED
    (features / "rbln-features").write_text(render(EXPECTED, time.time() - 1))
    assert worker_labels(features) == {}
