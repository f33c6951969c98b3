"""Traces and logs of the real stack: allocation spans reaching an in-process OTLP collector, tracing
trouble that never stops an allocation, and the spec's log catalogue through a node's lifecycle."""

from __future__ import annotations

import argparse
import socket
import threading
from collections.abc import Callable
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from rbln_device_plugin import logs as logs_command
from shared.config import ResourceApi
from shared.observability import tracing
from shared.programs import expected_programs
from shared.resources import Resource
from shared.version import VERSION
from tests.support.certificates import self_signed

NPU = Resource.NPU.value
# The lifecycle's node has whole NPUs only: the scanner, worker-npu and the watchdog run.
PROGRAMS = expected_programs(ResourceApi.DEVICE_PLUGIN, [NPU])
TRACING_MESSAGES = ("Distributed tracing enabled", "Distributed tracing disabled; no OTLP endpoint configured",
                    "Tracing setup failed; continuing without distributed tracing", "OpenTelemetry SDK error")


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind)


def attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector on 127.0.0.1: records every span with its resource's attributes."""

    def __init__(self, credentials: grpc.ServerCredentials | None = None):
        # Guards `received`; notified on every export.
        self._changed = threading.Condition()
        self.received: list[tuple[dict, trace_pb2.Span]] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        if credentials is None:
            self.port = self._server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self._server.add_secure_port("127.0.0.1:0", credentials)
        self._server.start()

    def Export(self, request, context):
        with self._changed:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.received.extend((resource, span) for span in scope_spans.spans)
            self._changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, predicate: Callable[[list], bool], timeout: float = 10.0) -> list:
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self.received), timeout), self.received
            return list(self.received)

    def stop(self) -> None:
        self._server.stop(None)


@pytest.fixture
def collector():
    running = Collector()
    yield running
    running.stop()


def traces(received) -> list[tuple[trace_pb2.Span, list[trace_pb2.Span]]]:
    """(Allocate span, its allocateContainer children) per trace, in the order the Allocates started."""
    allocates = sorted((span for _, span in received if span.name == tracing.ALLOCATE_SPAN),
                       key=lambda span: span.start_time_unix_nano)
    return [(allocate, sorted((span for _, span in received if span.parent_span_id == allocate.span_id),
                              key=lambda span: span.start_time_unix_nano)) for allocate in allocates]


def failed(span, *words) -> bool:
    events = {event.name: attributes(event.attributes) for event in span.events}
    return (span.status.code == trace_pb2.Status.STATUS_CODE_ERROR and "exception" in events
            and all(word in events["exception"]["exception.message"] for word in words))


def all_healthy(ids):
    return {device: "Healthy" for device in ids}


