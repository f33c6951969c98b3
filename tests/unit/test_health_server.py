"""The health service in process: Check only, and a full port or a stuck connection never keeps a probe out."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
import threading
import time

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.registry import CollectorRegistry

from kubelet_watchdog import health_server, metrics_server, serving_loop
from kubelet_watchdog.health_server import HealthServer
from kubelet_watchdog.metrics_server import MetricsServer
from kubelet_watchdog.serving_loop import listening_socket
from shared.supervision.loop_thread import shared_loop
from tests.support.hostile_http2 import CHECK_WITHOUT_REQUEST, ZeroWindowConnection
from tests.support.waiting import wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def serve():
    servers = []

    def start() -> HealthServer:
        server = HealthServer(0)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def check(port: int, service: str = "liveness"):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=2).status
        except grpc.RpcError as exc:
            return exc.code()


def await_accepted(server: HealthServer, count: int) -> None:
    wait_until(lambda: len(server.table) >= count, 5, f"{count} connections accepted", poll=0.01)


def test_check_answers_the_state_it_was_given_and_watch_is_unimplemented(serve):
    server = serve()
    server.set(True, False)
    assert [check(server.port, name) for name in ("", "liveness", "readiness")] == [SERVING, SERVING, NOT_SERVING]
    assert check(server.port, "other") is grpc.StatusCode.NOT_FOUND
    with grpc.insecure_channel(f"[::1]:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as watched:
            next(health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="")))
    assert watched.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_a_full_port_closes_its_least_recently_active_connection_for_a_probe(serve, monkeypatch):
    monkeypatch.setattr(health_server, "MAX_CONNECTIONS", 4)
    server = serve()
    server.set(True, True)
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
    try:
        await_accepted(server, 4)
        assert check(server.port) == SERVING
        idle[0].settimeout(5)
        assert idle[0].recv(10) == b"", "the oldest idle connection was closed"
        assert server.table.evicted >= 1
    finally:
        for sock in idle:
            sock.close()


def test_streams_whose_request_never_comes_are_ended_with_their_connection(serve, monkeypatch):
    monkeypatch.setattr(health_server, "CONNECTION_DEADLINE", 0.5)
    server = serve()
    server.set(True, True)
    stuck = [ZeroWindowConnection(server.port, (CHECK_WITHOUT_REQUEST,) * 4) for _ in range(8)]
    try:
        for _ in range(3):
            assert check(server.port) == SERVING
        for connection in stuck:
            connection.sock.settimeout(5)
            while connection.sock.recv(65536):
                pass  # the server's SETTINGS, then the end of the connection at its deadline
    finally:
        for connection in stuck:
            connection.close()


def test_accepted_connections_send_at_once():
    """TCP_NODELAY on every accepted connection: a reply the front relays in two writes must not wait for
    the client's delayed ACK (40 ms at every probe's tail, measured)."""
    listener = listening_socket(0)

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        found: asyncio.Future[int] = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                found.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP,
                                                                               socket.TCP_NODELAY))

        server = await loop.create_server(Probe, sock=listener)
        with socket.create_connection(("127.0.0.1", listener.getsockname()[1])):
            value = await asyncio.wait_for(found, 5)
        server.close()
        return value

    assert asyncio.run(accepted_nodelay()) == 1


def test_a_burst_of_connections_waits_in_the_kernel_while_the_loop_is_busy(serve):
    """asyncio sets a served socket's backlog again (100 by default); at 4096, a thousand clients
    reconnecting at once never push a probe's SYN out of the queue."""
    server = serve()
    loop = shared_loop().loop
    busy = threading.Event()
    loop.call_soon_threadsafe(lambda: (busy.set(), time.sleep(1.5)))
    busy.wait(5)
    burst = []
    try:
        for _ in range(300):  # three times asyncio's default backlog, while nothing accepts
            burst.append(socket.create_connection(("127.0.0.1", server.port), timeout=1))
        await_accepted(server, 300)
    finally:
        for sock in burst:
            sock.close()


@pytest.fixture
def container_limit():
    """The soft descriptor limit a container commonly starts with (1024), the hard one left as it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_both_ports_full_fit_the_descriptor_limit_together_and_give_their_room_back(container_limit, serve):
    """Both ports full, with the process's own descriptors, must stay within the limit, or accepts fail with
    EMFILE (asyncio then stops accepting for a second) and so do the watchdog's own opens."""
    health = serve()
    metrics = MetricsServer(0, CollectorRegistry())
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert health.table.limit + metrics.table.limit + serving_loop._RESERVED_DESCRIPTORS <= soft
        if hard == resource.RLIM_INFINITY or hard >= health_server.MAX_CONNECTIONS + 2048:
            assert health.table.limit == health_server.MAX_CONNECTIONS  # the soft limit was raised for both
            assert metrics.table.limit == metrics_server.MAX_CONNECTIONS
    finally:
        metrics.stop()
    health.stop()
    assert serve().table.limit == health.table.limit, "the stopped servers gave their room back"


