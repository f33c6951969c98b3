"""State metrics from the watchdog's view, and the /metrics endpoint that serves them with the processes'
event metrics: one series per resource whatever died, no series for statuses a device does not have."""

from __future__ import annotations

import gzip
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from kubelet_watchdog.metrics_server import MetricsEndpoint, MetricsServer, StackStateCollector
from kubelet_watchdog.probes import current_status
from kubelet_watchdog.stack_metrics import StackView, state_samples, status_label
from shared.observability.metrics import STATE_FAMILIES
from shared.resources import Resource
from tests.support.metrics_scrape import scrape, value
from tests.support.ports import free_port
from tests.support.status_samples import running, scanner_status, worker_status
from tests.support.waiting import wait_until

NPU, VF1, VF4 = (r.value for r in Resource)


def view_of(programs, scanner, workers, ready=True) -> StackView:
    """The view as the watchdog's check builds it: only files of running instances are trusted."""
    return StackView(current_status(scanner, programs, "scanner"),
                     {name: current_status(status, programs, name) for name, status in workers.items()}, ready)


def devices(**states: str) -> dict:
    return {device: {"health": "Healthy" if status == "READY" else "Unhealthy", "status": status}
            for device, status in states.items()}


def test_devices_statuses_and_registrations_of_the_running_workers():
    programs = running()
    workers = {"worker-npu": worker_status(programs, "worker-npu", deviceCount=3, healthyCount=2, unhealthyCount=1,
                                           devices=devices(rbln0="READY", rbln1="FAULT", rbln2="UNKNOWN(9)")),
               "worker-npu-vf1": worker_status(programs, "worker-npu-vf1", registered=False, streams=0,
                                               deviceCount=0, healthyCount=0, unhealthyCount=0, devices={}),
               "worker-npu-vf4": None}
    scanner = {**scanner_status(programs, npu=3), "time": 1.8e9, "discoveryError": None}
    samples = {(family.name, tuple(sorted(labels.items()))): v
               for family, labels, v in state_samples(view_of(programs, scanner, workers))}
    assert value(samples, "rbln_device_plugin_devices", resource=NPU, health="Healthy") == 2
    assert value(samples, "rbln_device_plugin_devices", resource=NPU, health="Unhealthy") == 1
    assert value(samples, "rbln_device_plugin_devices", resource=VF1, health="Healthy") == 0
    assert value(samples, "rbln_device_plugin_device_status", resource=NPU, device="rbln1", status="FAULT") == 1
    assert value(samples, "rbln_device_plugin_device_status", resource=NPU, device="rbln2", status="UNKNOWN") == 1
    statuses = [labels for (name, labels) in samples if name == "rbln_device_plugin_device_status"]
    assert len(statuses) == 3, "one series per device, for its current status only"
    assert {r: value(samples, "rbln_device_plugin_registered", resource=r) for r in (NPU, VF1)} == {NPU: 1, VF1: 0}
    # npu-vf4: the node has none and no worker reports: absent, not down.
    assert not [key for key in samples if ("resource", VF4) in key[1]]
    assert value(samples, "rbln_device_plugin_list_and_watch_streams", resource=NPU) == 1
    assert value(samples, "rbln_device_plugin_discovery_failing") == 0
    assert value(samples, "rbln_device_plugin_last_scan_timestamp_seconds") == 1.8e9
    assert value(samples, "rbln_device_plugin_ready") == 1
    assert not [key for key in samples if key[0] == "rbln_device_plugin_devices" and ("resource", VF4) in key[1]]


def test_a_killed_workers_file_is_not_trusted_and_its_successor_counts_once():
    programs = running()
    killed = worker_status(programs, "worker-npu", devices=devices(rbln0="READY"))
    programs["worker-npu"]["pid"] = 999  # supervisord started a new instance; the file is still the old one's
    scanner = scanner_status(programs, npu=1)
    samples = state_samples(view_of(programs, scanner, {"worker-npu": killed}, ready=False))
    assert [(f.name, labels, v) for f, labels, v in samples if labels.get("resource") == NPU] == [
        ("rbln_device_plugin_registered", {"resource": NPU}, 0.0),
        ("rbln_device_plugin_list_and_watch_streams", {"resource": NPU}, 0.0)]
    successor = {**killed, "pid": 999}
    samples = state_samples(view_of(programs, None, {"worker-npu": successor}))
    assert [v for f, labels, v in samples if f.name == "rbln_device_plugin_registered"
            and labels["resource"] == NPU] == [1.0]


