"""Allocation tracing (shared.observability.tracing) with an in-memory exporter; the OTLP path is in
tests/integration/test_observability.py."""

import subprocess
import sys
import threading

import pytest
from loguru import logger
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from resource_worker.allocation import AllocationError, ErrorKind
from shared.observability import tracing

NPU = "rebellions.ai/npu"


@pytest.fixture
def logged():
    """Every loguru record logged during the test."""
    captured = []
    handler = logger.add(lambda message: captured.append(message.record), level="DEBUG")
    yield captured
    logger.remove(handler)


@pytest.mark.parametrize("endpoint,expected", [
    ("collector:4317", ("http://collector:4317", True)),
    ("10.0.0.7:4317", ("http://10.0.0.7:4317", True)),
    ("[fd00::7]:4317", ("http://[fd00::7]:4317", True)),
    ("http://collector:4317", ("http://collector:4317", True)),
    ("https://collector.observability.svc:4317", ("https://collector.observability.svc:4317", False)),
    ("https://collector:4317/", ("https://collector:4317", False)),
])
def test_host_port_is_plaintext_and_an_https_url_is_tls(endpoint, expected):
    assert tracing.parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", [
    "collector", "collector:", "collector:port", "collector:99999", "grpc://collector:4317", "https://:4317",
    "https://collector:4317/v1/traces", "collector:4317?x=1", "http://",
])
def test_malformed_endpoints_are_refused(endpoint):
    with pytest.raises(tracing.TracingSetupError):
        tracing.parse_endpoint(endpoint)


