"""A small HTTP/2 server on the `h2` protocol library, for the loopback stand-ins of servers a client under test
reaches by HTTP/2 (simulator/kube_api.py's API server).

One listener serves both protocols: over TLS, as ALPN chose (h2 offered before http/1.1); over plain TCP, HTTP/2
when a connection opens with HTTP/2's preface (prior knowledge), HTTP/1.1 otherwise, by a socketserver request
handler class (http.server's, say) as any socketserver would. Each HTTP/2 connection has one thread that reads it
and feeds an h2 connection; each request, once whole, is handled on a thread of its own, so that a long answer
(a watch) holds up neither the connection nor the other streams on it. For tests of clients: `unresponsive` (the
peer vanished without a word), `goaway()` (a graceful GOAWAY on every connection) and `connections` (how many were
accepted)."""

from __future__ import annotations

import dataclasses
import selectors
import socket
import socketserver
import ssl
import threading
import time
import traceback
from collections.abc import Callable, Iterable

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import hyperframe.frame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_READ_SIZE = 64 << 10
_HANDSHAKE_TIMEOUT = 10.0  # a TLS handshake, or a preface arriving in pieces
_LINGER = 1.0  # after a GOAWAY's last answer, how long the peer has to close before the connection is cut
_WINDOW_POLL = 0.5  # a sender waiting for flow-control window looks this often whether its stream is gone
_JOIN_TIMEOUT = 5.0

Headers = Iterable[tuple[str, str]]


@dataclasses.dataclass
class Request:
    method: str
    path: str  # with its query
    headers: dict[str, str]  # pseudo-headers (":authority") included
    body: bytes


Handler = Callable[[Request, "Stream"], None]


class Stream:
    """The answer to one request, written from its handler's thread. Each call says whether the answer can still go
    out: False once the peer reset the stream or the connection closed, and a handler streaming an answer stops."""

    def __init__(self, connection: _Connection, stream_id: int) -> None:
        self._connection = connection
        self.stream_id = stream_id

    def respond(self, status: int, body: bytes, headers: Headers = ()) -> bool:
        """A whole answer, with its content-length."""
        headers = [*headers, ("content-length", str(len(body)))]
        return self.start(status, headers, end=not body) and (not body or self.send(body, end=True))

    def start(self, status: int, headers: Headers = (), end: bool = False) -> bool:
        """The answer's headers; its body follows by `send`, unless `end`."""
        return self._connection.send_headers(self.stream_id, [(":status", str(status)), *headers], end)

    def send(self, data: bytes, end: bool = False) -> bool:
        """Part of the body, as the peer's flow-control window lets it go (waiting for it). b"" sends nothing, and
        only says whether the stream is still open."""
        return self._connection.send_data(self.stream_id, data, end)

    def end(self) -> bool:
        return self.send(b"", end=True)

    def drop_connection(self) -> None:
        """Cut the whole TCP connection with nothing more sent, this answer and every other in flight lost."""
        self._connection.close()


@dataclasses.dataclass
class _StreamState:
    headers: list[tuple[bytes, bytes]]
    body: bytearray = dataclasses.field(default_factory=bytearray)
    handled: bool = False  # the request is whole and its handler's thread started
    ended: bool = False  # END_STREAM sent, or the stream reset by either side


