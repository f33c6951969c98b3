"""The gRPC health service (grpc.health.v1) the pod's probes call: `liveness`, `readiness`, and "" = liveness.

gRPC over HTTP/2 is spoken here by the `h2` protocol library on the watchdog's serving loop, without the
gRPC runtime: for one call whose answer is a constant, gRPC's core would keep five threads of its own that
wake every second (27 ms of CPU a minute, a quarter of the idle stack's budget) and 21 MiB resident
(measured on an idle 8-NPU stack, 1.85). The kubelet's probe, and any gRPC client, sees a gRPC server.

The port is reachable from any pod, so the service is built to stay answerable while hostile clients are
connected (docs/security.md#the-ports):
- Only `Check` exists; any other method (`Watch` included, a stream the kubelet never uses) is answered
  UNIMPLEMENTED at once. `Check` answers from a mapping that `set` replaces whole: no lock, no I/O.
- A connection is a few objects of the serving loop (serving_loop.py): it lasts `CONNECTION_DEADLINE` at most,
  whatever it does, and a full port closes its least recently active connection for the newest.
- Each connection is held to a few streams at once and a bounded number in its life (a client resetting
  streams as fast as it can is closed), small messages and headers, and a bounded backlog of what it has not
  read: a client that makes the server write (PINGs, SETTINGS) without reading is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable, Mapping

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from kubelet_watchdog.health_wire import (
    FRAME_HEADER_BYTES,
    MalformedMessage,
    ServingStatus,
    frame,
    requested_service,
    status_response,
    unframe,
)
from kubelet_watchdog.serving_loop import (
    ConnectionTable,
    GuardedConnection,
    listening_socket,
    serve,
)
from shared.supervision.loop_thread import LoopThread, shared_loop

LIVENESS = "liveness"
READINESS = "readiness"
CHECK_PATH = b"/grpc.health.v1.Health/Check"
# A probe is one call on a connection of its own, answered in a millisecond; the chart gives it 5 s.
CONNECTION_DEADLINE = 5.0
# Connections held at once; each one past it closes the least recently active.
MAX_CONNECTIONS = 2048
# A request is a service name; a reply, one enum.
MAX_MESSAGE_BYTES = 1024
MAX_HEADER_LIST_BYTES = 8 * 1024
MAX_CONCURRENT_STREAMS = 4
# A probe opens one stream; a connection that opens this many in its life is resetting streams to keep the
# server busy (the HTTP/2 "rapid reset" attack): it is closed.
MAX_STREAMS_PER_CONNECTION = 64
_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
# What h2 raises for a send on a stream the client has reset meanwhile (in the same read as its request):
# there is no one left to answer.
_STREAM_GONE = (h2.exceptions.StreamClosedError, h2.exceptions.StreamIDTooLowError)


class GrpcStatus(enum.IntEnum):
    OK = 0
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13


Statuses = Mapping[str, ServingStatus]


def _statuses(live: bool, ready: bool) -> Statuses:
    def status(ok: bool) -> ServingStatus:
        return ServingStatus.SERVING if ok else ServingStatus.NOT_SERVING

    return {"": status(live), LIVENESS: status(live), READINESS: status(ready)}


def _is_grpc_call(headers: Mapping[bytes, bytes]) -> bool:
    return headers.get(b":method") == b"POST" and headers.get(b"content-type", b"").startswith(b"application/grpc")


class _HealthConnection(GuardedConnection):
    """One client connection: HTTP/2 by h2, each stream a Check answered from `statuses()`."""

    def __init__(self, table: ConnectionTable, statuses: Callable[[], Statuses]):
        super().__init__(table, CONNECTION_DEADLINE)
        self._statuses = statuses
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self._h2.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_BYTES})
        # Streams whose request is still coming in, and replies waiting for the client's flow-control window.
        self._requests: dict[int, bytearray] = {}
        self._replies: dict[int, bytes] = {}
        self._streams_opened = 0
        self._greeted = False
        self._finished = False

    def received(self, data: bytes) -> None:
        if self._finished:
            return
        if not self._greeted:  # the server's SETTINGS once the client speaks: a silent connection costs nothing
            self._h2.initiate_connection()
            self._greeted = True
        try:
            for event in self._h2.receive_data(data):
                self._handle(event)
                if self._finished:
                    return
        except h2.exceptions.ProtocolError as exc:  # h2's refusal of what the client sent: no way to go on
            self._finish(exc.error_code if isinstance(exc.error_code, int) else h2.errors.ErrorCodes.PROTOCOL_ERROR)
            return
        self._flush()

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event.stream_id, dict(event.headers or ()))
        elif isinstance(event, h2.events.DataReceived):
            self._data(event)
        elif isinstance(event, h2.events.StreamEnded):
            body = self._requests.pop(event.stream_id, None)
            if body is not None:
                self._answer(event.stream_id, bytes(body))
        elif isinstance(event, h2.events.StreamReset):
            self._requests.pop(event.stream_id, None)
            self._replies.pop(event.stream_id, None)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._send_replies()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._finish(None)

    def _request(self, stream_id: int, headers: dict[bytes, bytes]) -> None:
        self._streams_opened += 1
        if self._streams_opened > MAX_STREAMS_PER_CONNECTION:
            self._finish(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        elif not _is_grpc_call(headers):
            with contextlib.suppress(*_STREAM_GONE):
                self._h2.send_headers(stream_id, ((b":status", b"415"),), end_stream=True)
                self._reset(stream_id)
        elif headers.get(b":path") != CHECK_PATH:
            self._end(stream_id, GrpcStatus.UNIMPLEMENTED, "only grpc.health.v1.Health/Check is served")
        else:
            self._requests[stream_id] = bytearray()

    def _data(self, event: h2.events.DataReceived) -> None:
        # The window is given back whatever becomes of the bytes: the connection's stays open for other streams.
        self._h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
        body = self._requests.get(event.stream_id)
        if body is None:
            return
        body += event.data or b""
        if len(body) > FRAME_HEADER_BYTES + MAX_MESSAGE_BYTES:
            del self._requests[event.stream_id]
            self._end(event.stream_id, GrpcStatus.RESOURCE_EXHAUSTED,
                      f"the request is over {MAX_MESSAGE_BYTES} bytes")

    def _answer(self, stream_id: int, body: bytes) -> None:
        try:
            service = requested_service(unframe(body))
        except MalformedMessage as exc:
            self._end(stream_id, GrpcStatus.INTERNAL, str(exc))
            return
        status = self._statuses().get(service)
        if status is None:
            self._end(stream_id, GrpcStatus.NOT_FOUND, "unknown service")
            return
        with contextlib.suppress(*_STREAM_GONE):
            self._h2.send_headers(stream_id, _RESPONSE_HEADERS)
            self._replies[stream_id] = frame(status_response(status))
        self._send_replies()

    def _send_replies(self) -> None:
        """The replies the client's flow-control windows let out now, each with its trailers."""
        for stream_id, message in list(self._replies.items()):
            with contextlib.suppress(*_STREAM_GONE):
                if self._h2.local_flow_control_window(stream_id) < len(message):
                    continue
                self._h2.send_data(stream_id, message)
                self._h2.send_headers(stream_id, ((b"grpc-status", b"%d" % GrpcStatus.OK),), end_stream=True)
            del self._replies[stream_id]

    def _end(self, stream_id: int, status: GrpcStatus, message: str) -> None:
        """A reply of trailers only (a failed call); a request still coming in is cut short."""
        with contextlib.suppress(*_STREAM_GONE):
            self._h2.send_headers(stream_id, (*_RESPONSE_HEADERS, (b"grpc-status", b"%d" % status),
                                              (b"grpc-message", message.encode())), end_stream=True)
            self._reset(stream_id)

    def _reset(self, stream_id: int) -> None:
        with contextlib.suppress(*_STREAM_GONE):  # the client had ended its side too: the stream is closed
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    def _finish(self, error: int | None) -> None:
        """GOAWAY (with `error`, unless the client sent its own), what is queued, and the end."""
        self._finished = True
        if error is not None:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.close_connection(error)
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        # More than the transport's high-water mark (64 KiB) unread: replies are a few bytes, so this is a
        # client making the server write (PINGs, SETTINGS) without reading.
        self.close()


class HealthServer:
    """The service on TCP `port` (0: a free one, see `.port`), served by `loop`."""

    def __init__(self, port: int, loop: LoopThread | None = None):
        # Replaced whole by set(), never changed in place: the connections read it without a lock.
        self._statuses = _statuses(False, False)
        self._loop = loop or shared_loop()
        self._listener: asyncio.Server | None = None
        # The socket first: a port that cannot be bound raises here, as the endpoint expects, with no
        # descriptors claimed.
        self._socket = listening_socket(port)
        self.port = self._socket.getsockname()[1]
        self.table = ConnectionTable("health", MAX_CONNECTIONS)

    async def _start(self) -> None:
        self._listener = await serve(lambda: _HealthConnection(self.table, lambda: self._statuses), self._socket)

    def start(self) -> None:
        self._loop.call(self._start())

    def set(self, live: bool, ready: bool) -> None:
        self._statuses = _statuses(live, ready)

    async def _stop(self) -> None:
        if self._listener is not None:
            self._listener.close()

    def stop(self) -> None:
        self._statuses = _statuses(False, False)
        self._loop.call(self._stop())
        self._socket.close()
        self.table.release()
