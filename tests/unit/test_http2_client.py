"""worker-dra's HTTP/2 connection against servers that misbehave, each a real socket on loopback: one that says
nothing, one that speaks garbage, one that hangs up, one that trickles its answer, one that speaks only
HTTP/1.1. Each costs the caller its own deadline at most and a clear failure, never a hang or a crash."""

from __future__ import annotations

import resource
import socket
import ssl
import threading
import time
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events
import pytest

from dra_worker.api_credentials import Endpoint
from dra_worker.http2_client import ConnectionLost, Http2Connection, NotSent, connect
from tests.support.certificates import self_signed


class OneConnectionServer:
    """Accepts one connection on loopback and hands it to `behave` on a thread of its own."""

    def __init__(self, behave: Callable[[socket.socket], None], tls: ssl.SSLContext | None = None):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._behave = behave
        self._tls = tls
        self._done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        sock, _ = self._listener.accept()
        try:
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_side=True)
            self._behave(sock)
        except OSError:
            pass
        finally:
            self._done.wait(10)
            sock.close()

    def close(self) -> None:
        self._done.set()
        self._listener.close()


def _plain(port: int) -> Endpoint:
    return Endpoint("127.0.0.1", port, None, "127.0.0.1")


def _h2_server(sock: socket.socket) -> h2.connection.H2Connection:
    """The server side of HTTP/2 on `sock`, the client's preface and first request headers read."""
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    sock.sendall(server.data_to_send())
    while True:
        events = server.receive_data(sock.recv(65536))
        sock.sendall(server.data_to_send())
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                return server


@pytest.fixture
def serve():
    servers: list[OneConnectionServer] = []

    def start(behave: Callable[[socket.socket], None], tls: ssl.SSLContext | None = None) -> OneConnectionServer:
        servers.append(OneConnectionServer(behave, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _costs_its_deadline(server: OneConnectionServer, deadline: float) -> None:
    """A call to `server` times out at its deadline, a second later at most."""
    connection = connect(_plain(server.port))
    stream = connection.open("GET", "/api/v1/nodes/a", [])
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        connection.response(stream, began + deadline)
    assert time.monotonic() - began < deadline + 1
    connection.close()


def _first_call_fails(server: OneConnectionServer, failure: str) -> Http2Connection:
    """A call to `server` fails with ConnectionLost matching `failure`, and so does its connection."""
    connection = connect(_plain(server.port))
    stream = connection.open("GET", "/api/v1/nodes/a", [])
    with pytest.raises(ConnectionLost, match=failure):
        connection.response(stream, time.monotonic() + 5)
    assert not connection.usable
    return connection


def test_a_server_that_says_nothing_costs_the_caller_its_deadline(serve):
    _costs_its_deadline(serve(lambda sock: sock.recv(65536)), 0.3)


def test_garbage_from_the_server_fails_the_connection_and_its_streams(serve):
    """(Garbage that reads as the start of a long frame is waited for as silence is: the caller's deadline, then
    the connection's PING.)"""
    def garbage(sock: socket.socket) -> None:
        _h2_server(sock)
        sock.sendall(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")  # DATA on stream 0

    connection = _first_call_fails(serve(garbage), "ProtocolError")
    with pytest.raises(NotSent):
        connection.open("GET", "/api/v1/nodes/a", [])


def test_a_server_that_hangs_up_fails_the_request_in_flight(serve):
    server = serve(lambda sock: (_h2_server(sock), sock.shutdown(socket.SHUT_RDWR)))
    connection = connect(_plain(server.port))
    stream = connection.open("GET", "/api/v1/nodes/a", [])
    with pytest.raises(ConnectionLost, match="closed by the server"):
        connection.response(stream, time.monotonic() + 5)


def test_a_trickled_answer_costs_its_deadline_and_no_more(serve):
    def trickle(sock: socket.socket) -> None:
        server = _h2_server(sock)
        server.send_headers(1, [(b":status", b"200")])
        for _ in range(200):
            server.send_data(1, b"{")
            sock.sendall(server.data_to_send())
            time.sleep(0.02)

    _costs_its_deadline(serve(trickle), 0.5)


def test_an_answer_is_read_whole_and_a_stream_refused_by_goaway_was_not_sent(serve):
    def answer_then_goaway(sock: socket.socket) -> None:
        server = _h2_server(sock)
        server.send_headers(1, [(b":status", b"200"), (b"content-type", b"application/json")])
        server.send_data(1, b'{"kind": "Node"}', end_stream=True)
        sock.sendall(server.data_to_send())
        while True:  # the second request: sent away, unanswered
            for event in server.receive_data(sock.recv(65536)):
                if isinstance(event, h2.events.RequestReceived):
                    server.close_connection(last_stream_id=1)
                    sock.sendall(server.data_to_send())
                    return

    server = serve(answer_then_goaway)
    connection = connect(_plain(server.port))
    first = connection.response(connection.open("GET", "/api/v1/nodes/a", []), time.monotonic() + 5)
    assert (first.status, first.body) == (200, b'{"kind": "Node"}')
    with pytest.raises(NotSent, match="GOAWAY"):
        connection.response(connection.open("GET", "/api/v1/nodes/b", []), time.monotonic() + 5)
    assert not connection.usable


def test_a_server_that_does_not_speak_http2_is_refused_by_name(serve, tmp_path):
    key, cert = self_signed(tmp_path, "127.0.0.1")
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    server_tls.set_alpn_protocols(["http/1.1"])
    server = serve(lambda sock: sock.recv(65536), server_tls)
    client_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_tls.load_verify_locations(cafile=str(cert))
    client_tls.set_alpn_protocols(["h2"])
    with pytest.raises(NotSent, match="does not speak HTTP/2"):
        connect(Endpoint("127.0.0.1", server.port, client_tls, "127.0.0.1"))


def test_nobody_listening_is_a_failure_before_anything_was_sent():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    with pytest.raises(NotSent, match=r"connect to 127\.0\.0\.1"):
        connect(_plain(port), timeout=1)


def test_a_server_that_stops_reading_leaves_the_connection_waiting_not_spinning(serve):
    """A body the socket cannot take now waits for the socket to be writable: the I/O thread sleeps meanwhile."""
    taken = threading.Event()

    def stop_reading(sock: socket.socket) -> None:
        _h2_server(sock)
        taken.set()  # and reads nothing more: the client's send buffer fills

    server = serve(stop_reading)
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    connection = Http2Connection(sock, f"127.0.0.1:{server.port}", "http")
    connection.open("GET", "/api/v1/nodes/a", [])
    assert taken.wait(5)
    connection.open("POST", "/apis/resource.k8s.io/v1/resourceslices", [], b"x" * (4 << 20))
    used = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(1.0)  # a busy I/O thread would use most of this second
    spent = resource.getrusage(resource.RUSAGE_SELF)
    assert (spent.ru_utime + spent.ru_stime) - (used.ru_utime + used.ru_stime) < 0.3
    connection.close()


def test_an_answer_h2_takes_but_this_client_cannot_read_fails_the_connection_not_the_thread(serve):
    def odd_status(sock: socket.socket) -> None:
        server = _h2_server(sock)
        server.config.validate_outbound_headers = False
        server.send_headers(1, [(b":status", b"abc")], end_stream=True)
        sock.sendall(server.data_to_send())

    _first_call_fails(serve(odd_status), "a response status b'abc'")
