"""Allocation traces over OTLP/gRPC; never allowed to get in the way of an allocation.

With no endpoint configured the OpenTelemetry SDK is never imported and every
call here is a no-op. A malformed endpoint is reported once and tracing stays
off. Spans are handed to a batch processor whose own thread exports them, so
an unreachable collector only produces warnings from that thread (see
shared.observability.log: `OpenTelemetry SDK error`), never a slower Allocate.

Each kubelet Allocate is one `Allocate` span with one `allocateContainer`
child per container request; the attribute keys are the Go original's. In DRA mode each
NodePrepareResources is one `NodePrepareResources` span with one `prepareClaim` child per claim.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

from loguru import logger

from shared.observability.log import OTEL_ERROR_MESSAGE

SERVICE_NAME = "rbln-device-plugin"
ALLOCATE_SPAN = "Allocate"
CONTAINER_SPAN = "allocateContainer"
ATTR_RESOURCE_NAME = "rbln.resource_name"
ATTR_DEVICE_IDS = "rbln.device.ids"
ATTR_DEVICE_COUNT = "rbln.device.count"
ATTR_BUS_IDS = "rbln.device.bus_ids"
ATTR_RSD_HOST_PATH = "rbln.rsd.host_path"
# worker-dra: one span per NodePrepareResources call, one child per claim.
PREPARE_SPAN = "NodePrepareResources"
CLAIM_SPAN = "prepareClaim"
ATTR_CLAIM_UID = "rbln.claim.uid"
ATTR_CLAIM = "rbln.claim.name"
ATTR_CLAIM_COUNT = "rbln.claim.count"
ATTR_CLAIM_ERROR = "rbln.claim.error"
# One export attempt (with the exporter's retries) gives up after this long.
EXPORT_TIMEOUT_SECONDS = 3
# The flush at shutdown gives up after this long: a worker must stop well within supervisord's stop grace.
FLUSH_TIMEOUT_SECONDS = 3


class TracingSetupError(ValueError):
    pass


def parse_endpoint(endpoint: str) -> tuple[str, bool]:
    """(exporter endpoint URL, insecure). `host:port` is plaintext; a URL keeps its scheme (https = TLS)."""
    if "://" in endpoint:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in ("http", "https"):
            raise TracingSetupError(f"endpoint {endpoint!r}: scheme must be http or https")
    else:
        url = urllib.parse.urlsplit(f"http://{endpoint}")
    try:
        port = url.port
    except ValueError as exc:
        raise TracingSetupError(f"endpoint {endpoint!r}: {exc}") from None
    if not url.hostname or port is None or url.path not in ("", "/") or url.query or url.fragment:
        raise TracingSetupError(f"endpoint {endpoint!r}: expected host:port or http(s)://host:port")
    return f"{url.scheme}://{url.netloc}", url.scheme != "https"


def _mark_failed(span: Any, error: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


class ContainerSpan:
    """One container's `allocateContainer` span (or nothing, with tracing off)."""

    def __init__(self, span: Any = None):
        self._span = span

    def rsd_group(self, host_path: str) -> None:
        if self._span is not None:
            self._span.set_attribute(ATTR_RSD_HOST_PATH, host_path)


class AllocateTrace:
    """The spans of one Allocate call; an exception leaving a span's block is recorded on it."""

    def __init__(self, tracer: Any, resource_name: str):
        self._tracer = tracer
        self._resource_name = resource_name

    def _container_attributes(self, device_ids: Sequence[str], bus_ids: Sequence[str]) -> dict[str, Any]:
        attributes: dict[str, Any] = {ATTR_RESOURCE_NAME: self._resource_name, ATTR_DEVICE_IDS: list(device_ids),
                                      ATTR_DEVICE_COUNT: len(device_ids)}
        if bus_ids:
            attributes[ATTR_BUS_IDS] = sorted(bus_ids)
        return attributes

    @contextlib.contextmanager
    def container(self, device_ids: Sequence[str], bus_ids: Sequence[str]) -> Iterator[ContainerSpan]:
        if self._tracer is None:
            yield ContainerSpan()
            return
        with self._tracer.start_as_current_span(CONTAINER_SPAN,
                                                attributes=self._container_attributes(device_ids, bus_ids),
                                                record_exception=True, set_status_on_exception=True) as span:
            yield ContainerSpan(span)

    def refused(self, requests: Sequence[Sequence[str]], error: BaseException) -> None:
        """The request was refused before any container was worked on: one failed child per container."""
        if self._tracer is None:
            return
        for device_ids in requests:
            with self._tracer.start_as_current_span(CONTAINER_SPAN,
                                                    attributes=self._container_attributes(device_ids, ())) as span:
                _mark_failed(span, error)