def test_allocations_are_traced_to_an_otlp_collector(make_node, kubelet, start_stack, collector):
    node = make_node("3")
    # A batch delay longer than the test: the spans can only leave with the flush at shutdown.
    stack = start_stack(node, OTEL_EXPORTER_OTLP_ENDPOINT=f"127.0.0.1:{collector.port}", NODE_NAME="node-a",
                        OTEL_BSP_SCHEDULE_DELAY="600000")
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1", "rbln2"]), timeout=30)
    response = kubelet.allocate(NPU, [["rbln1", "rbln0"], ["rbln2"]])
    rsd_paths = [next(d.host_path for d in c.devices if d.container_path == "/dev/rsd0")
                 for c in response.container_responses]
    with pytest.raises(grpc.RpcError):
        kubelet.allocate(NPU, [["rbln0"], ["rbln9"]])  # refused: rbln9 is no device of this node
    node.set_smi_fault("exit", commands=["create"])
    with pytest.raises(grpc.RpcError):
        kubelet.allocate(NPU, [["rbln2"]])  # the RSD group cannot be made
    (enabled,) = stack.wait_for_record("Distributed tracing enabled", process=Resource.NPU.process_name)
    assert enabled["otlpEndpoint"] == f"127.0.0.1:{collector.port}" and enabled["tls"] is False
    # The workers whose resources this node lacks never set tracing up (it is made when devices appear).
    assert [r["process"] for r in stack.find("Distributed tracing enabled")] == [Resource.NPU.process_name]
    assert collector.received == []
    stack.stop()

    received = collector.wait_for(lambda spans: len(spans) >= 8)
    bus = {device: node.device(device).bus_id for device in ("rbln0", "rbln1", "rbln2")}
    for resource, _ in received:
        assert resource["service.name"] == "rbln-device-plugin" and resource["service.version"] == VERSION
        assert resource["k8s.node.name"] == "node-a"
    (ok, ok_children), (refused, refused_children), (broken, broken_children) = traces(received)
    for allocate, children in traces(received):
        assert attributes(allocate.attributes) == {"rbln.resource_name": NPU} and allocate.parent_span_id == b""
        assert all(child.trace_id == allocate.trace_id for child in children)

    assert ok.status.code == trace_pb2.Status.STATUS_CODE_UNSET
    assert [attributes(child.attributes) for child in ok_children] == [
        {"rbln.resource_name": NPU, "rbln.device.ids": ["rbln1", "rbln0"], "rbln.device.count": 2,
         "rbln.device.bus_ids": sorted([bus["rbln0"], bus["rbln1"]]), "rbln.rsd.host_path": rsd_paths[0]},
        {"rbln.resource_name": NPU, "rbln.device.ids": ["rbln2"], "rbln.device.count": 1,
         "rbln.device.bus_ids": [bus["rbln2"]], "rbln.rsd.host_path": rsd_paths[1]}]

    assert failed(refused, "rbln9")
    assert [attributes(child.attributes)["rbln.device.ids"] for child in refused_children] == [["rbln0"], ["rbln9"]]
    assert all(failed(child, "rbln9") for child in refused_children)

    assert failed(broken, "RSD group") and len(broken_children) == 1
    assert failed(broken_children[0], "RSD group")
    assert attributes(broken_children[0].attributes)["rbln.device.bus_ids"] == [bus["rbln2"]]
    assert "rbln.rsd.host_path" not in attributes(broken_children[0].attributes)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("trouble", ["unreachable collector", "malformed endpoint"])
def test_tracing_trouble_is_a_warning_and_never_stops_allocation(make_node, kubelet, start_stack, trouble):
    node = make_node("2")
    if trouble == "unreachable collector":
        # Exports every 100 ms, so the exporter is failing while the kubelet allocates.
        stack = start_stack(node, OTEL_EXPORTER_OTLP_ENDPOINT=f"127.0.0.1:{closed_port()}",
                            OTEL_BSP_SCHEDULE_DELAY="100")
        expected = "OpenTelemetry SDK error"
    else:
        stack = start_stack(node, OTEL_EXPORTER_OTLP_ENDPOINT="collector:not-a-port")
        expected = "Tracing setup failed; continuing without distributed tracing"
    kubelet.wait_for_devices(NPU, all_healthy(["rbln0", "rbln1"]), timeout=30)
    if trouble == "unreachable collector":
        kubelet.allocate(NPU, [["rbln0"]])  # a first span, for the exporter to fail on
    stack.wait_for_record(expected, process="worker-npu")
    response = kubelet.allocate(NPU, [["rbln1"]])
    assert [d.host_path for d in response.container_responses[0].devices][1:] == ["/dev/rbln1"]
    stack.stop()

    warnings = stack.find(expected, process="worker-npu")
    assert warnings and all(r["level"] == "warn" and r["err"] for r in warnings)
    if trouble == "unreachable collector":
        assert all(r["component"] == "otel" for r in warnings)
        assert not stack.find("Distributed tracing disabled; no OTLP endpoint configured")
    else:
        assert warnings[0]["otlpEndpoint"] == "collector:not-a-port"
        assert not stack.find("Distributed tracing enabled")
    tracing_records = [r for r in stack.records if r["msg"] in TRACING_MESSAGES or r.get("component") == "otel"]
    assert {r["level"] for r in tracing_records} <= {"debug", "info", "warn"}
    # The flush at shutdown gives up in time: the worker ends cleanly.
    assert stack.find("Shutdown", process="worker-npu")


def test_tls_endpoint_exports_over_tls(tmp_path, monkeypatch):
    """An https:// endpoint: the exporter verifies the collector's certificate (here a self-signed one)."""
    key, cert = self_signed(tmp_path)
    secure = Collector(grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())]))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert))
    try:
        tracer = tracing.setup_tracing(f"https://localhost:{secure.port}", VERSION, "node-a")
        with tracer.allocate(NPU) as trace:
            with trace.container(["rbln0"], ["0000:03:00.0"]) as span:
                span.rsd_group("/dev/rsd1")
        tracer.shutdown()
        received = secure.wait_for(lambda spans: len(spans) == 2)
    finally:
        secure.stop()
    assert {span.name for _, span in received} == {tracing.ALLOCATE_SPAN, tracing.CONTAINER_SPAN}