@pytest.mark.parametrize("broken", [
    {"registered": "yes", "streams": "1", "healthyCount": None, "unhealthyCount": [1], "devices": ["rbln0"]},
    {"devices": {"rbln0": "READY", "rbln1": {"status": 4}}},
])
def test_a_broken_status_file_leaves_out_what_it_cannot_say(broken):
    programs = running()
    status = {**worker_status(programs, "worker-npu"), **broken}
    samples = state_samples(view_of(programs, {**scanner_status(programs), "time": "soon",
                                               "discoveryError": "rbln-smi not found"}, {"worker-npu": status}))
    by_name = {}
    for family, labels, v in samples:
        by_name.setdefault(family.name, []).append((labels, v))
        assert isinstance(v, float)
    assert by_name["rbln_device_plugin_discovery_failing"] == [({}, 1.0)]
    assert "rbln_device_plugin_last_scan_timestamp_seconds" not in by_name
    for labels, _ in by_name.get("rbln_device_plugin_device_status", []):
        assert labels["status"] == "UNREADABLE"


def test_status_labels_are_the_driver_statuses_unknown_and_unreadable():
    assert [status_label(name) for name in ("READY", "FAULT", "UNKNOWN(7)", "UNREADABLE", None, "junk")] == \
        ["READY", "FAULT", "UNKNOWN", "UNREADABLE", "UNREADABLE", "UNREADABLE"]


def test_the_collector_shows_the_last_view_and_nothing_before_the_first():
    collector = StackStateCollector()
    assert scrape(collector) == {}
    programs = running()
    collector.update(view_of(programs, None, {"worker-npu": worker_status(programs, "worker-npu")}))
    samples = scrape(collector)
    assert value(samples, "rbln_device_plugin_devices", resource=NPU, health="Unhealthy") == 1
    families = {name for name, _ in samples}
    assert families <= {family.name for family in STATE_FAMILIES}


# The HTTP endpoint


def serve(collector=None) -> MetricsServer:
    registry = CollectorRegistry(auto_describe=False)
    state = collector or StackStateCollector()
    if collector is None:
        programs = running()
        state.update(view_of(programs, None, {"worker-npu": worker_status(programs, "worker-npu")}))
    registry.register(state)
    server = MetricsServer(0, registry)
    server.start()
    return server


def get(url: str, **headers: str):
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5)


def test_get_metrics_in_the_text_format_over_ipv4_and_ipv6():
    server = serve()
    try:
        for host in ("127.0.0.1", "[::1]"):
            with get(f"http://{host}:{server.port}/metrics") as answer:
                assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = answer.read().decode()
            assert 'rbln_device_plugin_registered{resource="rebellions.ai/npu"} 1.0' in text
        # What Prometheus asks for: OpenMetrics, compressed.
        with get(f"http://127.0.0.1:{server.port}/metrics", **{
                "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
                "Accept-Encoding": "gzip"}) as answer:
            assert answer.headers["Content-Encoding"] == "gzip"
            assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
            families = list(text_string_to_metric_families(gzip.decompress(answer.read()).decode()
                                                           .replace("# EOF\n", "")))
        assert "rbln_device_plugin_devices" in {family.name for family in families}
        with pytest.raises(urllib.error.HTTPError) as missing:
            get(f"http://127.0.0.1:{server.port}/")
        assert missing.value.code == 404
    finally:
        server.stop()


def test_a_failing_collection_is_a_500_and_the_server_goes_on():
    class Failing:
        def __init__(self):
            self.fail = True

        def collect(self):
            if self.fail:
                raise RuntimeError("broken")
            return []

    failing = Failing()
    server = serve(failing)
    try:
        with pytest.raises(urllib.error.HTTPError) as failed:
            get(f"http://127.0.0.1:{server.port}/metrics")
        assert failed.value.code == 500
        failing.fail = False
        with get(f"http://127.0.0.1:{server.port}/metrics") as answer:
            assert answer.status == 200
    finally:
        server.stop()


def test_scrapes_back_to_back_share_one_collection_a_second_in_each_format(monkeypatch):
    class Counting:
        def __init__(self):
            self.collections = 0

        def collect(self):
            self.collections += 1
            return []

    counting = Counting()
    server = serve(counting)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        for _ in range(5):
            get(url).read()
        get(url, **{"Accept-Encoding": "gzip"}).read()
        assert counting.collections == 2
        # Versions no encoder tells apart, or that prometheus_client cannot even compare, are answered in
        # the default format from its page: no new collection, no new page kept, no failed scrape.
        for version in ("1.0.0.1", "99.0", "abc", "1.0.0-x"):
            with get(url, Accept=f"application/openmetrics-text; version={version}") as answer:
                assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
                answer.read()
        assert counting.collections == 2 and len(server._pages) == 2
        with get(url, Accept="application/openmetrics-text; version=1.0.0") as answer:
            assert answer.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0;")
        assert counting.collections == 3
        monkeypatch.setattr("kubelet_watchdog.metrics_server.PAGE_REUSE_SECONDS", 0.0)
        get(url).read()
        assert counting.collections == 4
    finally:
        server.stop()


