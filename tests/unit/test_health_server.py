"""The health service in process: Check only, and a full port or a stuck connection never keeps a probe out."""

from __future__ import annotations

import asyncio
import resource
import socket
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.registry import CollectorRegistry

from kubelet_watchdog import health_server, metrics_server, serving_loop
from kubelet_watchdog.health_server import HealthServer
from kubelet_watchdog.metrics_server import MetricsServer
from kubelet_watchdog.serving_loop import listening_socket, shared_loop
from tests.support.hostile_http2 import CHECK_WITHOUT_REQUEST, ZeroWindowConnection
from tests.support.waiting import wait_until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def serve(short_tmp):
    servers = []

    def start() -> HealthServer:
        server = HealthServer(0, short_tmp / f"health-{len(servers)}.sock")
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
    """A relayed health connection holds three descriptors (the client's, the relay's, gRPC's end of it):
    both ports full, with the process's own, must stay within the limit, or accepts fail with EMFILE (asyncio
    then stops accepting for a second) and so do the watchdog's own opens."""
    health = serve()
    metrics = MetricsServer(0, CollectorRegistry())
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert health.table.limit * 3 + metrics.table.limit + serving_loop._RESERVED_DESCRIPTORS <= soft
        if hard == resource.RLIM_INFINITY or hard >= 3 * health_server.MAX_CONNECTIONS + 2048:
            assert health.table.limit == health_server.MAX_CONNECTIONS  # the soft limit was raised for both
            assert metrics.table.limit == metrics_server.MAX_CONNECTIONS
    finally:
        metrics.stop()
    health.stop()
    assert serve().table.limit == health.table.limit, "the stopped servers gave their room back"