# -- the log catalogue -----------------------------------------------------------------------------


def one(stack, msg, **fields):
    """The one record with `msg` and `fields`, once it has arrived (stdout lags behind gRPC answers)."""
    (record,) = stack.wait_for_record(msg, **fields)
    return record


def test_the_log_catalogue_through_a_node_lifecycle(make_node, kubelet, start_stack, capsys):
    node = make_node("3")
    stack = start_stack(node, RBLN_DEVICE_PLUGIN_LOG_LEVEL="debug", RBLN_DEVICE_PLUGIN_LOG_FORMAT="yaml",
                        NODE_NAME="node-a")
    ids = ["rbln0", "rbln1", "rbln2"]
    kubelet.wait_for_devices(NPU, all_healthy(ids), timeout=30)

    # Startup: each process's first record names the version and the resolved configuration; the
    # unusable format is reported next, and the stream stays JSON.
    stack.wait_for_record("Invalid log format; using the default", count=len(PROGRAMS))
    for process in PROGRAMS:
        first, second = stack.find(process=process)[:2]
        assert (first["msg"], first["level"], first["version"]) == ("Starting rbln-device-plugin", "info", VERSION)
        # The gate the stream is read through: the level set, and the default format that replaced yaml.
        assert (first["logLevel"], first["logFormat"]) == ("debug", "json")
        assert first["nodeName"] == "node-a" and first["deviceScanInterval"] == "200ms"
        assert first["kubeletDevicePluginPath"] == str(node.plugin_dir) and first["otlpEndpoint"] == ""
        assert (second["msg"], second["level"]) == ("Invalid log format; using the default", "warn")
        assert (second["value"], second["fallback"]) == ("yaml", "json")
    # Said by the worker that serves, when its devices appeared; the others never set tracing up.
    tracing_off = "Distributed tracing disabled; no OTLP endpoint configured"
    assert one(stack, tracing_off, process=Resource.NPU.process_name)["level"] == "info"
    assert len(stack.find(tracing_off)) == 1
    registered = one(stack, "Registered device plugin with kubelet", resourceName=NPU)
    assert registered["level"] == "info" and (registered["deviceCount"], registered["healthyCount"]) == (3, 3)
    for device in ids:
        exposed = one(stack, "Device exposed", device=device)
        assert (exposed["level"], exposed["health"], exposed["status"]) == ("info", "Healthy", "READY")
        assert exposed["resourceName"] == NPU and exposed["busID"] == node.device(device).bus_id

    # A steady node is silent at info; debug shows each scan with its duration.
    stack.wait_for_record("Probe state", ready=True)  # the watchdog too sees the startup done
    settled = len(stack.records)
    scans = len(stack.find("Reconciled device inventory"))
    stack.wait_for_record("Reconciled device inventory", count=scans + 5)
    assert [r for r in stack.records[settled:] if r["level"] != "debug"] == []
    for scan in stack.find("Reconciled device inventory"):
        assert scan["process"] == "scanner" and isinstance(scan["durationMs"], (int, float))

    # Inventory changes carry the resulting counts; an unhealthy device is a warning.
    node.set_status("rbln2", 4)
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy", "rbln2": "Unhealthy"})
    changed = one(stack, "Device state changed", device="rbln2")
    assert changed["level"] == "warn" and changed["resourceName"] == NPU
    assert (changed["health"], changed["status"], changed["previousHealth"], changed["previousStatus"]) == (
        "Unhealthy", "FAULT", "Healthy", "READY")
    assert (changed["deviceCount"], changed["healthyCount"], changed["unhealthyCount"]) == (3, 2, 1)
    node.remove_device("rbln1")
    stack.wait_for_record("Device disappeared from inventory", device="rbln1")
    node.restore_device("rbln1")
    appeared = stack.wait_for_record("Device appeared in inventory", device="rbln1")[0]
    gone = one(stack, "Device disappeared from inventory", device="rbln1")
    assert gone["level"] == "warn" and (gone["deviceCount"], gone["unhealthyCount"]) == (2, 1)
    assert appeared["level"] == "info" and (appeared["deviceCount"], appeared["healthyCount"]) == (3, 2)
    kubelet.wait_for_devices(NPU, {"rbln0": "Healthy", "rbln1": "Healthy", "rbln2": "Unhealthy"})
    assert stack.find("Sending device list to kubelet", level="debug")

    # Placement and allocation.
    kubelet.preferred_allocation(NPU, ["rbln0", "rbln1"], size=1)
    kubelet.preferred_allocation(NPU, ["rbln0", "rbln7"], size=1)
    assert one(stack, "Preferred allocation")["level"] == "debug"
    fallback = one(stack, "Preferred allocation fallback to kubelet")
    assert fallback["level"] == "warn" and fallback["err"]
    kubelet.allocate(NPU, [["rbln1", "rbln0"]])
    with pytest.raises(grpc.RpcError):
        kubelet.allocate(NPU, [["rbln2"]])
    bus = sorted(node.device(d).bus_id for d in ("rbln0", "rbln1"))
    starting = one(stack, "Starting container allocation")
    assert starting["level"] == "info" and starting["deviceIDs"] == ["rbln1", "rbln0"] and starting["busIDs"] == bus
    completed = one(stack, "Completed container allocation")
    assert completed["level"] == "info" and completed["deviceIDs"] == ["rbln0", "rbln1"]
    assert completed["busIDs"] == bus and isinstance(completed["durationMs"], (int, float))
    # A fresh node: list the groups and create one; how long rbln-smi took is part of the duration.
    assert completed["smiCalls"] == 2 and 0 < completed["smiMs"] <= completed["durationMs"]
    recreated = one(stack, "Recreated RSD group")
    assert recreated["level"] == "debug" and recreated["rsdGroup"] == completed["rsdGroup"] == "/dev/rsd1"
    assert recreated["busIDs"] == bus and recreated["replacedGroups"] == []
    refused = one(stack, "Container allocation failed")
    assert refused["level"] == "error" and refused["deviceIDs"] == ["rbln2"] and "FAULT" in refused["err"]
    assert isinstance(refused["durationMs"], (int, float))

    # The kubelet restarts: each worker restarts its device plugin and registers again; the faulted device is a
    # warning the first time the new instance sees it.
    kubelet.restart()
    stack.wait_for_record("Registered device plugin with kubelet", count=2, resourceName=NPU)
    assert one(stack, "Detected kubelet socket recreation; restarting device plugins")["level"] == "info"
    reexposed = stack.wait_for_record("Device exposed", count=2, device="rbln2")[1]
    assert (reexposed["level"], reexposed["health"], reexposed["status"]) == ("warn", "Unhealthy", "FAULT")
    # Only the worker serving devices has an instance to restart, in the same process.
    restarted = one(stack, "Restarting device plugin for the new kubelet")
    assert (restarted["process"], restarted["level"], restarted["resourceName"]) == ("worker-npu", "info", NPU)
    assert len(stack.find("Starting rbln-device-plugin")) == len(PROGRAMS)

    # Shutdown names the signal; every process's last record says it ended.
    stack.stop()
    for process in PROGRAMS:
        own = stack.find(process=process)
        assert own[-1]["msg"] == "Shutdown" and own[-1]["level"] == "info"
        assert stack.find("Shutdown signal received", process=process, signal="SIGTERM")

    # Every stdout line is one JSON record; at debug each names its caller; only unusable requests are errors.
    assert stack.raw_lines and len(stack.records) == len(stack.raw_lines)
    assert all(r["level"] in ("debug", "info", "warn", "error") and r.get("caller") for r in stack.records)
    assert {r["msg"] for r in stack.records if r["level"] == "error"} == {"Container allocation failed"}

    # The same records, per process, for a person.
    parser = argparse.ArgumentParser()
    logs_command.add_arguments(parser)
    assert logs_command.run(parser.parse_args(["worker-npu", "--log-dir", str(node.log_dir), "--level", "warn"])) == 0
    shown = capsys.readouterr().out.splitlines()
    assert any(" ERROR [worker-npu] Container allocation failed  " in line for line in shown)
    assert any(" WARN  [worker-npu] Device state changed  " in line for line in shown)
    assert shown and not any(" INFO " in line or " DEBUG " in line for line in shown)
