"""Event metrics: what each process records, how the serving process adds the processes' files up, and how
the files of processes that ended are folded so that nothing counts twice or is lost."""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys
import threading

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubelet_watchdog.metrics_files import ProcessFilesCollector, file_pid, is_running
from resource_worker import allocation_calls
from resource_worker.allocation_calls import AllocationCalls
from resource_worker.servicer import DevicePluginServicer
from shared.kubelet.deviceplugin.v1beta1 import api_pb2
from shared.kubelet.streams import StreamTracker
from shared.observability import metrics
from shared.observability.metrics import EVENT_FAMILIES, Recorder, Result, recorder_for
from shared.observability.metrics_dir import reset_metrics_dir
from shared.observability.tracing import AllocationTracer
from shared.resources import Resource
from tests.support.allocators import make_allocator
from tests.support.metrics_scrape import scrape, value

ROOT = pathlib.Path(__file__).resolve().parents[2]
NPU, VF4 = Resource.NPU.value, Resource.NPU_VF4.value
class Node:
    """One metrics directory and the processes writing into it, each with a pid of its own."""

    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        self.live: set[int] = set()
        self.collector = ProcessFilesCollector(directory, running=lambda pid: pid in self.live)

    def process(self, pid: int) -> Recorder:
        """A recorder as process `pid` has it: what it records until the next call lands in its files."""
        self.live.add(pid)
        return Recorder(self.directory, pid=pid)

    def files(self) -> list[str]:
        return sorted(path.name for path in self.directory.iterdir())


@pytest.fixture
def node(tmp_path) -> Node:
    directory = tmp_path / "metrics"
    directory.mkdir()
    return Node(directory)


def test_the_processes_events_add_up_in_one_scrape(node):
    scanner = node.process(101)
    scanner.load(smi_commands=["list"])
    scanner.scan(0.03)
    scanner.rbln_smi("list", 0.02, ok=True)
    scanner.flush()
    worker = node.process(102)
    worker.load(NPU, ["group-list", "group-destroy", "group-create"])
    worker.rbln_smi("group-list", 0.02, ok=True)
    worker.rbln_smi("group-create", 0.2, ok=False)
    worker.allocations(NPU, Result.SUCCESS, [0.07, 0.3])
    worker.allocations(NPU, Result.FAILURE, [0.004])
    worker.preferred_allocation(NPU, 0.0008, fallbacks=1)
    worker.flush()
    watchdog = node.process(103)
    watchdog.load()
    watchdog.kubelet_restart()
    watchdog.flush()

    samples = scrape(node.collector)
    assert value(samples, "rbln_device_plugin_scan_duration_seconds_count") == 1
    assert value(samples, "rbln_device_plugin_rbln_smi_duration_seconds_count", command="list") == 1
    assert value(samples, "rbln_device_plugin_rbln_smi_duration_seconds_count", command="group-create") == 1
    assert value(samples, "rbln_device_plugin_rbln_smi_failures_total", command="group-create") == 1
    assert value(samples, "rbln_device_plugin_rbln_smi_failures_total", command="group-list") == 0
    # Loaded, never used: a zero rather than no series, so that a query finds it.
    assert value(samples, "rbln_device_plugin_rbln_smi_duration_seconds_count", command="group-destroy") == 0
    assert value(samples, "rbln_device_plugin_allocations_total", resource=NPU, result="success") == 2
    assert value(samples, "rbln_device_plugin_allocations_total", resource=NPU, result="failure") == 1
    assert value(samples, "rbln_device_plugin_allocate_duration_seconds_count", resource=NPU) == 3
    assert value(samples, "rbln_device_plugin_allocate_duration_seconds_bucket", resource=NPU, le="0.1") == 2
    assert value(samples, "rbln_device_plugin_allocate_duration_seconds_sum", resource=NPU) == pytest.approx(0.374)
    assert value(samples, "rbln_device_plugin_preferred_allocation_fallbacks_total", resource=NPU) == 1
    assert value(samples, "rbln_device_plugin_preferred_allocation_duration_seconds_bucket", resource=NPU,
                 le="0.001") == 1
    assert value(samples, "rbln_device_plugin_kubelet_restarts_total") == 1
    # Nothing here for a resource no worker of this node serves.
    assert value(samples, "rbln_device_plugin_allocations_total", resource=VF4, result="success") is None


