"""Allocation traces over OTLP/gRPC, strictly best effort.

With no endpoint configured the OpenTelemetry SDK is never imported and every
call here is a no-op. A malformed endpoint is reported once and tracing stays
off; an unreachable collector only produces warnings from the exporter's
background thread, never a slower Allocate.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

from loguru import logger

SERVICE_NAME = "rbln-device-plugin"
_EXPORT_TIMEOUT_SECONDS = 3
_FLUSH_TIMEOUT_MILLIS = 3000


class TracingSetupError(ValueError):
    pass


def parse_endpoint(endpoint: str) -> tuple[str, bool]:
    """(exporter endpoint URL, insecure). `host:port` is plaintext; a URL with a scheme keeps it."""
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
    if not url.hostname or port is None or url.path not in ("", "/") or url.query:
        raise TracingSetupError(f"endpoint {endpoint!r}: expected host:port or http(s)://host:port")
    return f"{url.scheme}://{url.netloc}", url.scheme != "https"


class ContainerSpan:
    def __init__(self, span: Any = None):
        self._span = span

    def allocated(self, device_ids: Sequence[str], bus_ids: Sequence[str], rsd_host_path: str) -> None:
        if self._span is not None:
            self._span.set_attribute("rbln.device.ids", list(device_ids))
            self._span.set_attribute("rbln.device.count", len(device_ids))
            self._span.set_attribute("rbln.device.bus_ids", sorted(bus_ids))
            self._span.set_attribute("rbln.rsd.host_path", rsd_host_path)


class AllocationTracer:
    """Opens the `Allocate` span and its `allocateContainer` children; a no-op without a provider."""

    def __init__(self, provider: Any = None):
        self._provider = provider
        self._tracer = provider.get_tracer("rbln-device-plugin.allocate") if provider is not None else None

    @contextlib.contextmanager
    def allocate(self, resource_name: str) -> Iterator[None]:
        if self._tracer is None:
            yield
            return
        with self._tracer.start_as_current_span("Allocate", attributes={"rbln.resource_name": resource_name},
                                                record_exception=True, set_status_on_exception=True):
            yield

    @contextlib.contextmanager
    def container(self, device_ids: Sequence[str]) -> Iterator[ContainerSpan]:
        if self._tracer is None:
            yield ContainerSpan()
            return
        with self._tracer.start_as_current_span(
                "allocateContainer", attributes={"rbln.device.ids": list(device_ids),
                                                 "rbln.device.count": len(device_ids)},
                record_exception=True, set_status_on_exception=True) as span:
            yield ContainerSpan(span)

    def failed_containers(self, requests: Sequence[Sequence[str]], error: Exception) -> None:
        """Record a request refused before any container was worked on, on one child span per container."""
        for device_ids in requests:
            try:
                with self.container(device_ids):
                    raise error
            except type(error):
                pass

    def shutdown(self) -> None:
        """Flush queued spans (bounded) and stop the exporter."""
        if self._provider is not None:
            self._provider.force_flush(_FLUSH_TIMEOUT_MILLIS)
            self._provider.shutdown()


def setup_tracing(endpoint: str, version: str, node_name: str) -> AllocationTracer:
    if not endpoint:
        logger.info("Distributed tracing disabled; no OTLP endpoint configured")
        return AllocationTracer()
    try:
        url, insecure = parse_endpoint(endpoint)
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": SERVICE_NAME, "service.version": version,
                                    "k8s.node.name": node_name})
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        exporter = OTLPSpanExporter(endpoint=url, insecure=insecure, timeout=_EXPORT_TIMEOUT_SECONDS)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    except Exception as exc:  # tracing must never stop the plugin
        logger.warning("Tracing setup failed; continuing without distributed tracing", endpoint=endpoint,
                       err=str(exc))
        return AllocationTracer()
    logger.info("Distributed tracing enabled", endpoint=url, insecure=insecure)
    return AllocationTracer(provider)
