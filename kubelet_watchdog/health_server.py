"""The gRPC health service (grpc.health.v1) the pod's probes call: `liveness`, `readiness`, and "" = liveness.

The port is reachable from any pod, so the service is built to stay answerable while hostile clients are
connected (docs/security.md):
- Only `Check` exists. It answers from a mapping that `set` replaces whole, so it takes no lock and does
  no I/O of its own; `Watch` (a stream the kubelet never uses) answers UNIMPLEMENTED without running any
  code of ours, so no reply can wait on a client that never lets it out.
- Every accepted call gets a thread of its own (the pool is as large as the number of calls admitted), so
  a call whose client never sends its request ties up one thread, never the queue behind it.
- Calls, streams per connection, connections, message and header sizes are capped, and connections are
  closed after a bounded age, which also ends any call still stuck in one.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent import futures

import grpc
from grpc_health.v1 import health_pb2

LIVENESS = "liveness"
READINESS = "readiness"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE = "grpc.health.v1.Health"

# Calls in progress at once; one more is refused with RESOURCE_EXHAUSTED. The kubelet makes two every 10 s.
MAX_CONCURRENT_CALLS = 16
MAX_CONNECTIONS = 64
# A request is a service name; a reply, one enum.
MAX_MESSAGE_BYTES = 1024
OPTIONS = (
    # No SO_REUSEPORT: a second health service on the port (another pod's, on the host network)
    # must fail to bind instead of silently answering half of the probes.
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_metadata_size", 8 * 1024),
    ("grpc.max_concurrent_streams", 4),
    ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS),
    ("grpc.server_handshake_timeout_ms", 5_000),
    # A probe's connection lives for one call; anything older is closed, stuck calls and all.
    ("grpc.max_connection_idle_ms", 10_000),
    ("grpc.max_connection_age_ms", 20_000),
    ("grpc.max_connection_age_grace_ms", 5_000),
)


def _statuses(live: bool, ready: bool) -> Mapping[str, int]:
    return {"": _SERVING if live else _NOT_SERVING,
            LIVENESS: _SERVING if live else _NOT_SERVING,
            READINESS: _SERVING if ready else _NOT_SERVING}


class HealthServer:
    def __init__(self, port: int):
        # Replaced whole by set(), never changed in place: Check reads it without a lock.
        self._statuses = _statuses(False, False)
        check = grpc.unary_unary_rpc_method_handler(
            self._check, request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=MAX_CONCURRENT_CALLS, thread_name_prefix="grpc-health"),
            handlers=[grpc.method_handlers_generic_handler(_SERVICE, {"Check": check})],
            options=OPTIONS, maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS)
        # The wildcard of both address families, as Go's ":port" listens.
        self.port = self._server.add_insecure_port(f"[::]:{port}")

    def _check(self, request: health_pb2.HealthCheckRequest,
               context: grpc.ServicerContext) -> health_pb2.HealthCheckResponse:
        status = self._statuses.get(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return health_pb2.HealthCheckResponse(status=status)

    def start(self) -> None:
        self._server.start()

    def set(self, live: bool, ready: bool) -> None:
        self._statuses = _statuses(live, ready)

    def stop(self) -> None:
        self._statuses = _statuses(False, False)
        self._server.stop(0.5).wait()
