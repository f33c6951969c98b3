"""Which container holds which device, from the kubelet's PodResources API: bounded, and never a failure."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from rbln_device_plugin.pod_resources_client import Holder, PodResourcesUnavailable, device_holders, holders_from
from shared.kubelet.podresources.v1 import api_pb2, api_pb2_grpc

NPU, VF4 = "rebellions.ai/npu", "rebellions.ai/npu-vf4"


def pod(namespace: str, name: str, *containers: tuple[str, list[tuple[str, list[str]]]]) -> api_pb2.PodResources:
    return api_pb2.PodResources(namespace=namespace, name=name, containers=[
        api_pb2.ContainerResources(name=container, devices=[
            api_pb2.ContainerDevices(resource_name=resource, device_ids=ids) for resource, ids in devices])
        for container, devices in containers])


RESPONSE = api_pb2.ListPodResourcesResponse(pod_resources=[
    pod("ml", "train-0", ("main", [(NPU, ["rbln0", "rbln1"]), ("nvidia.com/gpu", ["GPU-1"])]),
        ("init", [(NPU, ["rbln0"])])),
    pod("default", "infer", ("app", [(VF4, ["rbln2-1"])]), ("sidecar", [])),
    pod("default", "cpu-only"),
])


def test_holders_per_device_of_our_resources_only():
    holders = holders_from(RESPONSE, [NPU, VF4])
    assert holders == {
        (NPU, "rbln0"): [Holder("ml", "train-0", "init"), Holder("ml", "train-0", "main")],
        (NPU, "rbln1"): [Holder("ml", "train-0", "main")],
        (VF4, "rbln2-1"): [Holder("default", "infer", "app")],
    }
    assert str(holders[(VF4, "rbln2-1")][0]) == "default/infer/app"


class Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.released = threading.Event()

    def List(self, request, context):
        self.released.wait(self.delay)
        return RESPONSE


@pytest.fixture
def serve(short_tmp):
    servers = []

    def start(lister: Lister):
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(lister, server)
        server.add_insecure_port(f"unix://{short_tmp / 'kubelet.sock'}")
        server.start()
        servers.append((server, lister))
        return short_tmp / "kubelet.sock"

    yield start
    for server, lister in servers:
        lister.released.set()
        server.stop(None)


def test_asking_the_kubelet_over_its_socket(serve):
    assert device_holders(serve(Lister()), [NPU])[(NPU, "rbln1")] == [Holder("ml", "train-0", "main")]


def test_a_missing_socket_is_unavailable_at_once(short_tmp):
    with pytest.raises(PodResourcesUnavailable, match="no socket at"):
        device_holders(short_tmp / "kubelet.sock", [NPU])


def test_a_socket_nobody_listens_on_is_unavailable(short_tmp):
    path = short_tmp / "kubelet.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))  # bound, never listening: what a kubelet that died leaves
    started = time.monotonic()
    with pytest.raises(PodResourcesUnavailable, match="UNAVAILABLE"):
        device_holders(path, [NPU], timeout=2.0)
    assert time.monotonic() - started < 2.5


def test_a_kubelet_that_does_not_answer_is_given_up_on_at_the_timeout(serve):
    path = serve(Lister(delay=30))
    started = time.monotonic()
    with pytest.raises(PodResourcesUnavailable, match="DEADLINE_EXCEEDED"):
        device_holders(path, [NPU], timeout=0.5)
    assert time.monotonic() - started < 2