def test_silent_and_dripping_clients_delay_no_scrape_and_are_cut_off_at_their_deadline(monkeypatch):
    monkeypatch.setattr("kubelet_watchdog.metrics_server.CONNECTION_DEADLINE", 0.5)
    server = serve()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as silent, \
                socket.create_connection(("127.0.0.1", server.port)) as dripping:
            dripping.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            with get(f"http://127.0.0.1:{server.port}/metrics") as answer:
                assert answer.status == 200
            started = time.monotonic()
            for client in (silent, dripping):
                client.settimeout(5)
                dripping.sendall(b"a")
                assert client.recv(1024) == b"", "closed without an answer"
            assert time.monotonic() - started < 3
    finally:
        server.stop()


def test_a_full_port_closes_its_least_recently_active_connection_for_a_new_one(monkeypatch):
    monkeypatch.setattr("kubelet_watchdog.metrics_server.MAX_CONNECTIONS", 2)
    server = serve()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as oldest, \
                socket.create_connection(("127.0.0.1", server.port)) as newer:
            wait_until(lambda: len(server.table) >= 2, 5, "both idle connections accepted", poll=0.01)
            with get(f"http://127.0.0.1:{server.port}/metrics") as answer:
                assert answer.status == 200
            oldest.settimeout(5)
            assert oldest.recv(10) == b""
            newer.setblocking(False)
            with pytest.raises(BlockingIOError):
                newer.recv(10)
        assert server.table.evicted == 1
    finally:
        server.stop()


def test_oversized_and_malformed_requests_get_an_error_and_the_connection_closes():
    server = serve()
    try:
        for request, status in ((b"GET /metrics HTTP/1.0\r\nX: " + b"a" * 9000, b"431"),
                                (b"BREW /metrics HTTP/1.0\r\n\r\n", b"501"),
                                (b"nonsense\r\n\r\n", b"400"),
                                # a target urllib refuses (an unclosed IPv6 host): an answer, not a task failing
                                (b"GET http://[ HTTP/1.0\r\n\r\n", b"400")):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
                client.sendall(request)
                answer = b""
                while chunk := client.recv(65536):
                    answer += chunk
            assert answer.split()[1] == status, answer[:80]
    finally:
        server.stop()


def test_an_endpoint_whose_port_is_taken_retries_at_each_update(tmp_path, monkeypatch):
    logged = []
    monkeypatch.setattr("kubelet_watchdog.metrics_server.logger.error", lambda msg, **f: logged.append(msg))
    monkeypatch.setattr("kubelet_watchdog.metrics_server.logger.info", lambda msg, **f: logged.append(msg))
    with socket.socket(socket.AF_INET6) as taken:
        taken.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        taken.bind(("::", 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoint = MetricsEndpoint(port, tmp_path)
        programs = running()
        view = view_of(programs, None, {})
        endpoint.update(view)
        endpoint.update(view)
        assert logged == ["Metrics endpoint cannot listen; retrying"]
    endpoint.update(view)
    try:
        assert logged[-1] == "Metrics endpoint listening"
        with get(f"http://127.0.0.1:{port}/metrics") as answer:
            assert b"rbln_device_plugin_ready 1.0" in answer.read()
    finally:
        endpoint.stop()


def test_an_endpoint_whose_server_fails_to_start_frees_its_port_and_retries_at_the_next_update(tmp_path,
                                                                                              monkeypatch):
    port = free_port()
    real_start = MetricsServer._start
    starts = []

    async def failing_first(self):
        starts.append(self.port)
        if len(starts) == 1:
            raise OSError("the loop could not serve the socket")
        await real_start(self)

    monkeypatch.setattr(MetricsServer, "_start", failing_first)
    endpoint = MetricsEndpoint(port, tmp_path)
    view = view_of(running(), None, {})
    endpoint.update(view)  # the watchdog's check goes on: nothing raised
    endpoint.update(view)  # the port was freed, so it is bound again
    try:
        assert starts == [port, port]
        with get(f"http://127.0.0.1:{port}/metrics") as answer:
            assert b"rbln_device_plugin_ready 1.0" in answer.read()
    finally:
        endpoint.stop()


def test_a_disabled_endpoint_never_listens(tmp_path):
    endpoint = MetricsEndpoint(-1, tmp_path)
    endpoint.update(StackView(None, {}, True))
    assert endpoint._server is None
    endpoint.stop()
