"""Registering a resource's socket with the kubelet."""

from __future__ import annotations

import pathlib

import grpc

from shared.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

API_VERSION = "v1beta1"
# The kubelet dials back within Register with a 10 s timeout; leave it room.
REGISTER_TIMEOUT = 15.0


class RegistrationError(RuntimeError):
    pass


def register(kubelet_socket: pathlib.Path, endpoint: str, resource_name: str,
             options: api_pb2.DevicePluginOptions, timeout: float = REGISTER_TIMEOUT) -> None:
    request = api_pb2.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource_name,
                                      options=options)
    try:
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=timeout, wait_for_ready=True)
    except grpc.RpcError as exc:
        raise RegistrationError(f"{exc.code().name}: {exc.details()}") from None
