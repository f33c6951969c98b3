"""Which container holds which device, from the kubelet's PodResources API (v1 List).

`rbln-device-plugin status` asks it. The answer is a courtesy to the operator, never a condition: a missing
socket, a kubelet that does not answer within the timeout or an error all come back as
PodResourcesUnavailable with the reason, and the caller shows the holders as unknown.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterable
from typing import Any

# The whole call, connection included; a kubelet answers List within milliseconds.
TIMEOUT_SECONDS = 2.0


class PodResourcesUnavailable(RuntimeError):
    """The kubelet's PodResources API could not be asked; the message says why."""


@dataclasses.dataclass(frozen=True, order=True)
class Holder:
    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


DeviceKey = tuple[str, str]
"""(resource name, device ID)."""


def holders_from(response: Any, resources: Iterable[str]) -> dict[DeviceKey, list[Holder]]:
    """The containers of a ListPodResourcesResponse holding each device of `resources`."""
    wanted = set(resources)
    holders: dict[DeviceKey, list[Holder]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name not in wanted:
                    continue
                for device_id in devices.device_ids:
                    found = holders.setdefault((devices.resource_name, device_id), [])
                    holder = Holder(pod.namespace, pod.name, container.name)
                    if holder not in found:
                        found.append(holder)
    return {key: sorted(found) for key, found in holders.items()}


def device_holders(socket: pathlib.Path, resources: Iterable[str],
                   timeout: float = TIMEOUT_SECONDS) -> dict[DeviceKey, list[Holder]]:
    """Ask the kubelet on `socket` which containers hold the devices of `resources`."""
    if not socket.exists():
        raise PodResourcesUnavailable(f"no socket at {socket}")
    import grpc

    from shared.kubelet.podresources.v1 import api_pb2, api_pb2_grpc

    channel = grpc.insecure_channel(f"unix://{socket}")
    try:
        response = api_pb2_grpc.PodResourcesListerStub(channel).List(api_pb2.ListPodResourcesRequest(),
                                                                     timeout=timeout)
    except grpc.RpcError as exc:
        raise PodResourcesUnavailable(f"{socket}: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()
    return holders_from(response, resources)