def test_an_ended_process_still_counts_once_and_its_files_are_folded(node):
    first = node.process(201)
    first.allocations(NPU, Result.SUCCESS, [0.1] * 3)
    first.rbln_smi("group-create", 0.05, ok=True)
    first.flush()
    before = scrape(node.collector)
    node.live.discard(201)  # SIGKILLed: its files stay behind
    second = node.process(202)  # its successor
    second.allocations(NPU, Result.SUCCESS, [0.2])
    second.flush()

    after = scrape(node.collector)
    assert value(after, "rbln_device_plugin_allocations_total", resource=NPU, result="success") == 4
    assert value(after, "rbln_device_plugin_allocate_duration_seconds_count", resource=NPU) == 4
    assert value(after, "rbln_device_plugin_allocate_duration_seconds_bucket", resource=NPU, le="0.1") == 3
    assert value(after, "rbln_device_plugin_rbln_smi_duration_seconds_count", command="group-create") == \
        value(before, "rbln_device_plugin_rbln_smi_duration_seconds_count", command="group-create") == 1
    assert node.files() == ["counter_202.db", "counter_archive.db", "histogram_202.db", "histogram_archive.db"]

    # The successor ends too: its counts join those already folded, none twice.
    node.live.discard(202)
    third = node.process(203)
    third.allocations(NPU, Result.FAILURE, [1.5])
    third.flush()
    last = scrape(node.collector)
    assert value(last, "rbln_device_plugin_allocations_total", resource=NPU, result="success") == 4
    assert value(last, "rbln_device_plugin_allocations_total", resource=NPU, result="failure") == 1
    assert value(last, "rbln_device_plugin_allocate_duration_seconds_count", resource=NPU) == 5
    assert value(last, "rbln_device_plugin_allocate_duration_seconds_sum", resource=NPU) == pytest.approx(2.0)
    assert node.files() == ["counter_203.db", "counter_archive.db", "histogram_203.db", "histogram_archive.db"]
    assert scrape(node.collector) == last  # a scrape changes nothing


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lives=st.lists(st.lists(st.sampled_from([0.001, 0.04, 0.3, 7.0, 40.0]), max_size=4), min_size=1,
                      max_size=5),
       scrape_after=st.lists(st.booleans(), min_size=5, max_size=5))
def test_any_sequence_of_restarts_and_scrapes_counts_every_allocation_once(tmp_path_factory, lives, scrape_after):
    """A worker restarted again and again, scraped or not between its lives: the totals are the sums."""
    node = Node(tmp_path_factory.mktemp("metrics"))
    for pid, durations in enumerate(lives, start=300):
        recorder = node.process(pid)
        recorder.allocations(NPU, Result.SUCCESS, durations)
        recorder.flush()
        node.live.discard(pid)
        if scrape_after[pid - 300]:
            scrape(node.collector)
    samples = scrape(node.collector)
    every = [seconds for durations in lives for seconds in durations]
    assert (value(samples, "rbln_device_plugin_allocations_total", resource=NPU, result="success") or 0) == len(every)
    assert (value(samples, "rbln_device_plugin_allocate_duration_seconds_count", resource=NPU) or 0) == len(every)
    for bound in ("0.05", "1.0", "30.0", "+Inf"):
        expected = sum(1 for seconds in every if seconds <= float(bound))
        assert (value(samples, "rbln_device_plugin_allocate_duration_seconds_bucket", resource=NPU, le=bound) or 0) \
            == expected
    assert all(name.endswith("_archive.db") for name in node.files())


def test_an_ended_process_gauges_are_dropped_and_unreadable_files_left_out(node):
    recorder = node.process(401)
    recorder.allocations(VF4, Result.SUCCESS, [0.1])
    recorder.flush()
    (node.directory / "gauge_livesum_402.db").write_bytes(b"")
    (node.directory / "counter_403.db").write_bytes(b"\x40\x00\x00\x00garbage")  # claims more than it holds
    node.live.add(403)
    samples = scrape(node.collector)
    assert value(samples, "rbln_device_plugin_allocations_total", resource=VF4, result="success") == 1
    assert "gauge_livesum_402.db" not in node.files()
    assert "counter_403.db" in node.files()  # its process runs: left as it is, only not read


