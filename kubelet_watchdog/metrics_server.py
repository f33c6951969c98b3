"""`GET /metrics` for the whole stack, served by the watchdog.

The watchdog serves it because it already holds what the state metrics need (supervisord's program table
and every status file, read for the probes at each check) and because it is the one process that is neither
on the kubelet's path (the workers) nor busy with the node (the scanner): a scrape never delays an
Allocate or a scan. The other processes only write their value files, which a scrape reads.

One thread serves one request at a time: a scrape costs a few milliseconds, and a client that stalls is cut
off after a few seconds, so no number of connections can make the process grow. It sleeps in select() between
requests (no periodic wake-up: an idle node pays nothing).
"""

from __future__ import annotations

import errno
import gzip
import http.server
import os
import pathlib
import selectors
import socket
import socketserver
import threading
import urllib.parse
from collections.abc import Iterable

from loguru import logger
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from kubelet_watchdog.metrics_files import ProcessFilesCollector
from kubelet_watchdog.stack_metrics import Sample, StackView, state_samples
from shared.metrics import PATH, STATE_FAMILIES

# A client that sends its request or reads the answer slower than this is disconnected.
CLIENT_TIMEOUT_SECONDS = 5.0
# zlib's default: most of level 9's gain on a metrics page at a fraction of its CPU.
GZIP_LEVEL = 6
_STOP_GRACE_SECONDS = 1.0


def state_families(samples: Iterable[Sample]) -> list[Metric]:
    """prometheus_client families of `samples`, in the order of STATE_FAMILIES; one without samples is left
    out."""
    built = {family: GaugeMetricFamily(family.name, family.help, labels=family.labels) for family in STATE_FAMILIES}
    for family, labels, value in samples:
        built[family].add_metric([labels[label] for label in family.labels], value)
    return [metric for metric in built.values() if metric.samples]


class StackStateCollector:
    """A prometheus_client collector of the state metrics of the last view it was given."""

    def __init__(self) -> None:
        # Guards `_view`, replaced whole by the watchdog's loop and read by scrapes.
        self._lock = threading.Lock()
        self._view: StackView | None = None

    def update(self, view: StackView) -> None:
        with self._lock:
            self._view = view

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            view = self._view
        return state_families(state_samples(view)) if view is not None else []


class _Handler(http.server.BaseHTTPRequestHandler):
    registry: CollectorRegistry  # set on the subclass each server makes
    # The connection closes after each answer (HTTP/1.0): a client keeping it open would hold the one
    # serving thread.
    timeout = CLIENT_TIMEOUT_SECONDS

    def do_GET(self) -> None:
        if urllib.parse.urlsplit(self.path).path != PATH:
            self.send_error(404, f"only {PATH} is served here")
            return
        try:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            body = encoder(self.registry)
        except Exception as exc:  # a scrape must never take the watchdog down
            logger.opt(exception=True).warning("Metrics collection failed", err=f"{type(exc).__name__}: {exc}")
            self.send_error(500, "metrics collection failed")
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # http.server's signature, `format` and all
        """Nothing: a scrape every few seconds is no news."""


class _Server(socketserver.TCPServer):
    allow_reuse_address = True  # a restarted watchdog binds again while old connections linger

    def handle_error(self, request, client_address) -> None:
        """A client that went away mid-answer is its own problem (the default prints a traceback)."""
        logger.opt(exception=True).debug("Metrics request failed", client=str(client_address))

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            # One socket for both families, as Go's ":port" listens.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _bind(port: int, handler: type[_Handler]) -> _Server:
    """A server bound to `port` on every interface: IPv6 and IPv4 at once, IPv4 alone where IPv6 is off."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        server_class = type("_BoundServer", (_Server,), {"address_family": family})
        try:
            return server_class((address, port), handler)
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue
            raise
    raise AssertionError("unreachable")


class MetricsServer:
    """Serves `registry` on `port` (0: a free port, see `.port`) from a thread of its own."""

    def __init__(self, port: int, registry: CollectorRegistry):
        handler = type("_RegistryHandler", (_Handler,), {"registry": registry})
        self._server = _bind(port, handler)
        self.port = self._server.server_address[1]
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="metrics-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._stop_read, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj == self._stop_read:
                        return
                    self._server.handle_request()

    def stop(self) -> None:
        os.write(self._stop_write, b"x")
        # A request in progress ends within the client timeout; the process does not wait for it.
        self._thread.join(_STOP_GRACE_SECONDS)
        self._server.server_close()


class MetricsEndpoint:
    """The stack's /metrics, if enabled; a port that cannot be bound now is tried again at every check."""

    def __init__(self, port: int, directory: pathlib.Path):
        self._port = port
        self._state = StackStateCollector()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(ProcessFilesCollector(directory))
        self._registry.register(self._state)
        self._server: MetricsServer | None = None
        self._failure_logged = False

    def update(self, view: StackView) -> None:
        """What the watchdog's check saw; the first call starts listening."""
        if self._port < 0:
            return
        self._state.update(view)
        if self._server is None:
            self._listen()

    def _listen(self) -> None:
        try:
            self._server = MetricsServer(self._port, self._registry)
        except OSError as exc:
            if not self._failure_logged:
                logger.error("Metrics endpoint cannot listen; retrying", port=self._port, err=str(exc))
                self._failure_logged = True
            return
        self._server.start()
        logger.info("Metrics endpoint listening", port=self._server.port, path=PATH)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