class RawClient:
    """An HTTP/2 client on a plain socket (h2 frames it), for what no gRPC client sends."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.sock.sendall(self.h2.data_to_send())

    def call(self, path: str, body: bytes | None, content_type: str = "application/grpc", send: bool = True) -> int:
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                      (":authority", "health"), ("content-type", content_type), ("te", "trailers")],
                             end_stream=body is None)
        if body is not None:
            self.h2.send_data(stream, body, end_stream=True)
        if send:
            self.sock.sendall(self.h2.data_to_send())
        return stream

    def answers(self, stream: int) -> dict[bytes, bytes]:
        """The headers and trailers the server ended `stream` with."""
        found: dict[bytes, bytes] = {}
        while True:
            data = self.sock.recv(65536)
            assert data, "the server closed the connection"
            for event in self.h2.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)) \
                        and event.stream_id == stream:
                    found.update(dict(event.headers))
                if isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    return found
            self.sock.sendall(self.h2.data_to_send())

    def close(self) -> None:
        self.sock.close()


def _frame(message: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(message)) + message


@pytest.mark.parametrize(("path", "body", "content_type", "expected"), [
    ("/grpc.health.v1.Health/Check", _frame(b"\x0a\x02\xff\xfe"), "application/grpc",
     {b"grpc-status": b"13", b"grpc-message": b"the requested service name is not UTF-8"}),
    ("/grpc.health.v1.Health/Check", _frame(b"\x0a" * 2000), "application/grpc", {b"grpc-status": b"8"}),
    ("/grpc.health.v1.Health/Check", None, "application/grpc", {b"grpc-status": b"13"}),
    ("/grpc.health.v1.Health/Other", _frame(b""), "application/grpc", {b"grpc-status": b"12"}),
    ("/grpc.health.v1.Health/Check", b"{}", "application/json", {b":status": b"415"}),
])
def test_what_no_grpc_client_sends_gets_a_clear_answer_and_the_connection_serves_on(serve, path, body,
                                                                                 content_type, expected):
    server = serve()
    server.set(True, True)
    client = RawClient(server.port)
    try:
        answer = client.answers(client.call(path, body, content_type))
        assert expected.items() <= answer.items()
        answer = client.answers(client.call("/grpc.health.v1.Health/Check", _frame(b"\x0a\x08liveness")))
        assert answer[b"grpc-status"] == b"0"
    finally:
        client.close()


@pytest.fixture
def patient_server(serve, monkeypatch) -> HealthServer:
    """A serving health server whose connections' deadline is far off: what closes one is a limit."""
    monkeypatch.setattr(health_server, "CONNECTION_DEADLINE", 60.0)
    server = serve()
    server.set(True, True)
    return server


def test_a_client_resetting_streams_as_fast_as_it_can_is_closed(patient_server):
    client = RawClient(patient_server.port)
    try:
        for _ in range(health_server.MAX_STREAMS_PER_CONNECTION + 1):
            client.h2.reset_stream(client.call("/grpc.health.v1.Health/Check", None, send=False))
        client.sock.sendall(client.h2.data_to_send())
        ended = []
        # Closed long before its deadline: a GOAWAY, unless the kernel's reset overtook it (the server closed
        # with the client's last frames unread).
        with contextlib.suppress(h2.exceptions.ProtocolError, ConnectionResetError):
            while data := client.sock.recv(65536):
                ended += [e for e in client.h2.receive_data(data) if isinstance(e, h2.events.ConnectionTerminated)]
        assert [e.error_code for e in ended] in ([], [h2.errors.ErrorCodes.ENHANCE_YOUR_CALM])
        assert check(patient_server.port) == SERVING
    finally:
        client.close()


# The client's connection preface and its (empty) SETTINGS frame; then PING frames (type 6) of 8 bytes.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
PING = bytes([0, 0, 8, 6, 0, 0, 0, 0, 0]) + bytes(8)


def test_a_client_that_makes_the_server_write_without_reading_is_closed(patient_server):
    """PINGs whose acknowledgements it never reads: the server's backlog for it stays bounded."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", patient_server.port))
        sock.settimeout(20)
        sock.sendall(PREFACE)
        started = time.monotonic()
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            while True:
                sock.sendall(PING * 1024)
        assert time.monotonic() - started < 20, "closed by its deadline, not by its backlog"
        assert check(patient_server.port) == SERVING