class PrepareTrace:
    """The spans of one NodePrepareResources call: a child per claim with its devices and RSD group."""

    def __init__(self, tracer: Any):
        self._tracer = tracer

    def claim(self, uid: str, name: str, device_ids: Sequence[str], rsd_host_path: str | None,
              error: str | None) -> None:
        if self._tracer is None:
            return
        attributes: dict[str, Any] = {ATTR_CLAIM_UID: uid, ATTR_CLAIM: name, ATTR_DEVICE_IDS: list(device_ids),
                                      ATTR_DEVICE_COUNT: len(device_ids)}
        if rsd_host_path:
            attributes[ATTR_RSD_HOST_PATH] = rsd_host_path
        with self._tracer.start_as_current_span(CLAIM_SPAN, attributes=attributes) as span:
            if error is not None:
                span.set_attribute(ATTR_CLAIM_ERROR, error)
                _mark_failed(span, RuntimeError(error))


class AllocationTracer:
    """Opens the spans of each Allocate; a no-op without a tracer provider."""

    def __init__(self, provider: Any = None, flush_timeout: float = FLUSH_TIMEOUT_SECONDS):
        self._provider = provider
        self._flush_timeout = flush_timeout
        self._tracer = provider.get_tracer(SERVICE_NAME) if provider is not None else None

    @contextlib.contextmanager
    def allocate(self, resource_name: str) -> Iterator[AllocateTrace]:
        if self._tracer is None:
            yield AllocateTrace(None, resource_name)
            return
        with self._tracer.start_as_current_span(ALLOCATE_SPAN, attributes={ATTR_RESOURCE_NAME: resource_name},
                                                record_exception=True, set_status_on_exception=True):
            yield AllocateTrace(self._tracer, resource_name)

    @contextlib.contextmanager
    def prepare(self, claim_count: int) -> Iterator[PrepareTrace]:
        if self._tracer is None:
            yield PrepareTrace(None)
            return
        with self._tracer.start_as_current_span(PREPARE_SPAN, attributes={ATTR_CLAIM_COUNT: claim_count},
                                                record_exception=True, set_status_on_exception=True):
            yield PrepareTrace(self._tracer)

    def shutdown(self) -> None:
        """Export the spans still queued and stop the exporter, giving up after the flush timeout.

        The SDK's own shutdown may wait for an export in progress and then for the
        final one, each up to the export timeout; it runs on a daemon thread so
        that a collector that does not answer never holds up the process's exit.
        """
        if self._provider is None:
            return
        failure: list[BaseException] = []

        def stop() -> None:
            try:
                self._provider.shutdown()  # the batch thread exports everything queued, then ends
            except Exception as exc:  # tracing must never stop a clean shutdown
                failure.append(exc)

        stopping = threading.Thread(target=stop, name="tracing-shutdown", daemon=True)
        stopping.start()
        stopping.join(self._flush_timeout)
        if stopping.is_alive():
            logger.warning(OTEL_ERROR_MESSAGE, component="otel",
                           err=f"queued spans not exported within {self._flush_timeout:g}s of shutdown; dropped")
        elif failure:
            logger.warning(OTEL_ERROR_MESSAGE, component="otel", err=f"{type(failure[0]).__name__}: {failure[0]}")


def tracer_provider(exporter: Any, version: str, node_name: str) -> Any:
    """A provider exporting to `exporter` from a background batch thread, describing this plugin and node."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": SERVICE_NAME, "service.version": version,
                                "k8s.node.name": node_name})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def setup_tracing(endpoint: str, version: str, node_name: str) -> AllocationTracer:
    if not endpoint:
        logger.info("Distributed tracing disabled; no OTLP endpoint configured")
        return AllocationTracer()
    try:
        url, insecure = parse_endpoint(endpoint)
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=url, insecure=insecure, timeout=EXPORT_TIMEOUT_SECONDS)
        provider = tracer_provider(exporter, version, node_name)
    except Exception as exc:  # tracing must never stop the plugin
        logger.warning("Tracing setup failed; continuing without distributed tracing", otlpEndpoint=endpoint,
                       err=str(exc) or type(exc).__name__)
        return AllocationTracer()
    logger.info("Distributed tracing enabled", otlpEndpoint=endpoint, tls=not insecure)
    return AllocationTracer(provider)
