"""The real stack under supervision, as its tests see it: every resource served,
device plugins restarted, the health service and `rbln-device-plugin status`."""

from __future__ import annotations

import subprocess
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.programs import WORKERS
from shared.resources import Resource
from shared.supervision.client import connect
from simulator.stack import ENTRYPOINT
from tests.support.waiting import wait_until

NPU, VF1, VF4 = (r.value for r in Resource)
# The chart's probes give the kubelet's Check this long (probes.*.timeoutSeconds).
PROBE_TIMEOUT = 5.0
# One device of every resource: every worker serves.
NODE = "1,1:vf1,1:vf4"
DEVICES = {NPU: {"rbln0"}, VF1: {"rbln1-0"}, VF4: {"rbln2-0", "rbln2-1", "rbln2-2", "rbln2-3"}}
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
RESTARTING = "Restarting device plugin for the new kubelet"
REGISTERED = "Registered device plugin with kubelet"


def registrations(kubelet) -> dict[str, int]:
    return {name: view.registrations for name, view in kubelet.resources().items()}


def await_serving(kubelet, since: dict[str, int] | None = None, timeout: float = 30.0) -> None:
    """Every resource connected with all its devices, each registered more often than in `since`."""
    since = since or {}

    def serving(k):
        views = k.resources()
        return all(name in views and views[name].connected and views[name].updates > 0
                   and set(views[name].devices) == ids and views[name].registrations > since.get(name, 0)
                   for name, ids in DEVICES.items())
    kubelet.wait_for(serving, timeout, "every resource served")


def await_restarted_plugins(stack, restarts: int, timeout: float = 30.0) -> None:
    """Each worker restarted its device plugin `restarts` times (the watchdog's orders at kubelet restarts),
    and its latest instance has registered."""
    for worker in WORKERS:
        stack.wait_for_record(RESTARTING, count=restarts, process=worker, timeout=timeout)

    def registered_last():
        return all([r["msg"] for r in stack.find(process=worker) if r["msg"] in (RESTARTING, REGISTERED)][-1]
                   == REGISTERED for worker in WORKERS)
    wait_until(registered_last, timeout, "the restarted device plugins to register")


def program_info(node) -> dict[str, dict]:
    return connect(node.run_dir).programs()


def health(port: int, service: str, timeout: float = PROBE_TIMEOUT):
    """One probe as the kubelet makes it (a new connection, one Check with the probe's deadline): a serving
    status, or the gRPC status code of an error."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=timeout).status
        except grpc.RpcError as exc:
            return exc.code()


def await_health(port: int, timeout: float = 15, **expected) -> None:
    """Wait until each service (`liveness=`, `readiness=`, `default=` for "") answers as expected."""
    names = {"default": ""}
    wait_until(lambda: all(health(port, names.get(service, service)) == answer
                           for service, answer in expected.items()), timeout, f"health answers {expected}")


def status_command(stack_env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`rbln-device-plugin status` as an operator runs it in the pod: same environment, separate process."""
    return subprocess.run([sys.executable, "-c", ENTRYPOINT, "status", *args], env=stack_env,
                          capture_output=True, text=True, timeout=30)
