"""The gRPC health service (grpc.health.v1) the pod's probes call: `liveness`, `readiness`, and "" = liveness."""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

LIVENESS = "liveness"
READINESS = "readiness"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServer:
    def __init__(self, port: int):
        # Unknown service names get NOT_FOUND from the servicer itself.
        self._servicer = health.HealthServicer(experimental_non_blocking=True)
        # No SO_REUSEPORT: a second health service on the port (another pod's, on the host network)
        # must fail to bind instead of silently answering half of the probes.
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="grpc-health"),
                                   options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, self._server)
        # The wildcard of both address families, as Go's ":port" listens.
        self.port = self._server.add_insecure_port(f"[::]:{port}")
        self.set(live=False, ready=False)

    def start(self) -> None:
        self._server.start()

    def set(self, live: bool, ready: bool) -> None:
        self._servicer.set("", _SERVING if live else _NOT_SERVING)
        self._servicer.set(LIVENESS, _SERVING if live else _NOT_SERVING)
        self._servicer.set(READINESS, _SERVING if ready else _NOT_SERVING)

    def stop(self) -> None:
        self._servicer.enter_graceful_shutdown()
        self._server.stop(0.5).wait()
