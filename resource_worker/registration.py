"""Registering a resource's socket with the kubelet, without blocking the worker's lifecycle loop."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import grpc

from resource_worker.lifecycle import RegistrationError
from shared.kubelet.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

API_VERSION = "v1beta1"
# The kubelet dials back within Register with a 10 s timeout; leave it room.
REGISTER_TIMEOUT = 15.0


class Registration:
    """One Register call in flight. `on_done` is called, from a gRPC thread, once it has an outcome.

    The call fails at once when nothing accepts connections on the kubelet socket
    (a kubelet that is stopping or starting): the worker retries with its own
    backoff and stays free to notice shutdown or a lost socket meanwhile.
    """

    def __init__(self, kubelet_socket: pathlib.Path, endpoint: str, resource_name: str,
                 options: api_pb2.DevicePluginOptions, on_done: Callable[[], None],
                 timeout: float = REGISTER_TIMEOUT):
        request = api_pb2.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource_name,
                                          options=options)
        self._channel = grpc.insecure_channel(f"unix://{kubelet_socket}")
        self._call = api_pb2_grpc.RegistrationStub(self._channel).Register.future(request, timeout=timeout)
        self._call.add_done_callback(lambda _call: on_done())

    def done(self) -> bool:
        return self._call.done()

    def result(self) -> None:
        """The outcome of a call that is done: returns when the kubelet accepted, else RegistrationError."""
        try:
            self._call.result(timeout=0)
        except grpc.RpcError as exc:
            raise RegistrationError(f"{exc.code().name}: {exc.details()}") from None
        finally:
            self._channel.close()

    def cancel(self) -> None:
        self._call.cancel()
        self._channel.close()
