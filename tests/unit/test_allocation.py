"""Allocate's own checks: device nodes awaited within a bound (before any RSD change for the devices
themselves), errors that name the device and the reason and stay short whatever the request."""

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resource_worker.allocation import AllocationError, Allocator, ContainerReport, ErrorKind, GroupReport
from tests.support.allocators import FAULT, NODE_TIMEOUT, READY, make_allocator

# gRPC carries the message in a header (8 KiB by default); far below that, it still names what failed.
MAX_MESSAGE_CHARS = 1024


def allocate(allocator: Allocator, *ids: str, cdi_resolvable: bool = False):
    [devices] = allocator.validate([list(ids)])
    return allocator.allocate_container(devices, cdi_resolvable)


def test_the_contract_response_once_every_node_exists(tmp_path):
    allocator, fake = make_allocator(tmp_path)
    allocation = allocate(allocator, "rbln1", "rbln0")
    assert [(n.container_path, n.host_path) for n in allocation.nodes] == [
        ("/dev/rsd0", "/dev/rsd7"), ("/dev/rbln0", "/dev/rbln0"), ("/dev/rbln1", "/dev/rbln1")]
    assert fake.calls == [["rbln0", "rbln1"]]


def test_a_missing_device_node_fails_after_the_bound_without_touching_rsd_groups(tmp_path):
    allocator, fake = make_allocator(tmp_path, nodes=("rbln0",))
    with pytest.raises(AllocationError) as failed:
        allocate(allocator, "rbln0", "rbln1")
    assert failed.value.kind is ErrorKind.DEVICE_NODE_MISSING
    assert str(failed.value) == (f"device node /dev/rbln1 for rbln0, rbln1 did not appear under {tmp_path / 'dev'} "
                                 f"within {NODE_TIMEOUT:g}s")
    assert fake.calls == []


def test_a_new_rsd_node_is_awaited_and_one_that_never_comes_is_named(tmp_path):
    late, _ = make_allocator(tmp_path / "late", delay=NODE_TIMEOUT / 3)
    assert allocate(late, "rbln0").rsd_host_path == "/dev/rsd7"
    never, _ = make_allocator(tmp_path / "never", delay=None)
    with pytest.raises(AllocationError, match="device node /dev/rsd7 for rbln0 did not appear") as failed:
        allocate(never, "rbln0")
    assert failed.value.kind is ErrorKind.DEVICE_NODE_MISSING


def test_a_failed_group_names_the_devices_and_the_tools_reason(tmp_path):
    allocator, _ = make_allocator(tmp_path, error="rbln-smi group -c 7 -a 0 exited with status 1: busy")
    with pytest.raises(AllocationError) as failed:
        allocate(allocator, "rbln0")
    assert failed.value.kind is ErrorKind.RSD_GROUP_FAILED
    assert str(failed.value) == "RSD group for rbln0 failed: rbln-smi group -c 7 -a 0 exited with status 1: busy"


def test_an_error_naming_many_devices_names_a_few_and_counts_the_rest(tmp_path):
    allocator, _ = make_allocator(tmp_path, count=40, statuses={f"rbln{i}": FAULT for i in range(40)})
    with pytest.raises(AllocationError) as failed:
        allocator.validate([[f"rbln{i}" for i in range(40)]])
    assert failed.value.kind is ErrorKind.UNHEALTHY_DEVICE
    assert str(failed.value) == ("cannot allocate unhealthy devices: rbln0 is Unhealthy (FAULT), rbln1 is Unhealthy "
                                 "(FAULT), rbln2 is Unhealthy (FAULT), rbln3 is Unhealthy (FAULT), rbln4 is Unhealthy "
                                 "(FAULT) and 35 more")
    assert len(failed.value.device_ids) == 40


HOSTILE_IDS = st.one_of(
    st.sampled_from(["rbln0", "rbln1", "rbln2", "../rbln0", "/dev/rbln0", "rbln0\x00", "rbln0/../../etc/passwd"]),
    st.text(max_size=80),
    st.text(min_size=64, max_size=300),
    st.builds(lambda c, n: c * n, st.characters(), st.integers(1_000, 1_000_000)),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.lists(HOSTILE_IDS, max_size=20), max_size=5))