def test_file_names_and_liveness():
    assert file_pid(pathlib.Path("histogram_1234.db")) == 1234
    assert file_pid(pathlib.Path("gauge_livesum_77.db")) == 77
    assert file_pid(pathlib.Path("counter_archive.db")) is None
    assert is_running(1)  # init: never ends, and belongs to another user for a non-root test run
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not is_running(dead.pid)


def test_a_recorder_that_cannot_write_never_fails_the_work(node, monkeypatch):
    recorder = node.process(501)
    logged = []
    monkeypatch.setattr("shared.fence.prometheus_value_files.ValueFile.__init__",
                        lambda self, path: (_ for _ in ()).throw(OSError(28, "No space left")))
    monkeypatch.setattr("loguru.logger.warning", lambda message, **fields: logged.append((message, fields)))
    recorder.allocations(NPU, Result.SUCCESS, [0.1])
    recorder.scan(0.1)
    recorder.flush()
    assert [message for message, _ in logged] == ["Metrics cannot be recorded; continuing without them"]
    assert "No space left" in logged[0][1]["err"]
    assert not recorder._pending, "events that cannot be written are dropped, never kept to grow"


def test_value_files_are_allocated_before_they_are_mapped_and_a_refusal_is_reported_once_until_it_passes(
        node, monkeypatch):
    recorder = node.process(502)
    logged = []
    monkeypatch.setattr("loguru.logger.warning", lambda message, **fields: logged.append(message))
    monkeypatch.setattr("loguru.logger.info", lambda message, **fields: logged.append(message))
    real_fallocate = os.posix_fallocate
    full = True

    def fallocate(fd, offset, length):
        if full:
            raise OSError(28, "No space left on device")
        real_fallocate(fd, offset, length)

    monkeypatch.setattr("shared.fence.prometheus_value_files.os.posix_fallocate", fallocate)
    for _ in range(3):
        recorder.scan(0.1)
        recorder.flush()
    assert logged == ["Metrics cannot be recorded; continuing without them"]
    assert node.files() == [], "no file is left that was never allocated"
    full = False
    recorder.scan(0.2)
    recorder.flush()
    assert logged[1:] == ["Metrics recorded again"]
    for path in node.directory.iterdir():
        # Every byte of the file has its block: st_blocks counts 512-byte units.
        assert path.stat().st_blocks * 512 >= path.stat().st_size, path
    # A file that must grow gets its new space first: refused, the file and its values stay as they were.
    full = True
    before = {path.name: path.stat().st_size for path in node.directory.iterdir()}
    for index in range(2000):
        recorder.rbln_smi(f"command-{index}", 0.1, ok=False)
    recorder.flush()
    assert {path.name: path.stat().st_size for path in node.directory.iterdir()} == before
    assert logged[2:] == ["Metrics cannot be recorded; continuing without them"]


def test_a_recorder_refused_one_of_its_files_retries_holding_each_file_once(node, monkeypatch):
    """The first file is made, the second refused at every flush: the retries neither reopen the first nor
    lose its series, and once there is room the zero series are all made."""
    recorder = node.process(504)
    real_fallocate = os.posix_fallocate
    full = True

    def fallocate(fd, offset, length):
        if full and os.fstat(fd).st_size == 0 and len(node.files()) > 1:  # a new file beside one made
            raise OSError(28, "No space left on device")
        real_fallocate(fd, offset, length)

    monkeypatch.setattr("shared.fence.prometheus_value_files.os.posix_fallocate", fallocate)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        recorder.load(NPU, ["group-create"])
        recorder.scan(0.1)
        recorder.flush()
    assert node.files() == ["histogram_504.db"]
    held = len(os.listdir("/proc/self/fd")) - before  # what one open value file holds (its mapping dups the fd)
    assert 0 < held <= 2
    full = False
    recorder.scan(0.2)
    recorder.flush()
    samples = scrape(node.collector)
    assert value(samples, "rbln_device_plugin_scan_duration_seconds_count") == 1  # the refused ones dropped
    assert value(samples, "rbln_device_plugin_allocations_total", resource=NPU, result="failure") == 0
    assert value(samples, "rbln_device_plugin_rbln_smi_failures_total", command="group-create") == 0
    assert len(os.listdir("/proc/self/fd")) - before == 2 * held


