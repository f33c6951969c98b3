"""A hostile HTTP/2 client of the health port, built on the `h2` protocol library.

Each connection announces a flow-control window of zero (SETTINGS_INITIAL_WINDOW_SIZE = 0) and never
opens it: the server may send headers, which flow control does not cover, but not one byte of a reply
message. On it the client opens health streams and leaves them open: `Watch`, `Check`, or a `Check`
whose request is never sent. It answers the server's SETTINGS and PINGs (h2 does), so the connection
looks alive and is only closed by the server's own limits.
"""

from __future__ import annotations

import dataclasses
import select
import socket
import struct
import threading
import time
from collections import Counter

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from grpc_health.v1 import health_pb2

WATCH, CHECK, CHECK_WITHOUT_REQUEST = "Watch", "Check", "Check without request"
_RECONNECT_PAUSE = 0.1


def _grpc_message(service: str) -> bytes:
    body = health_pb2.HealthCheckRequest(service=service).SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


class ZeroWindowConnection:
    def __init__(self, port: int, streams: tuple[str, ...]):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self._h2.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        self._h2.initiate_connection()
        self.kinds: dict[int, str] = {}
        for kind in streams:
            stream = self._h2.get_next_available_stream_id()
            method = WATCH if kind == WATCH else CHECK
            self._h2.send_headers(stream, [(":method", "POST"), (":scheme", "http"),
                                           (":path", f"/grpc.health.v1.Health/{method}"), (":authority", "health"),
                                           ("content-type", "application/grpc"), ("te", "trailers")])
            if kind != CHECK_WITHOUT_REQUEST:
                self._h2.send_data(stream, _grpc_message("liveness"), end_stream=True)
            self.kinds[stream] = kind
        self.sock.sendall(self._h2.data_to_send())
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def pump(self) -> tuple[list[h2.events.Event], bool]:
        """Events of what the server sent since the last call, and whether the connection is still open."""
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return [], True
        except OSError:
            return [], False
        if not data:
            return [], False
        try:
            events = self._h2.receive_data(data)
            self.sock.sendall(self._h2.data_to_send())
        except (h2.exceptions.ProtocolError, OSError):
            return [], False
        return events, not any(isinstance(event, h2.events.ConnectionTerminated) for event in events)

    def close(self) -> None:
        self.sock.close()


@dataclasses.dataclass
class AttackReport:
    connections: int = 0
    """Connections opened, reopened ones included."""
    message_bytes: int = 0
    """Reply message bytes the server got out to the attacker: zero while the window holds."""
    grpc_status: Counter = dataclasses.field(default_factory=Counter)
    """(kind of stream, grpc-status) of the streams the server ended."""


class ZeroWindowAttack:
    """`connections` hostile connections to `port`, each with `streams`, kept open (one the server
    closes is opened again) from `with` until the end of the block."""

    def __init__(self, port: int, connections: int, streams: tuple[str, ...]):
        self._port = port
        self._slots = connections
        self._streams = streams
        self._stop = threading.Event()
        # Guards `report`, written by the attack's thread.
        self._lock = threading.Lock()
        self.report = AttackReport()
        self._thread = threading.Thread(target=self._run, name="zero-window-attack", daemon=True)

    def _open(self) -> ZeroWindowConnection | None:
        try:
            connection = ZeroWindowConnection(self._port, self._streams)
        except OSError:
            return None  # refused (the server's connection cap): tried again after a pause
        with self._lock:
            self.report.connections += 1
        return connection

    def _record(self, connection: ZeroWindowConnection, events: list[h2.events.Event]) -> None:
        with self._lock:
            for event in events:
                if isinstance(event, h2.events.DataReceived):
                    self.report.message_bytes += len(event.data)
                elif isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
                    status = dict(event.headers).get(b"grpc-status")
                    if status is not None:
                        kind = connection.kinds.get(event.stream_id, "?")
                        self.report.grpc_status[(kind, status.decode())] += 1

    def _run(self) -> None:
        slots: list[ZeroWindowConnection | None] = [None] * self._slots
        retry_at = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() >= retry_at:
                    slots = [connection or self._open() for connection in slots]
                    retry_at = time.monotonic() + _RECONNECT_PAUSE
                live = [connection for connection in slots if connection is not None]
                readable, _, _ = select.select(live, [], [], _RECONNECT_PAUSE) if live else ([], [], [])
                for connection in readable:
                    events, open_ = connection.pump()
                    self._record(connection, events)
                    if not open_:
                        connection.close()
                        slots[slots.index(connection)] = None
                if not live:
                    self._stop.wait(_RECONNECT_PAUSE)
        finally:
            for connection in slots:
                if connection is not None:
                    connection.close()

    def snapshot(self) -> AttackReport:
        with self._lock:
            return dataclasses.replace(self.report, grpc_status=Counter(self.report.grpc_status))

    def __enter__(self) -> ZeroWindowAttack:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