def test_validate_answers_any_request_with_devices_or_a_short_error_naming_the_culprit(tmp_path_factory, requests):
    allocator, _ = make_allocator(tmp_path_factory.mktemp("node"), statuses={"rbln2": FAULT})
    try:
        containers = allocator.validate(requests)
    except AllocationError as exc:
        text = str(exc)
        assert len(text) <= MAX_MESSAGE_CHARS
        if exc.kind is ErrorKind.UNKNOWN_DEVICE:
            first = exc.device_ids[0]
            assert repr(first) in text or repr(first)[:80] + "…" in text  # named, or its start when it is long
        elif exc.kind is ErrorKind.UNHEALTHY_DEVICE:
            assert exc.device_ids == ["rbln2"] and "rbln2 is Unhealthy (FAULT)" in text
        else:
            assert exc.kind is ErrorKind.INVALID_REQUEST
        return
    known = {"rbln0", "rbln1"}
    assert [[d.device_id for d in devices] for devices in containers] == [list(dict.fromkeys(ids)) for ids in requests]
    assert all(set(ids) <= known for ids in requests) and all(requests)


def test_containers_overlapping_in_part_are_refused_before_any_read(tmp_path):
    reads = []

    class RecordedReads(dict):
        def get(self, device_id, default=None):
            reads.append(device_id)
            return super().get(device_id, default)

    allocator, fake = make_allocator(tmp_path, statuses=RecordedReads(rbln0=READY))
    with pytest.raises(AllocationError) as refused:
        allocator.validate([["rbln0"], ["rbln1", "rbln2"], ["rbln2"]])
    assert refused.value.kind is ErrorKind.INVALID_REQUEST and refused.value.device_ids == ["rbln2"]
    assert str(refused.value) == ("device 'rbln2' is requested by containers 1 and 2 with different devices; "
                                  "an RSD group holds each device once")
    assert reads == [] and fake.calls == []
    same = allocator.validate([["rbln1", "rbln0"], ["rbln0", "rbln1", "rbln0"]])
    assert [[d.device_id for d in devices] for devices in same] == [["rbln1", "rbln0"], ["rbln0", "rbln1"]]
    assert sorted(reads) == ["rbln0", "rbln1"]


class RecordingObserver:
    """An AllocateObserver that keeps what it is told, in order."""

    def __init__(self):
        self.events: list[tuple] = []

    def refused(self, requests, error):
        self.events.append(("refused", [list(ids) for ids in requests], error.kind))

    @contextlib.contextmanager
    def container(self, device_ids, bus_ids):
        self.events.append(("container", device_ids, bus_ids))
        try:
            yield self
        except AllocationError as exc:
            self.events.append(("failed", exc.kind))
            raise
        self.events.append(("closed",))

    def group(self, report: GroupReport):
        self.events.append(("group", report.rsd_host_path, report.made, report.smi_calls))

    def answered(self, report: ContainerReport):
        self.events.append(("answered", report.device_ids, report.group.made, report.seconds >= 0))


def test_one_call_answers_every_container_and_identical_ones_share_one_group(tmp_path):
    allocator, fake = make_allocator(tmp_path)
    observer = RecordingObserver()
    allocations = allocator.allocate([["rbln1", "rbln0"], ["rbln2"], ["rbln0", "rbln1"]], observer)
    assert [a.device_ids for a in allocations] == [["rbln0", "rbln1"], ["rbln2"], ["rbln0", "rbln1"]]
    assert allocations[0] is allocations[2]
    assert fake.calls == [["rbln0", "rbln1"], ["rbln2"]]  # the third container made no RSD change
    assert observer.events == [
        ("container", ["rbln1", "rbln0"], ["0000:03:00.0", "0000:04:00.0"]), ("group", "/dev/rsd7", True, 0),
        ("closed",), ("answered", ["rbln0", "rbln1"], True, True),
        ("container", ["rbln2"], ["0000:05:00.0"]), ("group", "/dev/rsd7", True, 0),
        ("closed",), ("answered", ["rbln2"], True, True),
        ("container", ["rbln0", "rbln1"], ["0000:03:00.0", "0000:04:00.0"]), ("group", "/dev/rsd7", False, 0),
        ("closed",), ("answered", ["rbln0", "rbln1"], False, True)]


def test_a_refused_request_is_reported_before_any_container_and_a_failed_one_inside_its_own(tmp_path):
    allocator, fake = make_allocator(tmp_path)
    observer = RecordingObserver()
    with pytest.raises(AllocationError):
        allocator.allocate([["rbln0"], ["rbln9"]], observer)
    assert observer.events == [("refused", [["rbln0"], ["rbln9"]], ErrorKind.UNKNOWN_DEVICE)] and fake.calls == []
    allocator, fake = make_allocator(tmp_path / "failing", error="rbln-smi: busy")
    observer = RecordingObserver()
    with pytest.raises(AllocationError):
        allocator.allocate([["rbln0"], ["rbln1"]], observer)
    assert observer.events == [("container", ["rbln0"], ["0000:03:00.0"]), ("failed", ErrorKind.RSD_GROUP_FAILED)]
    assert fake.calls == [["rbln0"]]
