"""`GET /metrics` for the whole stack, served by the watchdog.

The watchdog serves it because it already holds what the state metrics need (supervisord's program table
and every status file, read for the probes at each judgement) and because it is the one process that is neither
on the kubelet's path (the workers) nor busy with the node (the scanner): a scrape never delays an
Allocate or a scan. The other processes only write their value files, which a scrape reads.

It is served from the watchdog's serving loop (serving_loop.py), with the health service: a connection is a
few objects of the loop, whatever its client does, and must be done, request and answer, within
`CONNECTION_DEADLINE` however slowly it trickles; a full port closes its least recently active connection
for a new one. Collections run one at a time in a thread of their own, so that a scrape's few milliseconds
never delay a probe. The loop sleeps between requests (no periodic wake-up: an idle node pays nothing).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import gzip
import http
import pathlib
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable

from loguru import logger
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from kubelet_watchdog.metrics_files import ProcessFilesCollector
from kubelet_watchdog.serving_loop import (
    ConnectionTable,
    GuardedConnection,
    listening_socket,
    serve,
)
from kubelet_watchdog.stack_metrics import Sample, StackView, state_samples
from shared.observability.metrics import PATH, STATE_FAMILIES
from shared.supervision.loop_thread import LoopThread, shared_loop

# A connection's whole life: its request in, its answer out. Prometheus's own scrape timeout defaults to 10 s,
# and a scrape is answered in milliseconds.
CONNECTION_DEADLINE = 5.0
# Connections held at once (each one past it closes the least recently active).
MAX_CONNECTIONS = 1024
# A page answers every scrape in its format for this long after its collection started: Prometheus
# scrapes every 15 s or more, and the state metrics change at the watchdog's judgements, once a scan.
PAGE_REUSE_SECONDS = 1.0
# A request line and its headers; Prometheus sends about 300 bytes.
MAX_REQUEST_BYTES = 8 * 1024
# zlib's default: most of level 9's gain on a metrics page at a fraction of its CPU.
GZIP_LEVEL = 6


# The formats a scrape is answered in: prometheus_client's encoders for the versions and escapings they
# tell apart. choose_encoder echoes whatever version a client names into the content type (and raises
# TypeError on one it cannot compare, "version=abc"), so its choice is taken only when it is one of these,
# else the default text format: the pages kept, and the collections made, are per format, and an
# attacker naming a new version at each scrape must get neither a new page nor a new collection.
_ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")
_DEFAULT_FORMAT = choose_encoder("")
_FORMATS = frozenset(
    {_DEFAULT_FORMAT[1], choose_encoder("application/openmetrics-text")[1]}
    | {choose_encoder(f"{kind}; version={version}; escaping={escaping}")[1]
       for kind, version in (("text/plain", "1.0.0"), ("application/openmetrics-text", "1.0.0"),
                             ("application/openmetrics-text", "2.0.0"))
       for escaping in _ESCAPINGS})


def answered_format(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """The encoder and content type `accept` is answered with: one of _FORMATS."""
    try:
        chosen = choose_encoder(accept)
    except (TypeError, ValueError):
        return _DEFAULT_FORMAT
    return chosen if chosen[1] in _FORMATS else _DEFAULT_FORMAT


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


class _Request(GuardedConnection):
    """One connection: one request, one answer, then closed (HTTP/1.0), all within `CONNECTION_DEADLINE`."""

    def __init__(self, server: MetricsServer):
        super().__init__(server.table, CONNECTION_DEADLINE)
        self._server = server
        self._head = bytearray()
        self._answering = False

    def received(self, data: bytes) -> None:
        if self._answering:
            return  # anything after the request is not read
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_REQUEST_BYTES:
                self._answer(_error(431, "request header too large"))
            return
        self._answering = True
        asyncio.get_running_loop().create_task(self._serve(bytes(self._head[:end])))

    async def _serve(self, head: bytes) -> None:
        request_line, _, header_lines = head.partition(b"\r\n")
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            self._answer(_error(400, "malformed request line"))
            return
        if parts[0] != b"GET":
            self._answer(_error(501, "only GET is served here"))
            return
        try:
            path = urllib.parse.urlsplit(parts[1].decode("latin-1")).path
        except ValueError:  # e.g. "http://[": unanswered, it would fail the task and log its traceback
            self._answer(_error(400, "malformed request target"))
            return
        if path != PATH:
            self._answer(_error(404, f"only {PATH} is served here"))
            return
        headers = _headers(header_lines)
        self._answer(await self._server.render(headers.get("accept", ""), headers.get("accept-encoding", "")))

    def _answer(self, answer: bytes) -> None:
        self._answering = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()  # once written; the deadline cuts off a client that does not read it


def _headers(lines: bytes) -> dict[str, str]:
    """The headers a scrape is answered by, names in lower case; the others are not looked at."""
    found = {}
    for line in lines.split(b"\r\n"):
        name, _, value = line.partition(b":")
        found[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return found


def _response(status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [f"HTTP/1.0 {status} {reason}", *(f"{name}: {value}" for name, value in headers),
             f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def _error(status: int, message: str) -> bytes:
    return _response(status, http.HTTPStatus(status).phrase, [("Content-Type", "text/plain; charset=utf-8")],
                     f"{message}\n".encode())


@dataclasses.dataclass(frozen=True)
class _Page:
    answer: bytes
    reusable: bool
    """False for a failure, which the next scrape tries again."""


class MetricsServer:
    """Serves `registry` on `port` (0: a free port, see `.port`) from the watchdog's serving loop."""

    def __init__(self, port: int, registry: CollectorRegistry, loop: LoopThread | None = None):
        self._registry = registry
        self._loop = loop or shared_loop()
        # Collections run here, one at a time, off the loop: reading the value files takes milliseconds
        # that probes must not wait for. Its thread starts with the first scrape.
        self._collector = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-collect")
        self._socket = listening_socket(port)
        self.port = self._socket.getsockname()[1]
        # After the socket: a port that cannot be bound claims no descriptors.
        self.table = ConnectionTable("metrics", MAX_CONNECTIONS)
        self._listener: asyncio.Server | None = None
        # The last page of each format (content type, gzipped), when its collection started; one entry per
        # format the encoders know, whatever clients ask. Only touched on the loop's thread.
        self._pages: dict[tuple[str, bool], tuple[float, asyncio.Future[_Page]]] = {}

    def _page(self, encoder: Callable[[CollectorRegistry], bytes], content_type: str, gzipped: bool) -> _Page:
        try:
            body = encoder(self._registry)
        except Exception as exc:  # a scrape must never take the watchdog down
            logger.opt(exception=True).warning("Metrics collection failed", err=f"{type(exc).__name__}: {exc}")
            return _Page(_error(500, "metrics collection failed"), reusable=False)
        headers = [("Content-Type", content_type)]
        if gzipped:
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        return _Page(_response(200, "OK", headers, body), reusable=True)

    async def render(self, accept: str, accept_encoding: str) -> bytes:
        """The answer to a scrape: a page collected for it, or one collected less than PAGE_REUSE_SECONDS ago
        (or being collected) in the same format, so that clients scraping back to back cost one collection
        a second between them."""
        encoder, content_type = answered_format(accept)
        gzipped = gzip_accepted(accept_encoding)
        key = (content_type, gzipped)
        now = time.monotonic()
        cached = self._pages.get(key)
        if cached is None or (cached[1].done() and (now - cached[0] >= PAGE_REUSE_SECONDS
                                                    or not cached[1].result().reusable)):
            future = asyncio.get_running_loop().run_in_executor(self._collector, self._page, encoder, content_type,
                                                                gzipped)
            cached = self._pages[key] = (now, future)
        return (await asyncio.shield(cached[1])).answer

    async def _start(self) -> None:
        self._listener = await serve(lambda: _Request(self), self._socket)

    def start(self) -> None:
        self._loop.call(self._start())

    async def _stop(self) -> None:
        if self._listener is not None:
            self._listener.close()

    def stop(self) -> None:
        self._loop.call(self._stop())
        self._socket.close()
        # A collection in progress ends by itself; the process does not wait for it.
        self._collector.shutdown(wait=False)
        self.table.release()


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
        """What the watchdog last judged; the first call starts listening."""
        if self._port < 0:
            return
        self._state.update(view)
        if self._server is None:
            self._listen()

    def _listen(self) -> None:
        server = None
        try:
            server = MetricsServer(self._port, self._registry)
            server.start()
        except OSError as exc:  # TimeoutError too: the serving loop did not start it in time
            if server is not None:
                server.stop()  # the port it holds, to be bound again at the next update
            if not self._failure_logged:
                logger.error("Metrics endpoint cannot listen; retrying", port=self._port, err=str(exc))
                self._failure_logged = True
            return
        self._server = server
        logger.info("Metrics endpoint listening", port=server.port, path=PATH)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
