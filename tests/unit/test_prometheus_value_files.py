"""The stack's own writer of the value files (shared/fence/prometheus_value_files.py) against prometheus_client's:
the same events recorded by the Recorder and by prometheus_client's Counter and Histogram in its multiprocess mode
make the same files, byte for byte, and the same /metrics page, processes ending and their files folded included."""

from __future__ import annotations

import math
import pathlib

import prometheus_client
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import values
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from kubelet_watchdog.metrics_files import ProcessFilesCollector
from shared.fence import prometheus_value_files
from shared.observability.metrics import (
    ALLOCATE_DURATION,
    ALLOCATIONS,
    DRA_PREPARE_DURATION,
    DRA_PREPARES,
    DRA_SLICE_PUBLISHES,
    EVENT_FAMILIES,
    KUBELET_RESTARTS,
    PREFERRED_ALLOCATION_DURATION,
    PREFERRED_ALLOCATION_FALLBACKS,
    RBLN_SMI_DURATION,
    RBLN_SMI_FAILURES,
    SCAN_DURATION,
    Kind,
    Recorder,
    Result,
)

RESOURCES = ("rebellions.ai/npu", "rebellions.ai/npu-vf4")
COMMANDS = ("list", "group-create", "group-destroy", "ünïcode")
# The buckets' bounds themselves (an observation equal to a bound is in its bucket), between and beyond them.
SECONDS = st.sampled_from([0.0, 0.0005, 0.001, 0.004, 0.005, 0.0051, 0.1, 0.7, 1.0, 10.0, 30.0, 31.0, 1e6])
RESULTS = st.sampled_from(list(Result))
EVENTS = st.one_of(
    st.tuples(st.just("scan"), SECONDS),
    st.tuples(st.just("rbln_smi"), st.sampled_from(COMMANDS), SECONDS, st.booleans()),
    st.tuples(st.just("allocations"), st.sampled_from(RESOURCES), RESULTS, st.lists(SECONDS, max_size=3)),
    st.tuples(st.just("preferred_allocation"), st.sampled_from(RESOURCES), SECONDS, st.integers(0, 3)),
    st.tuples(st.just("prepares"), RESULTS, SECONDS),
    st.tuples(st.just("slice_publish"), st.booleans()),
    st.tuples(st.just("kubelet_restart")),
)
LOADS = st.tuples(st.sampled_from((None, *RESOURCES)), st.lists(st.sampled_from(COMMANDS), max_size=3, unique=True),
                  st.booleans())
# A process: whether it loads its families first (and which zero series), its events, whether it ends.
PROCESSES = st.lists(st.tuples(st.none() | LOADS, st.lists(EVENTS, max_size=8), st.booleans()), min_size=1,
                     max_size=4)


