"""One HTTP/2 connection to the API server, shared by a worker's watch and its calls, as client-go keeps one.

The protocol state (h2, the sans-I/O library of the hyper project) and the socket are used under one lock: an
OpenSSL connection is not to be read and written from two threads at once. A caller sends its request itself,
without a thread switch; the connection's I/O thread waits for the socket, reads what arrives under the lock and
hands it to the streams it belongs to, and sends what a full socket left over. A caller then waits for its own
stream only: a quiet watch never holds up a call's answer.

What can go wrong is bounded: a connect and a TLS handshake time out; an answer larger than MAX_BODY, or a
stream whose unread data passes it, is reset; a connection that hears nothing for PING_AFTER seconds is pinged and
taken for dead if the PING's answer takes over PING_TIMEOUT (a peer gone without a word: client-go's 30 s and
15 s); a GOAWAY ends the connection (h2 reads no frame after one) and the next request opens a new one. A
failure is a `ConnectionLost` (the request may have been carried out) or `NotSent` (it was not, as the server
said: retry).
"""

from __future__ import annotations

import dataclasses
import itertools
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from dra_worker.api_credentials import Endpoint

MAX_BODY = 64 << 20
PING_AFTER = 30.0
PING_TIMEOUT = 15.0
CONNECT_TIMEOUT = 10.0
# Windows large enough that an answer of a few MiB (a watch-list of a big node) is not paced by window updates.
_STREAM_WINDOW = 4 << 20
_CONNECTION_WINDOW = 16 << 20
_READ_SIZE = 256 << 10
_connection_numbers = itertools.count(1)


class ConnectionLost(OSError):
    """The connection failed with the request in flight: it may or may not have been carried out."""


class NotSent(ConnectionLost):
    """The request was not carried out (the server refused the stream or went away before it): retry it."""


@dataclasses.dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class _Stream:
    """One request's stream. Its fields are guarded by the connection's lock."""

    def __init__(self, stream_id: int, body: bytes):
        self.stream_id = stream_id
        self.unsent = memoryview(body)
        self.status: int | None = None
        self.headers: dict[bytes, bytes] = {}
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.ended = False
        self.error: ConnectionLost | None = None


