"""Hostile TCP clients of the watchdog's ports, for the tests and the benchmark (loopback only).

Each runs in a thread of its own from `with` to the end of the block, keeps its connections open, and
opens again one the server closes (after a short pause, so that a server refusing it costs nobody a
busy loop):

- `IdleConnections`: connections that never send a byte.
- `Slowloris`: HTTP requests that never end, one byte at a time.
- `ScrapeFlood`: well-formed scrapes, back to back, from several threads.
"""

from __future__ import annotations

import dataclasses
import selectors
import socket
import threading
import time
import urllib.request

_RECONNECT_PAUSE = 0.05
_CONNECT_TIMEOUT = 1.0


@dataclasses.dataclass
class ConnectionReport:
    opened: int = 0
    """Connections opened, reopened ones included."""
    closed_by_server: int = 0
    longest_seconds: float = 0.0
    """The longest a connection lasted before the server closed it."""


class _HeldConnections:
    """`count` connections to `port`, each opened by `_open` and fed by `_feed`; kept open until the end."""

    def __init__(self, port: int, count: int):
        self._port = port
        self._count = count
        self._stop = threading.Event()
        # Guards `report`, written by the attack's thread.
        self._lock = threading.Lock()
        self.report = ConnectionReport()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def _open(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self._port), timeout=_CONNECT_TIMEOUT)

    def _feed(self, sock: socket.socket, opened_at: float, now: float) -> None:
        """Send what the client sends at `now` on a connection opened at `opened_at`."""

    def _next_feed(self, now: float) -> float:
        return now + 1.0

    def _forget(self, sock: socket.socket) -> None:
        """`sock` was closed by the server."""

    def _run(self) -> None:
        opened: dict[socket.socket, float] = {}
        missing = self._count
        retry_at = 0.0
        with selectors.DefaultSelector() as selector:
            try:
                while not self._stop.is_set():
                    now = time.monotonic()
                    if missing and now >= retry_at:
                        missing = self._reopen(selector, opened, missing)
                        retry_at = time.monotonic() + _RECONNECT_PAUSE
                    timeout = max(0.0, min(self._next_feed(now), retry_at if missing else now + 0.5) - now)
                    for key, _ in selector.select(timeout):
                        sock = key.fileobj
                        assert isinstance(sock, socket.socket)
                        if self._drained(sock):
                            continue
                        selector.unregister(sock)
                        sock.close()
                        self._forget(sock)
                        with self._lock:
                            self.report.closed_by_server += 1
                            self.report.longest_seconds = max(self.report.longest_seconds,
                                                              time.monotonic() - opened.pop(sock))
                        missing += 1
                    now = time.monotonic()
                    for sock, opened_at in list(opened.items()):
                        try:
                            self._feed(sock, opened_at, now)
                        except OSError:
                            pass  # closed by the server: seen by select
            finally:
                for sock in opened:
                    sock.close()

    def _reopen(self, selector: selectors.BaseSelector, opened: dict[socket.socket, float], missing: int) -> int:
        while missing and not self._stop.is_set():
            try:
                sock = self._open()
            except OSError:
                return missing  # refused or not accepted in time: tried again after the pause
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            opened[sock] = time.monotonic()
            missing -= 1
            with self._lock:
                self.report.opened += 1
        return missing

    @staticmethod
    def _drained(sock: socket.socket) -> bool:
        """Reads what the server sent; False once it closed the connection."""
        try:
            return bool(sock.recv(65536))
        except BlockingIOError:
            return True
        except OSError:
            return False

    def snapshot(self) -> ConnectionReport:
        with self._lock:
            return dataclasses.replace(self.report)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class IdleConnections(_HeldConnections):
    """Connections that never send anything."""


class Slowloris(_HeldConnections):
    """`GET /metrics` requests sent one byte every `interval` seconds, never ending: a header line that
    never stops growing."""

    REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "

    def __init__(self, port: int, count: int, interval: float = 2.0):
        super().__init__(port, count)
        self._interval = interval
        self._last_drip: dict[socket.socket, float] = {}

    def _open(self) -> socket.socket:
        sock = super()._open()
        sock.sendall(self.REQUEST)
        self._last_drip[sock] = time.monotonic()
        return sock

    def _feed(self, sock: socket.socket, opened_at: float, now: float) -> None:
        if now - self._last_drip[sock] >= self._interval:
            self._last_drip[sock] = now
            sock.send(b"a")

    def _next_feed(self, now: float) -> float:
        return min(self._last_drip.values(), default=now) + self._interval

    def _forget(self, sock: socket.socket) -> None:
        self._last_drip.pop(sock, None)


class ScrapeFlood:
    """`clients` threads scraping `url` back to back; counts the answers and the failures."""

    def __init__(self, url: str, clients: int, timeout: float = 5.0):
        self._url = url
        self._timeout = timeout
        self._stop = threading.Event()
        # Guards `ok` and `failed`.
        self._lock = threading.Lock()
        self.ok = 0
        self.failed = 0
        self._threads = [threading.Thread(target=self._run, name="scrape-flood", daemon=True)
                         for _ in range(clients)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self._url, timeout=self._timeout) as answer:
                    answer.read()
                outcome = "ok"
            except OSError:
                outcome = "failed"
                self._stop.wait(_RECONNECT_PAUSE)
            with self._lock:
                setattr(self, outcome, getattr(self, outcome) + 1)

    def __enter__(self) -> ScrapeFlood:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