def test_the_recording_processes_never_import_prometheus_client(tmp_path):
    """Its package costs a process about 40 ms and 3-4 MB (an HTTP server, email, wsgiref): the scanner and the
    workers write their value files without it, with metrics on or off; only the watchdog, which serves
    /metrics, reads them with it."""
    script = f"""
import os, pathlib, sys
from shared.observability.metrics import Result, recorder_for
import resource_worker.main, scanner.main, dra_worker.main
run_dir = pathlib.Path({str(tmp_path)!r})
off = recorder_for(-1, run_dir)
off.load(); off.scan(0.1); off.allocations("rebellions.ai/npu", Result.SUCCESS, [0.1]); off.kubelet_restart()
off.flush()
assert off.directory is None and not (run_dir / "metrics").exists()
on = recorder_for(51516, run_dir)
on.load("rebellions.ai/npu", ["group-create"], dra=True)
on.scan(0.1); on.allocations("rebellions.ai/npu", Result.SUCCESS, [0.1]); on.rbln_smi("list", 0.2, ok=False)
on.prepares(Result.FAILURE, 0.3); on.slice_publish(ok=True); on.kubelet_restart()
on.flush()
assert sorted(p.name for p in (run_dir / "metrics").iterdir()) == \
    ["counter_%d.db" % os.getpid(), "histogram_%d.db" % os.getpid()]
print(sorted(name for name in sys.modules if name.split(".")[0] == "prometheus_client"))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_recorder_for_writes_into_the_private_metrics_dir(tmp_path):
    run_dir = tmp_path / "run"
    recorder = recorder_for(0, run_dir)
    directory = run_dir / "metrics"
    assert recorder.directory == directory and stat.S_IMODE(directory.stat().st_mode) == 0o700
    recorder.scan(0.25)
    recorder.flush()
    assert sorted(p.name for p in directory.iterdir()) == [f"counter_{os.getpid()}.db", f"histogram_{os.getpid()}.db"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in directory.iterdir())


def test_the_stack_starts_with_an_empty_metrics_dir_or_none(tmp_path):
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_1.db").write_bytes(b"old run")
    reset_metrics_dir(tmp_path, enabled=True)
    assert list(directory.iterdir()) == [] and oct(directory.stat().st_mode & 0o777) == "0o700"
    (directory / "counter_1.db").write_bytes(b"old run")
    reset_metrics_dir(tmp_path, enabled=False)
    assert not directory.exists()
    reset_metrics_dir(tmp_path, enabled=False)  # nothing there: nothing to do


def test_event_families_follow_the_naming_conventions():
    for family in EVENT_FAMILIES:
        assert family.name.startswith("rbln_device_plugin_")
        if family.kind is metrics.Kind.COUNTER:
            assert family.name.endswith("_total")
        if family.kind is metrics.Kind.HISTOGRAM:
            assert family.name.endswith("_seconds") and list(family.buckets) == sorted(family.buckets)
        assert set(family.labels) <= {"resource", "device", "status", "health", "result", "command"}
    assert len({family.name for family in metrics.FAMILIES}) == len(metrics.FAMILIES)


# What the servicer records for each kind of call


class FakeRecorder:
    def __init__(self) -> None:
        self.allocations_seen: list[tuple[str, Result, list[float]]] = []
        self.preferred: list[tuple[str, float, int]] = []
        self.flushes = 0

    def flush(self):
        self.flushes += 1

    def allocations(self, resource, result, durations):
        self.allocations_seen.append((resource, result, list(durations)))

    def preferred_allocation(self, resource, seconds, fallbacks):
        self.preferred.append((resource, seconds, fallbacks))


class Aborted(Exception):
    pass


class FakeContext:
    """A call's context; `ended()` is the end of the call, after its answer went out."""

    def __init__(self) -> None:
        self.callbacks = []

    def add_callback(self, callback) -> bool:
        self.callbacks.append(callback)
        return True

    def ended(self) -> None:
        for callback in self.callbacks:
            callback()

    def abort(self, code, details):
        self.code = code
        raise Aborted(details)


