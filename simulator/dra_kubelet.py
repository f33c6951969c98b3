"""The kubelet's side of a DRA plugin, as far as the DRA demo needs it: registration through the plugin
registry dir (GetInfo, NotifyRegistrationStatus), NodePrepareResources, and the device health stream, all over
the plugin's real unix sockets. The real kubelet's DRA manager is exercised in tests/dra."""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from shared.dra.v1 import api_pb2 as dra_pb2
from shared.dra.v1 import api_pb2_grpc as dra_grpc
from shared.dra_health.v1 import api_pb2 as health_pb2
from shared.dra_health.v1 import api_pb2_grpc as health_grpc
from shared.pluginregistration.v1 import api_pb2 as registration_pb2
from shared.pluginregistration.v1 import api_pb2_grpc as registration_grpc

_POLL = 0.1
Health = dict[str, tuple[str, str]]
"""Device name -> (HEALTHY / UNHEALTHY / UNKNOWN, message), as the last health message said."""


class DraKubeletStandIn:
    def __init__(self, registry: pathlib.Path, call_timeout: float = 45.0):
        self._registry = registry
        self._call_timeout = call_timeout
        self.info: Any = None
        self._channel: grpc.Channel | None = None
        self._health_call: Any = None
        # Guards _health; notified on every health message.
        self._health_changed = threading.Condition()
        self._health: Health = {}

    def register(self, driver: str, timeout: float) -> Any:
        """Find the driver's registration socket, take its GetInfo and accept it; the PluginInfo."""
        deadline = time.monotonic() + timeout
        while not (sockets := sorted(self._registry.glob(f"{driver}*-reg.sock"))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no registration socket of {driver} in {self._registry} within {timeout:.0f}s")
            time.sleep(_POLL)
        with grpc.insecure_channel(f"unix://{sockets[0]}") as channel:
            stub = registration_grpc.RegistrationStub(channel)
            self.info = stub.GetInfo(registration_pb2.InfoRequest(), timeout=timeout, wait_for_ready=True)
            stub.NotifyRegistrationStatus(registration_pb2.RegistrationStatus(plugin_registered=True),
                                          timeout=timeout)
        self._channel = grpc.insecure_channel(f"unix://{self.info.endpoint}")
        return self.info

    def prepare(self, namespace: str, uid: str, name: str) -> Any:
        """NodePrepareResources for one claim; its answer."""
        assert self._channel is not None, "register first"
        request = dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(namespace=namespace, uid=uid, name=name)])
        return dra_grpc.DRAPluginStub(self._channel).NodePrepareResources(request, timeout=self._call_timeout)\
            .claims[uid]

    def watch_health(self) -> None:
        """Open NodeWatchResources (v1) and keep the newest message, on a thread of its own."""
        assert self._channel is not None, "register first"
        self._health_call = health_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest())
        threading.Thread(target=self._read_health, name="health-stream", daemon=True).start()

    def _read_health(self) -> None:
        try:
            for message in self._health_call:
                health = {d.device.device_name: (health_pb2.HealthStatus.Name(d.health), d.message)
                          for d in message.devices}
                with self._health_changed:
                    self._health = health
                    self._health_changed.notify_all()
        except grpc.RpcError:
            pass  # cancelled at close, or the plugin went: the last message stays what is known

    def wait_health(self, expected: Callable[[Health], bool], timeout: float, what: str) -> Health:
        with self._health_changed:
            if not self._health_changed.wait_for(lambda: expected(self._health), timeout):
                raise TimeoutError(f"the health stream did not show {what} within {timeout:.0f}s")
            return dict(self._health)

    def close(self) -> None:
        if self._health_call is not None:
            self._health_call.cancel()
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> DraKubeletStandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
