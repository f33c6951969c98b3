"""What the stack measures for Prometheus: every metric family, and how a process records its events
(the families as operators see them: docs/metrics.md).

There are two kinds of family, told apart by where their values live:

- Event families (counters and histograms) are recorded by the process where the event happens: the
  scanner's scans and `rbln-smi` calls, a worker's allocations and group changes, the watchdog's kubelet
  restarts. Each process writes them into memory-mapped files of its own in the metrics directory of the
  run dir (prometheus_client's multiprocess layout, written by shared/fence/prometheus_value_files.py without importing
  prometheus_client: a write is a store into shared memory, no system call),
  and the process serving `/metrics` adds up every process's files at each scrape. A process that died
  still counts: its events happened.
- State families (gauges) say how the stack is now: the devices, their health and status, the
  registrations. The serving process derives them at each scrape from the status files the processes keep
  for the probes, each one trusted only while the process that wrote it runs. They are not kept in the
  mapped files because those cannot forget a label set: a device that left FAULT would keep a FAULT series,
  and a killed worker's `registered` would linger beside its successor's.

Labels stay few-valued: resource, device, status, health, result, command.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import os
import pathlib
import threading
from collections.abc import Callable, Iterable, Sequence

from shared.config import RUN_DIR_ENV
from shared.fence import prometheus_value_files
from shared.fs.safe_open import ensure_private_dir
from shared.observability.metric_kinds import Kind
from shared.observability.metrics_dir import metrics_dir

PATH = "/metrics"


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    """As exposed: a counter's name ends in _total, a duration's in _seconds."""
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


class Result(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"


# An Allocate spends most of its time in rbln-smi and may wait up to 30 s for the RSD lock.
_ALLOCATE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Placement answers within milliseconds; its goal is 5 ms at p99 and 25 ms at worst.
_PLACEMENT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# rbln-smi calls are bounded by 5 s (listings) and 10 s (group changes).
_TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Event families.
ALLOCATIONS = Family("rbln_device_plugin_allocations_total", Kind.COUNTER,
                     "Container requests of Allocate calls answered, by result (a failed call fails all its "
                     "containers)",
                     ("resource", "result"))
ALLOCATE_DURATION = Family("rbln_device_plugin_allocate_duration_seconds", Kind.HISTOGRAM,
                           "Time from the start of an Allocate call until each of its containers was ready or the "
                           "call failed", ("resource",), _ALLOCATE_BUCKETS)
PREFERRED_ALLOCATION_DURATION = Family("rbln_device_plugin_preferred_allocation_duration_seconds", Kind.HISTOGRAM,
                                       "Time of a GetPreferredAllocation call", ("resource",), _PLACEMENT_BUCKETS)
PREFERRED_ALLOCATION_FALLBACKS = Family("rbln_device_plugin_preferred_allocation_fallbacks_total", Kind.COUNTER,
                                        "Container requests GetPreferredAllocation left to the kubelet's choice",
                                        ("resource",))
RBLN_SMI_DURATION = Family("rbln_device_plugin_rbln_smi_duration_seconds", Kind.HISTOGRAM,
                           "Time of an rbln-smi call, start to exit, failed ones included", ("command",),
                           _TOOL_BUCKETS)
RBLN_SMI_FAILURES = Family("rbln_device_plugin_rbln_smi_failures_total", Kind.COUNTER,
                           "rbln-smi calls that could not run, timed out or exited non-zero", ("command",))
SCAN_DURATION = Family("rbln_device_plugin_scan_duration_seconds", Kind.HISTOGRAM,
                       "Time of one scan of the node (rbln-smi and sysfs)", (), _TOOL_BUCKETS)
KUBELET_RESTARTS = Family("rbln_device_plugin_kubelet_restarts_total", Kind.COUNTER,
                          "Kubelet restarts noticed (kubelet.sock created anew), each followed by new registrations")
DRA_PREPARES = Family("rbln_device_plugin_dra_prepares_total", Kind.COUNTER,
                      "Claims of NodePrepareResources calls answered by worker-dra, by result", ("result",))
DRA_PREPARE_DURATION = Family("rbln_device_plugin_dra_prepare_duration_seconds", Kind.HISTOGRAM,
                              "Time from the start of a NodePrepareResources call until each of its claims was "
                              "answered", (), _ALLOCATE_BUCKETS)
DRA_SLICE_PUBLISHES = Family("rbln_device_plugin_dra_slice_publishes_total", Kind.COUNTER,
                             "ResourceSlice reconciliations that changed the API server, or failed, by result",
                             ("result",))
DRA_CHECKPOINT_REBUILDS = Family("rbln_device_plugin_dra_checkpoint_rebuilds_total", Kind.COUNTER,
                                 "Unreadable checkpoints worker-dra moved aside and rebuilt from the node")
DRA_STALE_CLAIMS_UNPREPARED = Family("rbln_device_plugin_dra_stale_claims_unprepared_total", Kind.COUNTER,
                                     "Claims the API server no longer had that worker-dra unprepared to prepare "
                                     "their devices for another claim")
DRA_SLICE_WATCH_RESTARTS = Family("rbln_device_plugin_dra_slice_watch_restarts_total", Kind.COUNTER,
                                  "Watches on the node's ResourceSlices that failed and were started afresh")
EVENT_FAMILIES = (ALLOCATIONS, ALLOCATE_DURATION, PREFERRED_ALLOCATION_DURATION, PREFERRED_ALLOCATION_FALLBACKS,
                  RBLN_SMI_DURATION, RBLN_SMI_FAILURES, SCAN_DURATION, KUBELET_RESTARTS, DRA_PREPARES,
                  DRA_PREPARE_DURATION, DRA_SLICE_PUBLISHES, DRA_CHECKPOINT_REBUILDS, DRA_STALE_CLAIMS_UNPREPARED,
                  DRA_SLICE_WATCH_RESTARTS)

# State families.
DEVICES = Family("rbln_device_plugin_devices", Kind.GAUGE,
                 "Devices advertised to the kubelet, by health", ("resource", "health"))
DEVICE_STATUS = Family("rbln_device_plugin_device_status", Kind.GAUGE,
                       "1 for each device's current driver status; no series for the other statuses",
                       ("resource", "device", "status"))
REGISTERED = Family("rbln_device_plugin_registered", Kind.GAUGE,
                    "1 while the resource is registered with the kubelet", ("resource",))
STREAMS = Family("rbln_device_plugin_list_and_watch_streams", Kind.GAUGE,
                 "ListAndWatch streams the kubelet holds open", ("resource",))
DISCOVERY_FAILING = Family("rbln_device_plugin_discovery_failing", Kind.GAUGE,
                           "1 while the last scan could not list the devices (every resource then reports none)")
LAST_SCAN = Family("rbln_device_plugin_last_scan_timestamp_seconds", Kind.GAUGE,
                   "Unix time of the scanner's last publication")
READY = Family("rbln_device_plugin_ready", Kind.GAUGE,
               "1 while the readiness probe passes: every resource with devices registered and streaming")
CDI_SPEC_RESOLVABLE = Family("rbln_device_plugin_cdi_spec_resolvable", Kind.GAUGE,
                             "1 while a CDI spec in the spec dirs resolves rebellions.ai/npu=runtime, the device "
                             "the Allocate annotation names")
DRA_PREPARED_CLAIMS = Family("rbln_device_plugin_dra_prepared_claims", Kind.GAUGE,
                             "ResourceClaims worker-dra holds prepared (its checkpoint)")
DRA_HEALTH_STREAMS = Family("rbln_device_plugin_dra_health_streams", Kind.GAUGE,
                            "NodeWatchResources (device health) streams the kubelet holds open on worker-dra")
DRA_TAINTED_DEVICES = Family("rbln_device_plugin_dra_tainted_devices", Kind.GAUGE,
                             "Devices worker-dra publishes with the unhealthy taint")
STATE_FAMILIES = (DEVICES, DEVICE_STATUS, REGISTERED, STREAMS, DISCOVERY_FAILING, LAST_SCAN, READY,
                  CDI_SPEC_RESOLVABLE, DRA_PREPARED_CLAIMS, DRA_HEALTH_STREAMS, DRA_TAINTED_DEVICES)

FAMILIES = EVENT_FAMILIES + STATE_FAMILIES
# What only a stack in DRA mode shows (worker-dra's labelled events and its checkpoint's count); the others
# appear in both modes, as zero while nothing happened.
DRA_ONLY_FAMILIES = (DRA_PREPARES, DRA_SLICE_PUBLISHES, DRA_PREPARED_CLAIMS, DRA_HEALTH_STREAMS, DRA_TAINTED_DEVICES)


# Far more events than a process makes between two flushes (an Allocate makes four).
_MAX_PENDING = 4096


class Recorder:
    """Records one process's events into its value files; with metrics off (no directory) it does nothing.

    An event is only queued where it happens (an append: an Allocate pays nothing measurable for it) and
    written to the files by `flush()`, which the process calls once the work is answered: the worker after
    each response is sent, the scanner after each scan. The files are written by shared/fence/prometheus_value_files.py,
    without prometheus_client. Recording never raises into the caller's work: a value file that cannot be
    made or grown (a full or read-only run dir; its space is reserved before it is mapped, so it never costs
    a SIGBUS) is reported once, the events are dropped, and the first event recorded again is reported too.
    """

    def __init__(self, directory: pathlib.Path | None, pid: int | None = None):
        self.directory = directory
        self._pid = os.getpid() if pid is None else pid
        # Guards `_files` (the value files and what is known of their keys): flushes run on several threads.
        self._lock = threading.Lock()
        self._files: prometheus_value_files.ProcessFiles | None = None  # made by `load` or the first flush
        self._zero_series_made = False  # once they are all in the files (a full run dir can refuse some)
        # Events not written yet; appended and taken from any thread (a deque's ends are thread-safe). Bounded,
        # so that events nobody flushes cannot grow the process.
        self._pending: collections.deque[Callable[[prometheus_value_files.ProcessFiles], None]] = collections.deque(
            maxlen=_MAX_PENDING)
        # Whether the failure to record is reported; the first success after it is reported too.
        self._failure_logged = False
        # What `load` was asked to make zero series of: (resource, rbln-smi commands, worker-dra's families).
        self._zero_series: tuple[str | None, tuple[str, ...], bool] = (None, (), False)

    def load(self, resource: str | None = None, smi_commands: Iterable[str] = (), dra: bool = False) -> None:
        """Make the files now, off the path of the first event, with a zero series for each label set this
        process can record (a resource's allocations of either result, its rbln-smi commands): a query then
        finds zero rather than nothing before the first event. Files that cannot be made now (no room) are
        made at a later flush, zero series and all."""
        self._zero_series = (resource, tuple(smi_commands), dra)
        if self.directory is None:
            return
        try:
            with self._lock:
                self._load()
        except Exception as exc:  # as flush: metrics never cost the process
            self._failed(exc)

    def _load(self) -> prometheus_value_files.ProcessFiles:
        """The files with their zero series; the caller holds `_lock`."""
        assert self.directory is not None
        if self._files is None:
            self._files = prometheus_value_files.ProcessFiles(self.directory, self._pid)
        files = self._files
        if self._zero_series_made:
            return files
        resource, smi_commands, dra = self._zero_series
        for family in EVENT_FAMILIES:
            if not family.labels:
                files.touch(family)
        if resource is not None:
            for result in Result:
                files.touch(ALLOCATIONS, resource, result.value)
            for family in (ALLOCATE_DURATION, PREFERRED_ALLOCATION_DURATION, PREFERRED_ALLOCATION_FALLBACKS):
                files.touch(family, resource)
        for command in smi_commands:
            files.touch(RBLN_SMI_DURATION, command)
            files.touch(RBLN_SMI_FAILURES, command)
        if dra:
            for result in Result:
                files.touch(DRA_PREPARES, result.value)
                files.touch(DRA_SLICE_PUBLISHES, result.value)
        self._zero_series_made = True
        return files

    def _failed(self, exc: Exception) -> None:
        from loguru import logger  # not on the way of `run`, which imports this module before its exec

        if not self._failure_logged:
            self._failure_logged = True
            logger.warning("Metrics cannot be recorded; continuing without them", path=str(self.directory),
                           err=f"{type(exc).__name__}: {exc}")

    def _record(self, work: Callable[[prometheus_value_files.ProcessFiles], None]) -> None:
        if self.directory is not None:
            self._pending.append(work)

    def flush(self) -> None:
        """Write every queued event into this process's value files (from any thread, even several at once)."""
        while self.directory is not None:
            try:
                work = self._pending.popleft()
            except IndexError:
                return
            try:
                with self._lock:
                    work(self._load())
            except Exception as exc:  # metrics must never cost an allocation or a scan; the event is dropped
                self._failed(exc)
                continue
            if self._failure_logged:
                from loguru import logger

                self._failure_logged = False
                logger.info("Metrics recorded again", path=str(self.directory))

    def scan(self, seconds: float) -> None:
        self._record(lambda f: f.observe(SCAN_DURATION, seconds))

    def rbln_smi(self, command: str, seconds: float, ok: bool) -> None:
        def work(f: prometheus_value_files.ProcessFiles) -> None:
            f.observe(RBLN_SMI_DURATION, seconds, command)
            if not ok:
                f.inc(RBLN_SMI_FAILURES, command)

        self._record(work)

    def allocations(self, resource: str, result: Result, durations: Sequence[float]) -> None:
        """One Allocate call: the time each of its container requests took, and how the call ended."""
        def work(f: prometheus_value_files.ProcessFiles) -> None:
            f.inc(ALLOCATIONS, resource, result.value, amount=len(durations))
            f.touch(ALLOCATE_DURATION, resource)
            for seconds in durations:
                f.observe(ALLOCATE_DURATION, seconds, resource)

        self._record(work)

    def preferred_allocation(self, resource: str, seconds: float, fallbacks: int) -> None:
        def work(f: prometheus_value_files.ProcessFiles) -> None:
            f.observe(PREFERRED_ALLOCATION_DURATION, seconds, resource)
            if fallbacks:
                f.inc(PREFERRED_ALLOCATION_FALLBACKS, resource, amount=fallbacks)

        self._record(work)

    def prepares(self, result: Result, seconds: float) -> None:
        """One claim of a NodePrepareResources call, answered `seconds` after the call began."""
        def work(f: prometheus_value_files.ProcessFiles) -> None:
            f.inc(DRA_PREPARES, result.value)
            f.observe(DRA_PREPARE_DURATION, seconds)

        self._record(work)

    def slice_publish(self, ok: bool) -> None:
        """A reconciliation of the ResourceSlices that changed them, or failed; written at once (the publisher's
        thread is the one place it happens)."""
        self._record(lambda f: f.inc(DRA_SLICE_PUBLISHES, (Result.SUCCESS if ok else Result.FAILURE).value))
        self.flush()

    def slice_watch_restart(self) -> None:
        self._record(lambda f: f.inc(DRA_SLICE_WATCH_RESTARTS))
        self.flush()

    def checkpoint_rebuild(self) -> None:
        self._record(lambda f: f.inc(DRA_CHECKPOINT_REBUILDS))

    def stale_claim_unprepared(self) -> None:
        self._record(lambda f: f.inc(DRA_STALE_CLAIMS_UNPREPARED))

    def kubelet_restart(self) -> None:
        self._record(lambda f: f.inc(KUBELET_RESTARTS))


def recorder_for(metrics_port: int, run_dir: pathlib.Path) -> Recorder:
    """This process's recorder: into the private metrics directory with metrics on, doing nothing with them off."""
    if metrics_port < 0:
        return Recorder(None)
    directory = metrics_dir(run_dir)
    # `run` makes it empty at start; a process started on its own makes it here.
    ensure_private_dir(directory, RUN_DIR_ENV)
    return Recorder(directory)