def servicer(tmp_path, **groups) -> tuple[DevicePluginServicer, FakeRecorder]:
    allocator, _ = make_allocator(tmp_path, **groups)
    recorder = FakeRecorder()
    calls = AllocationCalls(allocator._table, allocator, AllocationTracer(), recorder)
    return DevicePluginServicer(allocator._table, lambda: calls, StreamTracker(), threading.Event()), recorder


def allocate_request(*containers: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)
                                                       for ids in containers])


def test_each_container_of_a_successful_allocate_counts_once_with_its_time(tmp_path):
    served, recorder = servicer(tmp_path)
    context = FakeContext()
    served.Allocate(allocate_request(["rbln0"], ["rbln1", "rbln2"]), context)
    assert recorder.flushes == 0, "nothing is written before the answer has gone out"
    context.ended()
    assert recorder.flushes == 1
    [(resource, result, durations)] = recorder.allocations_seen
    assert (resource, result) == (NPU, Result.SUCCESS)
    assert len(durations) == 2 and 0 < durations[0] <= durations[1] < 5


@pytest.mark.parametrize(("containers", "counted"), [
    ((["rbln0"], ["rbln9"]), 2),  # refused before any container: every container fails
    ((), 1),  # no container at all: one failure, never none
])
def test_a_refused_allocate_fails_every_container(tmp_path, containers, counted):
    served, recorder = servicer(tmp_path)
    context = FakeContext()
    with pytest.raises(Aborted):
        served.Allocate(allocate_request(*containers), context)
    assert context.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
    [(_, result, durations)] = recorder.allocations_seen
    assert result is Result.FAILURE and len(durations) == counted


def test_an_allocate_failing_in_its_second_container_keeps_the_first_ones_time(tmp_path):
    served, recorder = servicer(tmp_path, error="rbln-smi group -c exited with status 1")
    with pytest.raises(Aborted):
        served.Allocate(allocate_request(["rbln0"], ["rbln1"]), FakeContext())
    [(_, result, durations)] = recorder.allocations_seen
    assert result is Result.FAILURE and len(durations) == 2


def test_preferred_allocation_is_timed_and_its_fallbacks_counted(tmp_path):
    served, recorder = servicer(tmp_path)
    request = api_pb2.PreferredAllocationRequest(container_requests=[
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["rbln0", "rbln1"], allocation_size=1),
        api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["rbln7"], allocation_size=1)])
    response = served.GetPreferredAllocation(request, FakeContext())
    assert len(response.container_responses) == 2
    [(resource, seconds, fallbacks)] = recorder.preferred
    assert resource == NPU and 0 < seconds < 5 and fallbacks == 1


def test_events_are_written_at_the_flush_once_each_whatever_the_threads(node):
    recorder = node.process(601)
    for _ in range(200):
        recorder.allocations(NPU, Result.SUCCESS, [0.01])
    assert value(scrape(node.collector), "rbln_device_plugin_allocations_total", resource=NPU, result="success") \
        is None
    threads = [threading.Thread(target=recorder.flush) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    samples = scrape(node.collector)
    assert value(samples, "rbln_device_plugin_allocations_total", resource=NPU, result="success") == 200
    assert value(samples, "rbln_device_plugin_allocate_duration_seconds_count", resource=NPU) == 200


def test_an_allocate_whose_answer_cannot_be_built_fails_as_internal_and_counts_as_a_failure(tmp_path, monkeypatch):
    served, recorder = servicer(tmp_path)

    def broken(allocation):
        raise ValueError("annotation value is not a string")

    monkeypatch.setattr(allocation_calls, "container_response", broken)
    context = FakeContext()
    with pytest.raises(Aborted, match="annotation value is not a string"):
        served.Allocate(allocate_request(["rbln0"]), context)
    assert context.code is grpc.StatusCode.INTERNAL
    [(_, result, durations)] = recorder.allocations_seen
    assert result is Result.FAILURE and len(durations) == 1