def _prometheus_client_families(directory: pathlib.Path, pid: int, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The event families as prometheus_client's own multiprocess values would record them as process `pid`."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda: pid))
    made = {}
    for family in EVENT_FAMILIES:
        if family.kind is Kind.COUNTER:
            made[family] = prometheus_client.Counter(family.name, family.help, family.labels, registry=None)
        else:
            made[family] = prometheus_client.Histogram(family.name, family.help, family.labels, registry=None,
                                                       buckets=family.buckets)
    return made


def _record_with_prometheus_client(f: dict, event: tuple) -> None:
    """The Recorder's events, as prometheus_client's metrics take them."""
    kind, *args = event
    if kind == "scan":
        f[SCAN_DURATION].observe(args[0])
    elif kind == "rbln_smi":
        command, seconds, ok = args
        f[RBLN_SMI_DURATION].labels(command).observe(seconds)
        if not ok:
            f[RBLN_SMI_FAILURES].labels(command).inc()
    elif kind == "allocations":
        resource, result, durations = args
        f[ALLOCATIONS].labels(resource, result.value).inc(len(durations))
        histogram = f[ALLOCATE_DURATION].labels(resource)
        for seconds in durations:
            histogram.observe(seconds)
    elif kind == "preferred_allocation":
        resource, seconds, fallbacks = args
        f[PREFERRED_ALLOCATION_DURATION].labels(resource).observe(seconds)
        if fallbacks:
            f[PREFERRED_ALLOCATION_FALLBACKS].labels(resource).inc(fallbacks)
    elif kind == "prepares":
        result, seconds = args
        f[DRA_PREPARES].labels(result.value).inc()
        f[DRA_PREPARE_DURATION].observe(seconds)
    elif kind == "slice_publish":
        f[DRA_SLICE_PUBLISHES].labels((Result.SUCCESS if args[0] else Result.FAILURE).value).inc()
    else:
        f[KUBELET_RESTARTS].inc()


def _zero_series_with_prometheus_client(f: dict, load: tuple) -> None:
    resource, commands, dra = load
    if resource is not None:
        for result in Result:
            f[ALLOCATIONS].labels(resource, result.value)
        for family in (ALLOCATE_DURATION, PREFERRED_ALLOCATION_DURATION, PREFERRED_ALLOCATION_FALLBACKS):
            f[family].labels(resource)
    for command in commands:
        f[RBLN_SMI_DURATION].labels(command)
        f[RBLN_SMI_FAILURES].labels(command)
    if dra:
        for result in Result:
            f[DRA_PREPARES].labels(result.value)
            f[DRA_SLICE_PUBLISHES].labels(result.value)


def _files(directory: pathlib.Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def _page(collector: ProcessFilesCollector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(processes=PROCESSES)
def test_the_same_events_make_the_same_files_and_page_as_prometheus_client(tmp_path_factory, monkeypatch, processes):
    ours, theirs = tmp_path_factory.mktemp("ours"), tmp_path_factory.mktemp("theirs")
    live: set[int] = set()
    collectors = [ProcessFilesCollector(directory, running=lambda pid: pid in live) for directory in (ours, theirs)]
    for pid, (load, events, ends) in enumerate(processes, start=1000):
        live.add(pid)
        recorder = Recorder(ours, pid=pid)
        if load is not None:
            recorder.load(*load)
        for kind, *args in events:
            getattr(recorder, kind)(*args)
        recorder.flush()
        if events or load is not None:
            # prometheus_client makes the families (and the label-less series) when a process first records.
            reference = _prometheus_client_families(theirs, pid, monkeypatch)
            if load is not None:
                _zero_series_with_prometheus_client(reference, load)
            for event in events:
                _record_with_prometheus_client(reference, event)
        values.close_all_multiprocess_files()
        assert _files(ours) == _files(theirs)
        if ends:
            live.discard(pid)
            assert _page(collectors[0]) == _page(collectors[1])  # folded into the archives
    assert _page(collectors[0]) == _page(collectors[1])


def test_every_bucket_bound_is_labelled_as_prometheus_client_labels_it():
    for family in EVENT_FAMILIES:
        for bound in (*family.buckets, math.inf):
            assert prometheus_value_files._le(bound) == floatToGoString(bound), (family.name, bound)


def test_a_file_left_by_an_earlier_process_of_the_same_pid_is_continued(tmp_path):
    first = prometheus_value_files.ValueFile(tmp_path / "counter_7.db")
    first.add("a", 2.0)
    first.add("b", 1.0)
    first.close()
    again = prometheus_value_files.ValueFile(tmp_path / "counter_7.db")
    again.add("a", 1.0)
    again.add("c", 5.0)
    again.close()
    read = {key: value for key, value, _, _ in
            prometheus_client.mmap_dict.MmapedDict.read_all_values_from_file(str(tmp_path / "counter_7.db"))}
    assert read == {"a": 3.0, "b": 1.0, "c": 5.0}


def test_a_file_grows_past_its_first_size_and_reads_back_whole(tmp_path):
    file = prometheus_value_files.ValueFile(tmp_path / "histogram_8.db")
    keys = [prometheus_value_files.key("family", "family_bucket", {"le": str(index)}, "x" * 200)
            for index in range(2000)]
    for index, key in enumerate(keys):
        file.add(key, float(index))
    file.close()
    path = tmp_path / "histogram_8.db"
    assert path.stat().st_size > prometheus_value_files.INITIAL_SIZE
    read = list(prometheus_client.mmap_dict.MmapedDict.read_all_values_from_file(str(path)))
    assert [(key, value) for key, value, _, _ in read] == [(key, float(index)) for index, key in enumerate(keys)]
