"""The kubelet simulator's PodResources API (v1: List, GetAllocatableResources, Get): which container holds
which device, with the NUMA nodes the plugin advertised for it, as a real kubelet reports them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import grpc

from shared.kubelet.podresources.v1 import api_pb2 as podresources_pb2
from shared.kubelet.podresources.v1 import api_pb2_grpc as podresources_pb2_grpc

NumaNodes = Callable[[str, str], Sequence[int]]
"""(resource, device ID) -> the NUMA nodes the plugin advertised for the device, none when unknown."""


@dataclasses.dataclass(frozen=True)
class Assignment:
    """Devices of one resource that a pod's container holds, as the PodResources API reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]

def reassign(assignments: Iterable[Assignment], resource: str, new: list[Assignment]) -> list[Assignment]:
    """`new` get their devices, which earlier holders lose (the kubelet never hands out a device in use, so
    the earlier pod ended)."""
    taken = {device for assignment in new for device in assignment.device_ids}
    kept = []
    for assignment in assignments:
        if assignment.resource == resource:
            assignment = dataclasses.replace(assignment, device_ids=tuple(
                d for d in assignment.device_ids if d not in taken))
        if assignment.device_ids:
            kept.append(assignment)
    return kept + new


def topology(numa_nodes: NumaNodes, resource: str, device_ids: Iterable[str]) -> podresources_pb2.TopologyInfo:
    nodes = sorted({node for device in device_ids for node in numa_nodes(resource, device)})
    return podresources_pb2.TopologyInfo(nodes=[podresources_pb2.NUMANode(ID=node) for node in nodes])


def pod_resources(assignments: Iterable[Assignment], numa_nodes: NumaNodes) -> list[podresources_pb2.PodResources]:
    pods: dict[tuple[str, str], podresources_pb2.PodResources] = {}
    containers: dict[tuple[str, str, str], podresources_pb2.ContainerResources] = {}
    for a in assignments:
        pod = pods.setdefault((a.namespace, a.pod), podresources_pb2.PodResources(name=a.pod, namespace=a.namespace))
        key = (a.namespace, a.pod, a.container)
        if key not in containers:
            containers[key] = pod.containers.add(name=a.container)
        containers[key].devices.add(resource_name=a.resource, device_ids=a.device_ids,
                                    topology=topology(numa_nodes, a.resource, a.device_ids))
    return list(pods.values())


def allocatable(healthy: Iterable[tuple[str, str]], numa_nodes: NumaNodes) -> list[podresources_pb2.ContainerDevices]:
    """The healthy (resource, device ID)s, as GetAllocatableResources lists them."""
    return [podresources_pb2.ContainerDevices(resource_name=resource, device_ids=[device],
                                              topology=topology(numa_nodes, resource, [device]))
            for resource, device in healthy]


class PodResourcesService(podresources_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, pods: Callable[[], list[podresources_pb2.PodResources]],
                 devices: Callable[[], list[podresources_pb2.ContainerDevices]]):
        self._pods = pods
        self._devices = devices

    def List(self, request, context):
        return podresources_pb2.ListPodResourcesResponse(pod_resources=self._pods())

    def GetAllocatableResources(self, request, context):
        return podresources_pb2.AllocatableResourcesResponse(devices=self._devices())

    def Get(self, request, context):
        for pod in self._pods():
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return podresources_pb2.GetPodResourcesResponse(pod_resources=pod)
        # The kubelet's own answer for a pod it does not run.
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} not found in {request.pod_namespace}")