class Http2Connection:
    """A connected socket spoken HTTP/2 to; `open` a stream, `response` and `chunks` of it."""

    def __init__(self, sock: socket.socket, authority: str, scheme: str = "https",
                 clock: Callable[[], float] = time.monotonic):
        self.authority = authority.encode()
        self._scheme = scheme.encode()
        self.number = next(_connection_numbers)
        self._sock = sock
        self._clock = clock
        self._wake_reader, self._waker = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._waker.setblocking(False)
        # Guards _h2, _streams, _closed_by, _accepting, _outgoing and the socket (never read and written at once):
        # the I/O thread and every caller use them. Reentrant: a caller whose time is up resets its stream while
        # it holds the lock.
        self._lock = threading.Condition(threading.RLock())
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False))
        self._h2.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0, h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW})
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(_CONNECTION_WINDOW)
        self._streams: dict[int, _Stream] = {}
        self._closed_by: ConnectionLost | None = None
        self._accepting = True
        self._outgoing = bytearray()
        sock.setblocking(False)
        self._thread = threading.Thread(target=self._run, name=f"http2-{self.number}", daemon=True)
        self._thread.start()

    @property
    def usable(self) -> bool:
        """Takes new streams: not closed, no GOAWAY, stream IDs left."""
        with self._lock:
            return self._accepting and self._closed_by is None and self._thread.is_alive()

    def open(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> _Stream:
        with self._lock:
            if not self._accepting or self._closed_by is not None:
                raise NotSent(f"connection {self.number} takes no new streams")
            try:
                stream_id = self._h2.get_next_available_stream_id()
                self._h2.send_headers(stream_id, [
                    (b":method", method.encode()), (b":scheme", self._scheme), (b":authority", self.authority),
                    (b":path", path.encode()), *headers], end_stream=not body)
            except h2.exceptions.NoAvailableStreamIDError:
                self._accepting = False
                raise NotSent(f"connection {self.number} has no stream IDs left") from None
            except h2.exceptions.TooManyStreamsError:
                raise NotSent("the server's limit of concurrent streams is reached") from None
            except h2.exceptions.ProtocolError as exc:  # the connection failed; the I/O thread is failing it
                raise NotSent(f"connection {self.number} takes no new streams: {exc}") from None
            stream = _Stream(stream_id, body)
            self._streams[stream_id] = stream
            self._send_bodies()
            self._flush()
        return stream

    def response(self, stream: _Stream, deadline: float) -> Response:
        """The whole answer of `stream` by `deadline` (a monotonic time); TimeoutError after it."""
        with self._lock:
            self._await(stream, deadline, lambda: stream.ended)
            return Response(stream.status or 0, stream.headers, b"".join(stream.chunks))

    def head(self, stream: _Stream, deadline: float) -> tuple[int, dict[bytes, bytes]]:
        """The status and headers of `stream`, by `deadline`."""
        with self._lock:
            self._await(stream, deadline, lambda: stream.status is not None)
            return stream.status or 0, stream.headers

    def chunks(self, stream: _Stream) -> Iterator[bytes]:
        """The body of `stream` as it arrives, until it ends; ConnectionLost for what ends it otherwise (the
        connection's pings keep a silent one from lasting for ever). Closing the iterator resets the stream."""
        try:
            while True:
                with self._lock:
                    while not (stream.chunks or stream.ended or stream.error):
                        self._lock.wait()
                    if stream.chunks:
                        data, stream.chunks = b"".join(stream.chunks), []
                        stream.buffered = 0
                    elif stream.error:
                        raise stream.error
                    else:
                        return
                yield data
        finally:
            self.cancel(stream)

    def cancel(self, stream: _Stream) -> None:
        """Reset a stream not needed any more (a call that timed out, a watch given up)."""
        with self._lock:
            if self._streams.pop(stream.stream_id, None) is not None and self._closed_by is None:
                try:
                    self._h2.reset_stream(stream.stream_id, h2.errors.ErrorCodes.CANCEL)
                except h2.exceptions.ProtocolError:  # closed already, the stream or the whole connection
                    pass
                self._flush()

    def close(self) -> None:
        self._fail(ConnectionLost(f"connection {self.number} closed"))
        self._thread.join(timeout=5)

    def _await(self, stream: _Stream, deadline: float, ready: Callable[[], bool]) -> None:
        """Called with the lock held: until `ready()`, the stream's failure raised, or TimeoutError at `deadline`
        (the stream reset)."""
        while not (ready() or stream.error):
            left = deadline - self._clock()
            if left <= 0:
                self.cancel(stream)
                raise TimeoutError("no answer in time")
            self._lock.wait(left)
        if stream.error:
            raise stream.error

    def _wake(self) -> None:
        try:
            self._waker.send(b"\0")
        except OSError:  # a wake-up is pending already, or the connection is closed
            pass

    def _send_bodies(self) -> None:
        """Called with the lock held: as much of each stream's unsent body as the flow control windows allow."""
        for stream in self._streams.values():
            while stream.unsent:
                window = min(self._h2.local_flow_control_window(stream.stream_id), self._h2.max_outbound_frame_size)
                if window <= 0:
                    break
                chunk, stream.unsent = stream.unsent[:window], stream.unsent[window:]
                self._h2.send_data(stream.stream_id, chunk.tobytes(), end_stream=not stream.unsent)

    def _flush(self) -> None:
        """Called with the lock held (so the socket is never written while it is read): send what the protocol
        state has queued, as far as the socket takes it now; the I/O thread is woken to send the rest when the
        socket is writable. A send that fails fails the connection."""
        if self._closed_by is not None:
            return
        self._outgoing += self._h2.data_to_send()
        if not self._outgoing:
            return
        try:
            sent = self._sock.send(self._outgoing)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            sent = 0
        except OSError as exc:
            self._fail(ConnectionLost(f"connection {self.number}: {type(exc).__name__}: {exc}"))
            return
        del self._outgoing[:sent]
        if self._outgoing and threading.current_thread() is not self._thread:
            self._wake()  # the I/O thread waits for the socket to take the rest (woken by itself, it would spin)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._sock, selectors.EVENT_READ)
        selector.register(self._wake_reader, selectors.EVENT_READ)
        watching_writes = False
        heard, ping_sent = self._clock(), None
        try:
            while True:
                with self._lock:
                    if self._closed_by is not None:
                        return
                    if not self._accepting and not self._streams:
                        raise ConnectionLost(f"connection {self.number} went away and has no streams left")
                    self._flush()
                    if watching_writes != bool(self._outgoing):
                        watching_writes = bool(self._outgoing)
                        selector.modify(self._sock, selectors.EVENT_READ | (selectors.EVENT_WRITE * watching_writes))
                timeout = (ping_sent + PING_TIMEOUT if ping_sent is not None else heard + PING_AFTER) - self._clock()
                for key, _ in selector.select(max(0.0, timeout)):
                    if key.fileobj is self._wake_reader:
                        self._drain_wakes()
                    elif self._read():
                        heard, ping_sent = self._clock(), None
                now = self._clock()
                if ping_sent is not None and now >= ping_sent + PING_TIMEOUT:
                    raise ConnectionLost(f"no answer to a PING in {PING_TIMEOUT:.0f} s: the API server is gone")
                if ping_sent is None and now >= heard + PING_AFTER:
                    with self._lock:
                        self._h2.ping(b"rbln-dra")
                    ping_sent = now
        except ConnectionLost as lost:
            self._fail(lost)
        except Exception as exc:  # OSError, h2's ProtocolError, or what nobody foresaw: never a silent death
            self._fail(ConnectionLost(f"connection {self.number}: {type(exc).__name__}: {exc}"))
        finally:
            self._fail(ConnectionLost(f"connection {self.number} closed"))
            selector.close()
            with self._lock:
                for sock in (self._sock, self._wake_reader, self._waker):
                    sock.close()

    def _drain_wakes(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _read(self) -> bool:
        """Read what has arrived and hand it to the streams; whether anything did."""
        with self._lock:
            received: list[bytes] = []
            try:
                while True:
                    data = self._sock.recv(_READ_SIZE)
                    if not data:
                        if received:
                            break
                        raise ConnectionLost(f"connection {self.number} closed by the server")
                    received.append(data)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
            if not received:
                return False
            try:
                for event in self._h2.receive_data(b"".join(received)):
                    self._handle(event)
                self._send_bodies()
            except (ConnectionLost, h2.exceptions.ProtocolError, ValueError) as exc:
                # failed before the lock is let go: no caller may meet h2's closed state first
                self._fail(exc if isinstance(exc, ConnectionLost) else ConnectionLost(
                    f"connection {self.number}: {type(exc).__name__}: {exc}"))
                raise
            self._lock.notify_all()
            return True

    def _handle(self, event: h2.events.Event) -> None:
        """Called with the lock held."""
        if isinstance(event, h2.events.ConnectionTerminated):
            # h2 takes no frame after a GOAWAY, so the streams the server took end here too
            last = event.last_stream_id or 0
            for stream_id, cut in self._streams.items():
                cut.error = (ConnectionLost if stream_id <= last else NotSent)(
                    f"the server closed the connection (GOAWAY {event.error_code!r})")
            self._streams.clear()
            raise ConnectionLost(f"connection {self.number}: GOAWAY {event.error_code!r}")
        stream = self._streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.DataReceived):
            try:
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            except h2.exceptions.StreamClosedError:  # data of a stream reset meanwhile: the connection's counts
                pass
        if stream is None:
            return
        if isinstance(event, h2.events.ResponseReceived):
            stream.headers = dict(event.headers)  # bytes: header_encoding is None
            status = stream.headers.get(b":status", b"")
            if not status.isdigit():
                raise ValueError(f"a response status {status[:20]!r}")
            stream.status = int(status)
        elif isinstance(event, h2.events.DataReceived):
            stream.chunks.append(event.data or b"")
            stream.buffered += len(event.data or b"")
            if stream.buffered > MAX_BODY:
                stream.error = ConnectionLost(f"the answer passed {MAX_BODY} bytes unread: given up")
                self.cancel(stream)
        elif isinstance(event, h2.events.StreamEnded):
            stream.ended = True
            self._streams.pop(stream.stream_id, None)
            if stream.unsent:  # answered before the request's body was all sent: that half is closed too
                stream.unsent = memoryview(b"")
                try:
                    self._h2.reset_stream(stream.stream_id, h2.errors.ErrorCodes.NO_ERROR)
                except h2.exceptions.ProtocolError:
                    pass
        elif isinstance(event, h2.events.StreamReset):
            self._streams.pop(stream.stream_id, None)
            not_taken = event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
            stream.error = (NotSent if not_taken else ConnectionLost)(
                f"the server reset the stream ({event.error_code!r})")

    def _fail(self, error: ConnectionLost) -> None:
        with self._lock:
            if self._closed_by is not None:
                return
            self._closed_by = error
            for stream in self._streams.values():
                stream.error = error
            self._streams.clear()
            self._lock.notify_all()
            self._wake()  # under the lock: the I/O thread closes the wake socket under it


def connect(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT,
            clock: Callable[[], float] = time.monotonic) -> Http2Connection:
    """A new connection to the endpoint: TCP, TLS offering only h2 (or HTTP/2 with prior knowledge on plain
    HTTP), the connection preface. ConnectionLost (nothing was sent) for what fails."""
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as exc:
        raise NotSent(f"connect to {endpoint.authority}: {exc}") from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if endpoint.tls is not None:
            sock = endpoint.tls.wrap_socket(sock, server_hostname=endpoint.server_name)
            if sock.selected_alpn_protocol() != "h2":
                raise ssl.SSLError(f"the server at {endpoint.authority} does not speak HTTP/2 (ALPN)")
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise NotSent(f"TLS with {endpoint.authority}: {exc}") from None
    return Http2Connection(sock, endpoint.authority, "https" if endpoint.tls else "http", clock)
