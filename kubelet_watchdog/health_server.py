"""The gRPC health service (grpc.health.v1) the pod's probes call: `liveness`, `readiness`, and "" = liveness.

The port is reachable from any pod, so the service is built to stay answerable while hostile clients are
connected (docs/security.md#the-ports):
- Only `Check` exists. It answers from a mapping that `set` replaces whole, so it takes no lock and does
  no I/O of its own; `Watch` (a stream the kubelet never uses) answers UNIMPLEMENTED without running any
  code of ours, so no reply can wait on a client that never lets it out.
- gRPC's asyncio server answers it on the watchdog's serving loop: a call whose request never comes is a
  suspended coroutine, not a thread or a call slot; there is no cap on calls to fill.
- The TCP port is a front of that loop (serving_loop.py) that relays each connection to the gRPC server on
  a unix socket in the private run dir: gRPC can refuse connections past a number but never close an old
  one for a new one, nor end a connection at a deadline whatever it does. The front does both, so a
  connection, with every stream in it, lasts `CONNECTION_DEADLINE` at most, and a full port makes room for
  the newest. The relay to gRPC is opened only when the client sends its first byte: a silent
  connection costs one descriptor.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Mapping

import grpc
from grpc_health.v1 import health_pb2

from kubelet_watchdog.serving_loop import (
    ConnectionTable,
    GuardedConnection,
    ServingLoop,
    listening_socket,
    serve,
    shared_loop,
)

LIVENESS = "liveness"
READINESS = "readiness"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE = "grpc.health.v1.Health"

# The gRPC server's unix socket, in the private run dir.
HEALTH_BACKEND_SOCKET = "health.sock"
# A probe is one call on a connection of its own, answered in a millisecond; the chart gives it 5 s.
CONNECTION_DEADLINE = 5.0
# Connections held at once; each one past it closes the least recently active.
MAX_CONNECTIONS = 2048
# A relayed connection holds three descriptors of this process: the client's, the relay's and, gRPC
# serving in this process, gRPC's end of the relay.
_DESCRIPTORS_PER_CONNECTION = 3
# What a client may send before the relay to gRPC is up (its preface and first frames are far less).
_MAX_EARLY_BYTES = 64 * 1024
# A request is a service name; a reply, one enum.
MAX_MESSAGE_BYTES = 1024
OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_metadata_size", 8 * 1024),
    ("grpc.max_concurrent_streams", 4),
    # The front ends every connection at its deadline; these only bound what gRPC would keep by itself.
    ("grpc.server_handshake_timeout_ms", int(CONNECTION_DEADLINE * 1000)),
    ("grpc.max_connection_age_ms", int(CONNECTION_DEADLINE * 1000)),
    ("grpc.max_connection_age_grace_ms", 1_000),
)


def _statuses(live: bool, ready: bool) -> Mapping[str, int]:
    return {"": _SERVING if live else _NOT_SERVING,
            LIVENESS: _SERVING if live else _NOT_SERVING,
            READINESS: _SERVING if ready else _NOT_SERVING}


class _Relay(asyncio.Protocol):
    """The gRPC side of one client connection: what gRPC sends goes to the client."""

    def __init__(self, client: _Front):
        self._client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._client.send(data)

    def pause_writing(self) -> None:
        self._client.pause_reading()

    def resume_writing(self) -> None:
        self._client.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.close()


class _Front(GuardedConnection):
    """One client connection of the TCP port, relayed to the gRPC server's unix socket."""

    def __init__(self, table: ConnectionTable, backend: pathlib.Path):
        super().__init__(table, CONNECTION_DEADLINE)
        self._backend = backend
        self._relay: _Relay | None = None
        self._early: list[bytes] | None = None
        self._early_bytes = 0
        self._closed = False

    def received(self, data: bytes) -> None:
        if self._relay is not None and self._relay.transport is not None:
            self._relay.transport.write(data)
            return
        if self._early is None:
            self._early = []
            asyncio.get_running_loop().create_task(self._connect())
        self._early.append(data)
        self._early_bytes += len(data)
        if self._early_bytes > _MAX_EARLY_BYTES:
            self.close()

    async def _connect(self) -> None:
        try:
            _, relay = await asyncio.get_running_loop().create_unix_connection(lambda: _Relay(self),
                                                                               str(self._backend))
        except OSError:
            self.close()
            return
        assert relay.transport is not None
        if self._closed:
            relay.transport.close()
            return
        self._relay = relay
        relay.transport.write(b"".join(self._early or ()))
        self._early = None

    def send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        # The client reads slower than gRPC answers: gRPC waits, within the connection's deadline.
        if self._relay is not None and self._relay.transport is not None:
            self._relay.transport.pause_reading()

    def resume_writing(self) -> None:
        if self._relay is not None and self._relay.transport is not None:
            self._relay.transport.resume_reading()

    def lost(self) -> None:
        self._closed = True
        if self._relay is not None and self._relay.transport is not None:
            self._relay.transport.abort()


class HealthServer:
    """The service on TCP `port` (0: a free one, see `.port`), gRPC itself on the unix socket `backend`."""

    def __init__(self, port: int, backend: pathlib.Path, loop: ServingLoop | None = None):
        # Replaced whole by set(), never changed in place: Check reads it without a lock.
        self._statuses = _statuses(False, False)
        self._backend = backend
        self._loop = loop or shared_loop()
        self._grpc: grpc.aio.Server | None = None
        self._listener: asyncio.Server | None = None
        # The socket first: a port that cannot be bound raises here, as the endpoint expects, with no
        # descriptors claimed.
        self._socket = listening_socket(port)
        self.port = self._socket.getsockname()[1]
        self.table = ConnectionTable("health", MAX_CONNECTIONS, _DESCRIPTORS_PER_CONNECTION)

    async def _check(self, request: health_pb2.HealthCheckRequest,
                     context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        status = self._statuses.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return health_pb2.HealthCheckResponse(status=status)

    async def _start(self) -> None:
        check = grpc.unary_unary_rpc_method_handler(
            self._check, request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString)
        server = grpc.aio.server(handlers=[grpc.method_handlers_generic_handler(_SERVICE, {"Check": check})],
                                 options=OPTIONS)
        self._backend.unlink(missing_ok=True)
        server.add_insecure_port(f"unix:{self._backend}")
        await server.start()
        self._backend.chmod(0o600)  # as every socket of the private run dir
        self._grpc = server
        self._listener = await serve(lambda: _Front(self.table, self._backend), self._socket)

    def start(self) -> None:
        self._loop.call(self._start())

    def set(self, live: bool, ready: bool) -> None:
        self._statuses = _statuses(live, ready)

    async def _stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._grpc is not None:
            await self._grpc.stop(0.5)

    def stop(self) -> None:
        self._statuses = _statuses(False, False)
        self._loop.call(self._stop())
        self._socket.close()
        self._backend.unlink(missing_ok=True)
        self.table.release()