class _Connection:
    """One HTTP/2 connection of the server: `serve` is its reading thread."""

    def __init__(self, sock: socket.socket, server: Http2Server) -> None:
        self._sock = sock
        self._server = server
        self._h2 = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=False, header_encoding=None))
        # One lock per connection guards the H2Connection, which is not thread-safe, and the socket: its writes, so
        # that the frames h2 serialised go out whole and in their order, and its reads too, since an OpenSSL
        # connection is not to be read and written from two threads at once (the reading thread waits for input
        # without the lock, and reads what came with it). As a condition it wakes senders waiting for window.
        self._lock = threading.Condition()
        self._streams: dict[int, _StreamState] = {}  # the peer's streams not yet finished: in flight
        self._threads: list[threading.Thread] = []  # the handlers' (only the reading thread touches the list)
        self._goaway: int | None = None  # the last stream id of the GOAWAY sent
        self._draining: threading.Timer | None = None  # the GOAWAY's streams all answered: the end's deadline
        self._closed = False
        self._mute = False

    def serve(self) -> None:
        """Reads and answers the connection until the peer closes it or `close` ends it."""
        with self._lock:
            self._h2.initiate_connection()
            self._flush()
        selector = selectors.DefaultSelector()
        selector.register(self._sock, selectors.EVENT_READ)
        try:
            while True:
                # A TLS connection may hold decrypted bytes that the socket no longer shows as readable.
                if not (isinstance(self._sock, ssl.SSLSocket) and self._sock.pending()):
                    selector.select()
                if not self._receive():
                    break
        finally:
            selector.close()
            self.close()
            if self._draining is not None:
                self._draining.cancel()
            for thread in self._threads:
                thread.join(_JOIN_TIMEOUT)

    def _receive(self) -> bool:
        """Reads what came and handles it; False once the connection is over."""
        with self._lock:
            if self._closed:
                return False
            data = self._read()
            if data is None:
                return True
            if not data:
                return False
            if self._silent():
                return True  # a vanished peer hears nothing
            try:
                events = self._h2.receive_data(data)
            except h2.exceptions.ProtocolError:  # h2 has queued the GOAWAY that says why
                self._flush()
                return False
            for event in events:
                self._on(event)
            self._flush()  # answers too what h2 answers by itself: PINGs and SETTINGS
            return not self._closed

    def _read(self) -> bytes | None:
        """With the lock held, and the socket readable: its bytes, b"" at its end, None if none are whole yet (a
        TLS record in pieces). Non-blocking, so that the lock is never held waiting for the peer."""
        self._sock.setblocking(False)
        try:
            return self._sock.recv(_READ_SIZE)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return None
        except OSError:
            return b""
        finally:
            try:
                self._sock.setblocking(True)
            except OSError:
                pass

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._opened(event.stream_id, event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            # Acknowledged at once: the whole body is kept, so the peer's sending need not wait for the handler.
            self._h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id or 0)
            stream = self._streams.get(event.stream_id or 0)
            if stream is not None:
                stream.body += event.data or b""
        elif isinstance(event, h2.events.StreamEnded):
            self._dispatch(event.stream_id or 0)
        elif isinstance(event, h2.events.StreamReset):
            self._reset(event.stream_id or 0)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._lock.notify_all()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.close()  # the peer's GOAWAY: h2 sends nothing more, the answers in flight neither

    def _opened(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self._goaway is not None and stream_id > self._goaway:
            # Opened before the peer saw the GOAWAY: refused, so that it knows to send the request again elsewhere.
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        self._streams[stream_id] = _StreamState(headers)

    def _dispatch(self, stream_id: int) -> None:
        """The request is whole: its own thread handles it, so that its answer holds up no other."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.handled = True
        headers = {name.decode(): value.decode() for name, value in stream.headers}
        request = Request(headers.get(":method", ""), headers.get(":path", ""), headers, bytes(stream.body))
        thread = threading.Thread(target=self._handle, args=(stream_id, request), daemon=True,
                                  name=f"http2 stream {stream_id}")
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _handle(self, stream_id: int, request: Request) -> None:
        try:
            self._server.handler(request, Stream(self, stream_id))
        except Exception:
            traceback.print_exc()  # a fault of the handler: shown, and its stream reset below
        finally:
            with self._lock:
                stream = self._streams.pop(stream_id, None)
                if stream is not None and not stream.ended and not self._closed:
                    self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                    self._flush()
                self._close_when_idle()

    def _reset(self, stream_id: int) -> None:
        """The peer reset a stream: its sender stops; a request not yet whole is forgotten."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.ended = True
            if not stream.handled:
                del self._streams[stream_id]
                self._close_when_idle()
        self._lock.notify_all()

    def _sendable(self, stream_id: int) -> bool:
        stream = self._streams.get(stream_id)
        return not self._closed and stream is not None and not stream.ended

    def send_headers(self, stream_id: int, headers: list[tuple[str, str]], end: bool) -> bool:
        with self._lock:
            if not self._sendable(stream_id):
                return False
            try:
                self._h2.send_headers(stream_id, [(k.encode(), v.encode()) for k, v in headers], end_stream=end)
            except h2.exceptions.ProtocolError:
                return False
            self._streams[stream_id].ended = end
            self._flush()
            return not self._closed

    def send_data(self, stream_id: int, data: bytes, end: bool) -> bool:
        with self._lock:
            if not data:
                if not self._sendable(stream_id):
                    return False
                if end:
                    return self._send_chunk(stream_id, b"", True)
                return True
            while data:
                if not self._sendable(stream_id):
                    return False
                size = min(len(data), self._h2.local_flow_control_window(stream_id), self._h2.max_outbound_frame_size)
                if size <= 0:
                    # The peer's window is spent: its WINDOW_UPDATE, the stream's reset or the connection's end
                    # wakes this (the reading thread notifies), and the poll looks again in any case.
                    self._lock.wait(_WINDOW_POLL)
                    continue
                if not self._send_chunk(stream_id, data[:size], end and size == len(data)):
                    return False
                data = data[size:]
            return True

    def _send_chunk(self, stream_id: int, data: bytes, end: bool) -> bool:
        try:
            if data:
                self._h2.send_data(stream_id, data, end_stream=end)
            else:
                self._h2.end_stream(stream_id)
        except h2.exceptions.ProtocolError:
            return False
        self._streams[stream_id].ended = end
        self._flush()
        return not self._closed

    def _silent(self) -> bool:
        """Whether the connection plays a peer that vanished: from the moment `unresponsive` finds it in use, and
        then for good (what its peer sent meanwhile went unread: the protocol state they shared is lost)."""
        self._mute = self._mute or self._server.unresponsive
        return self._mute

    def _flush(self) -> None:
        """With the lock held: sends what h2 has made to send."""
        self._write(self._h2.data_to_send())

    def _write(self, data: bytes) -> None:
        if not data or self._closed or self._silent():
            return
        try:
            self._sock.sendall(data)
        except OSError:
            self.close()

    def goaway(self) -> None:
        """GOAWAY (NO_ERROR, the last stream the highest the peer opened): the streams in flight are finished, then
        the connection is closed. Nothing for a connection that is silent (it has vanished)."""
        with self._lock:
            if self._closed or self._goaway is not None or self._silent():
                return
            self._goaway = self._h2.highest_inbound_stream_id
            # Made by hand: after h2's own close_connection, h2 would send nothing more, not even the answers that
            # the GOAWAY promises.
            frame = hyperframe.frame.GoAwayFrame(0, last_stream_id=self._goaway,
                                                 error_code=h2.errors.ErrorCodes.NO_ERROR)
            self._flush()
            self._write(frame.serialize())
            self._close_when_idle()

    def _close_when_idle(self) -> None:
        """With the lock held: after a GOAWAY, once no stream is in flight, the connection ends: the server's side is
        shut first, so the answers sent reach the peer before its close (a close with input unread would reset
        them), and the rest cut after _LINGER if the peer keeps its side open."""
        if self._goaway is None or self._streams or self._draining or self._closed:
            return
        try:
            socket.socket.shutdown(self._sock, socket.SHUT_WR)
        except OSError:
            pass
        self._draining = threading.Timer(_LINGER, self.close)
        self._draining.daemon = True
        self._draining.start()

    def close(self) -> None:
        """Ends the connection at once, with nothing more sent. The reading thread wakes, and closes the socket."""
        # The base class's shutdown: an SSLSocket's own would drop its TLS state under the threads using it. And
        # before the lock: a sender may hold it in a write the peer does not read.
        try:
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
        except OSError:
            pass
        with self._lock:
            self._closed = True
            self._lock.notify_all()


class Http2Server(socketserver.ThreadingTCPServer):
    """A listener on `address`: HTTP/2 connections go to `handler` (a request, and the stream to answer it on, on a
    thread of its own), the others to `RequestHandlerClass` as in any socketserver. With `tls` (a server context,
    whose ALPN protocols this sets), connections are TLS.

    Knobs: `unresponsive` (while True, HTTP/2 connections in use go silent for good: they read, and answer nothing,
    not even PINGs or SETTINGS), `goaway()` (a GOAWAY on every open HTTP/2 connection, which closes once its streams
    in flight are answered), and `connections` (the TCP connections accepted so far, of either protocol)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], RequestHandlerClass: Callable[..., socketserver.BaseRequestHandler],
                 handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        if tls is not None:
            tls.set_alpn_protocols(["h2", "http/1.1"])
        self.connections = 0
        self.unresponsive = False
        self._lock = threading.Lock()  # guards the two sets below and _closing
        self._sockets: set[socket.socket] = set()  # of every open connection, to shut at server_close
        self._http2: set[_Connection] = set()
        self._closing = False
        super().__init__(address, RequestHandlerClass)

    def goaway(self) -> None:
        with self._lock:
            connections = list(self._http2)
        for connection in connections:
            connection.goaway()

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        self.connections += 1  # only the accepting thread counts
        super().process_request(request, client_address)

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        """A connection's own thread: its TLS handshake, its protocol, and serving it to its end."""
        sock = request
        try:
            sock = self._secured(request)
            if self._track(sock):
                self._serve(sock, client_address)
        except OSError:
            pass  # the peer went away, or its TLS handshake failed: no one to tell
        except Exception:
            self.handle_error(sock, client_address)
        finally:
            with self._lock:
                self._sockets.discard(sock)
            self.shutdown_request(sock)

    def _secured(self, sock: socket.socket) -> socket.socket:
        if self.tls is None:
            return sock
        sock.settimeout(_HANDSHAKE_TIMEOUT)
        secured = self.tls.wrap_socket(sock, server_side=True)  # on this thread: a slow handshake holds up no other
        secured.settimeout(None)
        return secured

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if not self._closing:
                self._sockets.add(sock)
            return not self._closing

    def _serve(self, sock: socket.socket, client_address: object) -> None:
        if not self._speaks_http2(sock):
            self.finish_request(sock, client_address)
            return
        connection = _Connection(sock, self)
        with self._lock:
            self._http2.add(connection)
        try:
            connection.serve()
        finally:
            with self._lock:
                self._http2.discard(connection)

    @staticmethod
    def _speaks_http2(sock: socket.socket) -> bool:
        if isinstance(sock, ssl.SSLSocket):
            return sock.selected_alpn_protocol() == "h2"
        return _opens_with_preface(sock)

    def server_close(self) -> None:
        """Closes the listener and every connection, and waits for the connections' threads."""
        with self._lock:
            self._closing = True
            sockets = list(self._sockets)
        for sock in sockets:
            try:  # the base class's, as in _Connection.close
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass
        super().server_close()  # ThreadingMixIn's joins the connections' threads


def _opens_with_preface(sock: socket.socket) -> bool:
    """Whether a plain connection's first bytes are HTTP/2's preface: peeked at, so that whichever protocol serves
    the connection reads them still."""
    deadline = time.monotonic() + _HANDSHAKE_TIMEOUT
    seen = sock.recv(len(PREFACE), socket.MSG_PEEK)
    while seen and len(seen) < len(PREFACE) and PREFACE.startswith(seen) and time.monotonic() < deadline:
        time.sleep(0.01)  # a preface in pieces: peeking again at once would see the same bytes
        seen = sock.recv(len(PREFACE), socket.MSG_PEEK)
    return seen == PREFACE