def test_without_an_endpoint_the_sdk_is_never_imported():
    """In a fresh interpreter: the whole worker, tracing off (and tracing given up), one Allocate's spans."""
    code = """
import sys
import resource_worker.main
from shared.observability.tracing import setup_tracing
for endpoint in ("", "not an endpoint"):
    tracer = setup_tracing(endpoint, "1.0", "node-a")
    with tracer.allocate("rebellions.ai/npu") as trace:
        with trace.container(["rbln0"], ["0000:03:00.0"]) as span:
            span.rsd_group("/dev/rsd1")
        trace.refused([["rbln9"]], ValueError("unknown"))
    tracer.shutdown()
print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert "Distributed tracing disabled; no OTLP endpoint configured" in result.stderr
    assert "Tracing setup failed; continuing without distributed tracing" in result.stderr


def test_setup_records(logged):
    tracing.setup_tracing("", "1.0", "node-a")
    tracing.setup_tracing("collector", "1.0", "node-a")
    enabled = tracing.setup_tracing("https://collector:4317", "1.0", "node-a")
    enabled.shutdown()
    disabled, failed, started = logged
    assert (disabled["level"].name, disabled["message"]) == (
        "INFO", "Distributed tracing disabled; no OTLP endpoint configured")
    assert (failed["level"].name, failed["message"]) == (
        "WARNING", "Tracing setup failed; continuing without distributed tracing")
    assert failed["extra"]["otlpEndpoint"] == "collector" and "host:port" in failed["extra"]["err"]
    assert (started["level"].name, started["message"]) == ("INFO", "Distributed tracing enabled")
    assert started["extra"] == {"otlpEndpoint": "https://collector:4317", "tls": True}


@pytest.fixture
def exported():
    """(tracer, exporter): a tracer exporting to memory; shutdown() flushes it."""
    exporter = InMemorySpanExporter()
    return tracing.AllocationTracer(tracing.tracer_provider(exporter, "1.2.3", "node-a")), exporter


def by_name(spans):
    allocate = [s for s in spans if s.name == tracing.ALLOCATE_SPAN]
    containers = [s for s in spans if s.name == tracing.CONTAINER_SPAN]
    assert len(allocate) == 1 and len(allocate) + len(containers) == len(spans)
    return allocate[0], containers


def test_an_allocation_is_one_allocate_span_with_a_child_per_container(exported):
    tracer, exporter = exported
    with tracer.allocate(NPU) as trace:
        with trace.container(["rbln1", "rbln0"], ["0000:06:00.0", "0000:03:00.0"]) as span:
            span.rsd_group("/dev/rsd1")
        with trace.container(["rbln2"], ["0000:09:00.0"]) as span:
            span.rsd_group("/dev/rsd2")
    assert exporter.get_finished_spans() == ()  # batched, not exported on the caller's thread
    tracer.shutdown()  # flushes what is queued
    allocate, (first, second) = by_name(exporter.get_finished_spans())
    assert dict(allocate.attributes) == {"rbln.resource_name": NPU}
    assert allocate.parent is None and allocate.status.status_code is StatusCode.UNSET
    assert dict(first.attributes) == {
        "rbln.resource_name": NPU, "rbln.device.ids": ("rbln1", "rbln0"), "rbln.device.count": 2,
        "rbln.device.bus_ids": ("0000:03:00.0", "0000:06:00.0"), "rbln.rsd.host_path": "/dev/rsd1"}
    assert second.attributes["rbln.rsd.host_path"] == "/dev/rsd2"
    for child in (first, second):
        assert child.parent.span_id == allocate.context.span_id
        assert child.context.trace_id == allocate.context.trace_id
    resource = allocate.resource.attributes
    assert {key: resource[key] for key in ("service.name", "service.version", "k8s.node.name")} == {
        "service.name": "rbln-device-plugin", "service.version": "1.2.3", "k8s.node.name": "node-a"}


def assert_failed(span, error):
    assert span.status.status_code is StatusCode.ERROR and str(error) in span.status.description
    (event,) = span.events
    assert event.name == "exception" and event.attributes["exception.message"] == str(error)


def test_a_container_that_fails_records_the_error_on_both_spans(exported):
    tracer, exporter = exported
    error = AllocationError(ErrorKind.RSD_GROUP_FAILED, "RSD group for rbln0 failed: rbln-smi exited 1", ["rbln0"])
    with pytest.raises(AllocationError):
        with tracer.allocate(NPU) as trace:
            with trace.container(["rbln0"], ["0000:03:00.0"]):
                raise error
    tracer.shutdown()
    allocate, (container,) = by_name(exporter.get_finished_spans())
    assert_failed(allocate, error)
    assert_failed(container, error)
    assert "rbln.rsd.host_path" not in container.attributes


def test_a_refused_request_has_a_failed_child_per_container_request(exported):
    tracer, exporter = exported
    error = AllocationError(ErrorKind.UNKNOWN_DEVICE, "unknown device 'rbln9'", ["rbln9"])
    with pytest.raises(AllocationError):
        with tracer.allocate(NPU) as trace:
            trace.refused([["rbln0"], ["rbln9", "rbln1"]], error)
            raise error
    tracer.shutdown()
    allocate, containers = by_name(exporter.get_finished_spans())
    assert_failed(allocate, error)
    assert [dict(c.attributes) for c in containers] == [
        {"rbln.resource_name": NPU, "rbln.device.ids": ("rbln0",), "rbln.device.count": 1},
        {"rbln.resource_name": NPU, "rbln.device.ids": ("rbln9", "rbln1"), "rbln.device.count": 2}]
    for container in containers:
        assert_failed(container, error)
        assert container.parent.span_id == allocate.context.span_id


class StuckExporter(InMemorySpanExporter):
    """An exporter whose export blocks until released, like a collector that never answers."""

    def __init__(self):
        super().__init__()
        self.exporting = threading.Event()
        self.release = threading.Event()
        self.threads = set()

    def export(self, spans):
        self.threads.add(threading.get_ident())
        self.exporting.set()
        self.release.wait(30)
        return super().export(spans)


def test_allocations_never_wait_for_the_exporter(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")  # milliseconds: the batch thread exports at once
    exporter = StuckExporter()
    tracer = tracing.AllocationTracer(tracing.tracer_provider(exporter, "1.0", "node-a"))

    def allocate():
        with tracer.allocate(NPU) as trace:
            with trace.container(["rbln0"], ["0000:03:00.0"]) as span:
                span.rsd_group("/dev/rsd1")

    allocate()
    assert exporter.exporting.wait(10)  # the batch thread is now stuck in export
    later = threading.Thread(target=lambda: [allocate() for _ in range(20)])
    later.start()
    later.join(timeout=10)
    finished = not later.is_alive()
    exported_from = set(exporter.threads)
    exporter.release.set()
    tracer.shutdown()  # exports the rest on this thread
    assert finished and exported_from and threading.get_ident() not in exported_from
    assert len(exporter.get_finished_spans()) == 42


def test_shutdown_gives_up_on_a_collector_that_never_answers(logged):
    exporter = StuckExporter()
    tracer = tracing.AllocationTracer(tracing.tracer_provider(exporter, "1.0", "node-a"), flush_timeout=0.2)
    with tracer.allocate(NPU):
        pass
    ended = threading.Thread(target=tracer.shutdown)
    ended.start()
    ended.join(timeout=10)
    stuck = exporter.exporting.wait(10) and not exporter.release.is_set()
    exporter.release.set()
    assert not ended.is_alive() and stuck
    (record,) = logged
    assert (record["level"].name, record["message"], record["extra"]["component"]) == (
        "WARNING", "OpenTelemetry SDK error", "otel")
    assert "not exported within 0.2s" in record["extra"]["err"]


def test_shutdown_never_raises(logged):
    class BrokenProvider:
        def get_tracer(self, name):
            return None

        def shutdown(self):
            raise RuntimeError("exporter thread died")

    tracing.AllocationTracer(BrokenProvider()).shutdown()
    (record,) = logged
    assert (record["level"].name, record["message"], record["extra"]["component"]) == (
        "WARNING", "OpenTelemetry SDK error", "otel")
    assert record["extra"]["err"] == "RuntimeError: exporter thread died"


def test_a_node_prepare_is_one_span_with_a_child_per_claim_naming_its_devices(exported):
    tracer, exporter = exported
    with tracer.prepare(2) as trace:
        trace.claim("uid-1", "default/one", ["rbln0", "rbln1"], "/dev/rsd3", None)
        trace.claim("uid-2", "default/two", [], None, "device rbln0 is already prepared for claim uid-1")
    tracer.shutdown()
    spans = exporter.get_finished_spans()
    (prepare,) = [s for s in spans if s.name == tracing.PREPARE_SPAN]
    good, bad = [s for s in spans if s.name == tracing.CLAIM_SPAN]
    assert dict(prepare.attributes) == {"rbln.claim.count": 2} and prepare.parent is None
    assert dict(good.attributes) == {"rbln.claim.uid": "uid-1", "rbln.claim.name": "default/one",
                                     "rbln.device.ids": ("rbln0", "rbln1"), "rbln.device.count": 2,
                                     "rbln.rsd.host_path": "/dev/rsd3"}
    assert good.parent.span_id == prepare.context.span_id and good.status.status_code is StatusCode.UNSET
    assert bad.status.status_code is StatusCode.ERROR
    assert bad.attributes["rbln.claim.error"] == "device rbln0 is already prepared for claim uid-1"
