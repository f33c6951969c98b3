import errno
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import xmlrpc.client

import pytest
from supervisor.xmlrpc import Faults

from kubelet_watchdog.kubelet_socket_watch import KubeletSocketWatcher
from kubelet_watchdog.main import HealthEndpoint, Watchdog
from kubelet_watchdog.probes import liveness, needed_programs, readiness
from kubelet_watchdog.stack_metrics import StackView
from rbln_device_plugin.pod_resources_client import Holder
from rbln_device_plugin.status import build_report, render_text
from shared.config import ResourceApi, Settings
from shared.observability.metrics import Recorder
from shared.programs import PLUGIN_RESTART_SIGNAL, PROGRAMS, WORKERS
from shared.supervision.client import Supervisor, SupervisorError, SupervisorStopping
from shared.supervision.transport import SHUTDOWN_STATE_FAULT, fault_code
from tests.support.status_samples import running, scanner_status, worker_status

# Probes


def test_live_when_every_program_runs_and_the_scanner_publishes():
    programs = running()
    assert liveness(programs, scanner_status(programs), now_monotonic=55.0, scan_interval=5, expected=PROGRAMS).ok


@pytest.mark.parametrize("program", PROGRAMS)
def test_not_live_when_any_program_is_not_running(program):
    programs = running(**{program.replace("-", "_"): "BACKOFF"})
    verdict = liveness(programs, scanner_status(programs), now_monotonic=55.0, scan_interval=5, expected=PROGRAMS)
    assert not verdict.ok and program in verdict.reason


def test_a_worker_the_node_never_needed_is_absent_not_down():
    programs = running()
    for name in ("worker-npu-vf1", "worker-npu-vf4"):
        del programs[name]  # never started: supervisord's table leaves them out
    scanner = scanner_status(programs, npu=8)
    needed = needed_programs(ResourceApi.DEVICE_PLUGIN, scanner)
    assert needed == ("scanner", "worker-npu", "watchdog")
    assert liveness(programs, scanner, now_monotonic=55.0, scan_interval=5, expected=needed).ok
    del programs["worker-npu"]
    verdict = liveness(programs, scanner, now_monotonic=55.0, scan_interval=5, expected=needed)
    assert not verdict.ok and "worker-npu is ABSENT" in verdict.reason, "one that must run and does not"


def test_not_live_when_the_scanner_is_stuck():
    programs = running()
    verdict = liveness(programs, scanner_status(programs, monotonic=10.0), now_monotonic=26.0, scan_interval=5,
                       expected=PROGRAMS)
    assert not verdict.ok and "old" in verdict.reason


def test_a_read_only_run_dir_leaves_the_scanner_unjudged_but_not_the_programs(short_tmp, monkeypatch):
    programs = running()
    stale = scanner_status(programs, monotonic=10.0)
    assert liveness(programs, stale, 26.0, 5, PROGRAMS, status_writable=False).ok
    stopped = running(scanner="BACKOFF")
    assert not liveness(stopped, stale, 26.0, 5, PROGRAMS, status_writable=False).ok

    monkeypatch.setenv("KUBELET_DEVICE_PLUGIN_PATH", str(short_tmp))
    monkeypatch.setenv("RBLN_DEVICE_PLUGIN_RUN_DIR", str(short_tmp))
    logged = []
    monkeypatch.setattr("kubelet_watchdog.main.logger.warning", lambda message, **fields: logged.append(message))
    monkeypatch.setattr("kubelet_watchdog.main.logger.info", lambda message, **fields: logged.append(message))
    watchdog = Watchdog(Settings.from_environ(), UnreachableSupervisor(), HealthEndpoint(-1, None), None, None)
    real_statvfs = os.statvfs
    read_only = {"on": True}

    class ReadOnly:
        def __init__(self, result):
            self.f_flag = result.f_flag | (os.ST_RDONLY if read_only["on"] else 0)

    monkeypatch.setattr("kubelet_watchdog.main.os.statvfs", lambda path: ReadOnly(real_statvfs(path)))
    assert [watchdog._run_dir_writable() for _ in range(3)] == [False] * 3
    read_only["on"] = False
    assert watchdog._run_dir_writable()
    assert logged == ["Run dir is read-only; liveness judges program states only", "Run dir writable again"]


def test_a_just_started_scanner_gets_three_intervals_of_grace():
    programs = running()
    assert liveness(programs, None, now_monotonic=0, scan_interval=5, expected=PROGRAMS).ok
    programs["scanner"]["now"] = programs["scanner"]["start"] + 16
    assert not liveness(programs, None, now_monotonic=0, scan_interval=5, expected=PROGRAMS).ok


def test_ready_only_when_every_resource_with_devices_is_registered_and_streaming():
    programs = running()
    scanner = scanner_status(programs, npu=4, npu_vf4=8)
    workers = {"worker-npu": worker_status(programs, "worker-npu"),
               "worker-npu-vf4": worker_status(programs, "worker-npu-vf4"), "worker-npu-vf1": None}
    assert readiness(programs, scanner, workers).ok
    assert not readiness(programs, scanner, {**workers, "worker-npu-vf4": {**workers["worker-npu-vf4"],
                                                                           "streams": 0}}).ok
    assert not readiness(programs, scanner, {**workers, "worker-npu": {**workers["worker-npu"],
                                                                       "registered": False}}).ok
    stale = {**workers, "worker-npu": {**workers["worker-npu"], "pid": 1}}  # left by a dead instance
    assert not readiness(programs, scanner, stale).ok
    assert not readiness(programs, None, workers).ok


# The kubelet socket watch


def bind_socket(path: pathlib.Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return sock


def test_socket_watch_reports_each_new_kubelet_socket_once(short_tmp):
    watcher = KubeletSocketWatcher(short_tmp)
    assert not watcher.recreated()
    path = short_tmp / "kubelet.sock"
    first = bind_socket(path)
    assert watcher.recreated() and not watcher.recreated()
    bind_socket(short_tmp / "rbln-device-plugin-rebellions-ai-npu-1-00000000.sock").close()
    assert not watcher.recreated(), "another socket in the directory is not the kubelet's"
    first.close()
    os.unlink(path)
    assert not watcher.recreated(), "a deleted socket is no new socket"
    second = bind_socket(path)
    assert watcher.recreated()
    second.close()
    watcher.close()


def test_socket_watch_counts_the_event_even_when_the_file_looks_the_same(short_tmp):
    """A kubelet.sock moved away and back keeps its inode and mtime: only the event tells."""
    path = short_tmp / "kubelet.sock"
    sock = bind_socket(path)
    watcher = KubeletSocketWatcher(short_tmp)
    os.rename(path, short_tmp / "elsewhere")
    os.rename(short_tmp / "elsewhere", path)
    assert watcher.recreated()
    sock.close()
    watcher.close()


def test_socket_watch_falls_back_to_the_identity_check_without_events(short_tmp):
    plugin_dir = short_tmp / "later"
    watcher = KubeletSocketWatcher(plugin_dir)  # nothing to watch yet: no event can arrive
    assert not watcher.recreated()
    plugin_dir.mkdir()
    sock = bind_socket(plugin_dir / "kubelet.sock")
    assert watcher.recreated() and not watcher.recreated()
    sock.close()
    watcher.close()


# Ordering the workers' restarts through supervisord


class FakeSupervisord:
    """supervisord's XML-RPC namespaces: signalProcess as supervisord answers it, for programs in `states`."""

    def __init__(self, states: dict[str, str], fault: int | None = None):
        self.signalled: list[tuple[str, str]] = []
        self.states = states
        self.fault = fault
        self.supervisor = self
        self.system = self

    def multicall(self, calls):
        if self.fault is not None:
            raise xmlrpc.client.Fault(self.fault, "fault")
        results = []
        for call in calls:
            assert call["methodName"] == "supervisor.signalProcess"
            name, signame = call["params"]
            if self.states[name] == "EXITED-MEANWHILE":  # its state said running; its kill() found no process
                results.append({"faultCode": Faults.FAILED, "faultString": f"FAILED: {name}"})
                continue
            if self.states[name] not in ("RUNNING", "STARTING", "STOPPING"):  # no process to signal
                results.append({"faultCode": Faults.NOT_RUNNING, "faultString": f"NOT_RUNNING: {name}"})
                continue
            self.signalled.append((name, signame))
            results.append(True)
        return results


def test_the_restart_order_goes_to_every_worker_with_a_process_in_one_request():
    supervisord = FakeSupervisord({"worker-npu": "RUNNING", "worker-npu-vf1": "BACKOFF",
                                   "worker-npu-vf4": "STARTING"})
    Supervisor(supervisord).send_signal(WORKERS, PLUGIN_RESTART_SIGNAL)
    # One waiting to start again has no process: it registers with the new kubelet when it starts.
    assert supervisord.signalled == [("worker-npu", "SIGWINCH"), ("worker-npu-vf4", "SIGWINCH")]


def test_a_worker_that_exits_while_it_is_signalled_does_not_fail_the_order_of_the_others():
    supervisord = FakeSupervisord({"worker-npu": "RUNNING", "worker-npu-vf1": "EXITED-MEANWHILE",
                                   "worker-npu-vf4": "RUNNING"})
    Supervisor(supervisord).send_signal(WORKERS, PLUGIN_RESTART_SIGNAL)
    assert supervisord.signalled == [("worker-npu", "SIGWINCH"), ("worker-npu-vf4", "SIGWINCH")]


def test_a_stopping_supervisord_is_told_apart_from_other_failures():
    with pytest.raises(SupervisorStopping):
        Supervisor(FakeSupervisord({}, fault=Faults.SHUTDOWN_STATE)).send_signal(WORKERS, PLUGIN_RESTART_SIGNAL)
    with pytest.raises(SupervisorError) as failed:
        Supervisor(FakeSupervisord({}, fault=Faults.FAILED)).send_signal(WORKERS, PLUGIN_RESTART_SIGNAL)
    assert not isinstance(failed.value, SupervisorStopping)


# What the watchdog tells the health service


class RecordingHealthServer:
    """HealthServer's interface, remembering every state it is given."""

    def __init__(self, port):
        self.port = port
        self.states: list[tuple[bool, bool]] = []

    def start(self):
        pass

    def set(self, live, ready):
        self.states.append((live, ready))


def test_the_health_service_is_given_a_state_only_when_it_changes():
    servers = []
    endpoint = HealthEndpoint(0, lambda port: servers.append(RecordingHealthServer(port)) or servers[-1])
    for state in [(True, False), (True, False), (True, True), (True, True), (True, True), (False, False)]:
        endpoint.set(*state)
    assert [server.states for server in servers] == [[(True, False), (True, True), (False, False)]]
    disabled = HealthEndpoint(-1, lambda port: pytest.fail("a disabled health service listens"))
    disabled.set(True, True)


class UnreachableSupervisor:
    def programs(self):
        raise SupervisorError("reading program states: supervisord did not answer within 5s")


def test_a_supervisord_that_cannot_be_asked_makes_the_stack_neither_live_nor_ready(short_tmp, monkeypatch):
    monkeypatch.setenv("KUBELET_DEVICE_PLUGIN_PATH", str(short_tmp))
    monkeypatch.setenv("RBLN_DEVICE_PLUGIN_RUN_DIR", str(short_tmp))
    servers = []
    health = HealthEndpoint(0, lambda port: servers.append(RecordingHealthServer(port)) or servers[-1])
    health.set(True, True)
    views = []

    class MetricsViews:
        """The metrics endpoint, as the watchdog's checks update it."""

        def update(self, view):
            views.append(view)

    watchdog = Watchdog(Settings.from_environ(), UnreachableSupervisor(), health, MetricsViews(), Recorder(None))
    watchdog._check()
    watchdog._check()
    assert servers[0].states == [(True, True), (False, False)]
    # No status file can be trusted either: the metrics show nothing registered and nothing ready.
    assert views == [StackView(None, {}, ready=False)] * 2


# The status command's report


def test_status_report_trusts_only_files_of_running_instances():
    programs = running(worker_npu_vf1="BACKOFF")
    programs["worker-npu-vf1"]["pid"] = 0
    workers = {"worker-npu": worker_status(programs, "worker-npu"),
               "worker-npu-vf1": worker_status(programs, "worker-npu"),  # not its pid: a dead instance's
               "worker-npu-vf4": worker_status(programs, "worker-npu-vf4", registered=False, streams=0)}
    report = build_report(programs, scanner_status(programs, npu=4, npu_vf1=2, npu_vf4=4), workers, 50.5)
    assert report["processes"]["worker-npu-vf1"]["state"] == "BACKOFF"
    assert report["processes"]["worker-npu-vf1"]["pid"] is None
    assert report["resources"]["rebellions.ai/npu"] == {
        "process": "worker-npu", "registered": True, "streams": 1, "deviceCount": 4, "healthyCount": 3,
        "unhealthyCount": 1, "lastScanAgeSeconds": 1.5}
    assert report["resources"]["rebellions.ai/npu-vf1"] == {
        "process": "worker-npu-vf1", "registered": False, "streams": 0, "deviceCount": 2, "healthyCount": None,
        "unhealthyCount": None, "lastScanAgeSeconds": None}
    assert report["resources"]["rebellions.ai/npu-vf4"]["registered"] is False
    assert report["scanner"] == {"lastScanAgeSeconds": 0.5, "discoveryError": None}
    json.dumps(report)
    text = render_text(report)
    assert "worker-npu-vf1  BACKOFF" in text
    assert any(line.split()[:7] == ["rebellions.ai/npu", "yes", "1", "4", "3", "1", "1.5s"]
               for line in text.splitlines())


def test_status_report_without_supervisord_claims_nothing():
    programs = running()
    report = build_report(None, scanner_status(programs, npu=4),
                          {"worker-npu": worker_status(programs, "worker-npu")}, 50.0)
    assert {p["state"] for p in report["processes"].values()} == {"UNKNOWN"}
    assert not any(r["registered"] or r["deviceCount"] for r in report["resources"].values())
    assert report["scanner"]["lastScanAgeSeconds"] is None


def test_status_report_shows_each_device_and_the_container_holding_it():
    programs = running()
    workers = {"worker-npu": worker_status(programs, "worker-npu", devices={
        "rbln0": {"health": "Healthy", "status": "READY"}, "rbln1": {"health": "Unhealthy", "status": "FAULT"}}),
        "worker-npu-vf4": worker_status(programs, "worker-npu", devices={  # a dead instance's: not shown
            "rbln2-0": {"health": "Healthy", "status": "READY"}})}
    holders = {("rebellions.ai/npu", "rbln0"): [Holder("ml", "train-0", "main")],
               ("rebellions.ai/npu-vf4", "rbln2-0"): [Holder("ml", "infer", "app")]}
    report = build_report(programs, scanner_status(programs, npu=2), workers, 50.5, holders)
    assert report["devices"] == [
        {"device": "rbln0", "resource": "rebellions.ai/npu", "health": "Healthy", "status": "READY",
         "heldBy": ["ml/train-0/main"]},
        {"device": "rbln1", "resource": "rebellions.ai/npu", "health": "Unhealthy", "status": "FAULT",
         "heldBy": []}]
    assert report["podResources"] == {"error": None}
    rows = {line.split()[0]: line.split()[1:] for line in render_text(report).splitlines() if line.strip()}
    assert rows["DEVICE"] == ["RESOURCE", "HEALTH", "STATUS", "HELD", "BY"]
    assert rows["rbln0"] == ["rebellions.ai/npu", "Healthy", "READY", "ml/train-0/main"]
    assert rows["rbln1"] == ["rebellions.ai/npu", "Unhealthy", "FAULT", "-"]


def test_status_report_without_the_kubelet_shows_holders_unknown():
    programs = running()
    workers = {"worker-npu": worker_status(programs, "worker-npu", devices={
        "rbln0": {"health": "Healthy", "status": "READY"}})}
    report = build_report(programs, None, workers, 50.5, None, "no socket at /var/lib/kubelet/pod-resources/x")
    assert report["devices"][0]["heldBy"] is None
    text = render_text(report)
    assert [line.split()[-1] for line in text.splitlines() if line.startswith("rbln0")] == ["unknown"]
    assert "held by: unknown; the kubelet's PodResources API cannot be asked: no socket at" in text


# Shutdown signals


def test_the_stopping_supervisord_is_recognised_by_its_fault():
    assert SHUTDOWN_STATE_FAULT == Faults.SHUTDOWN_STATE
    stopping = xmlrpc.client.dumps(xmlrpc.client.Fault(Faults.SHUTDOWN_STATE, "SHUTDOWN_STATE"), methodresponse=True)
    assert fault_code(stopping.encode()) == Faults.SHUTDOWN_STATE
    running_state = xmlrpc.client.dumps(({"statecode": 1, "statename": "RUNNING"},), methodresponse=True)
    assert fault_code(running_state.encode()) is None
    assert fault_code(b"") is None and fault_code(b"<html>Bad Request</html>") is None

_SIGNAL_SCRIPT = """
import select, sys
from shared.observability import log
from shared.supervision.process_lifecycle import ShutdownSignal
log.setup("test", {"RBLN_DEVICE_PLUGIN_LOG_DIR": ""})
shutdown = ShutdownSignal({}).install()
heard = []
shutdown.on_request(lambda: heard.append("listener"))
print("ready", flush=True)
select.select([shutdown], [], [], 20)
print(shutdown.signal_name, heard, flush=True)
"""

_ORDER_SCRIPT = """
import os, select, signal, sys, threading
from shared.observability import log
from shared.supervision.process_lifecycle import ShutdownSignal
log.setup("test", {"RBLN_DEVICE_PLUGIN_LOG_DIR": ""})
shutdown = ShutdownSignal({}).install()
orders = []
ordered = threading.Event()
shutdown.on_signal(signal.SIGWINCH, lambda: (orders.append(threading.current_thread().name), ordered.set()))
print("ready", flush=True)
ordered.wait(20)
print(orders, flush=True)
select.select([shutdown], [], [], 20)
os.kill(os.getpid(), signal.SIGWINCH)  # once shutdown is under way, an order is not passed on
print(orders, shutdown.signal_name, flush=True)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP],
                         ids=lambda signum: signum.name)
def test_a_shutdown_signal_is_logged_by_name_and_wakes_select(signum):
    process = subprocess.Popen([sys.executable, "-c", _SIGNAL_SCRIPT], stdout=subprocess.PIPE, text=True,
                               cwd=pathlib.Path(__file__).resolve().parents[2])
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signum)
    process.send_signal(signum)  # a duplicate is ignored, even while the process exits
    out, _ = process.communicate(timeout=20)
    assert process.returncode == 0
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["msg"], r["signal"]) for r in records if r["msg"] == "Shutdown signal received"] == \
        [("Shutdown signal received", signum.name)]
    assert out.splitlines()[-1] == f"{signum.name} ['listener']"


def test_another_signal_is_handed_to_its_listener_by_the_signal_thread_until_shutdown():
    process = subprocess.Popen([sys.executable, "-c", _ORDER_SCRIPT], stdout=subprocess.PIPE, text=True,
                               cwd=pathlib.Path(__file__).resolve().parents[2])
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGWINCH)
    assert process.stdout.readline() == "['shutdown-signal']\n"
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=20)
    assert process.returncode == 0
    assert out.splitlines()[-1] == "['shutdown-signal'] SIGTERM"


def test_a_health_service_that_cannot_start_is_stopped_and_tried_again_at_the_next_check():
    class FailingFirst(RecordingHealthServer):
        starts = 0

        def start(self):
            FailingFirst.starts += 1
            if FailingFirst.starts == 1:
                raise OSError(errno.EMFILE, "Too many open files")

        def stop(self):
            self.stopped = True

    servers = []
    endpoint = HealthEndpoint(0, lambda port: servers.append(FailingFirst(port)) or servers[-1])
    endpoint.set(True, True)
    endpoint.set(True, True)
    assert len(servers) == 2 and servers[0].stopped and servers[1].states == [(True, True)]


def _dra_programs(**states):
    from shared.programs import DRA_PROGRAMS

    programs = {name: {"statename": states.get(name, "RUNNING"), "pid": 200 + i, "start": 1000, "now": 1001}
                for i, name in enumerate(DRA_PROGRAMS)}
    for name in WORKERS:  # in supervisor.conf, never started in DRA mode
        programs[name] = {"statename": "STOPPED", "pid": 0, "start": 0, "now": 1001}
    return programs


def test_in_dra_mode_liveness_wants_worker_dra_and_not_the_device_plugin_workers():
    from shared.programs import DRA_PROGRAMS

    programs = _dra_programs()
    scanner = {"pid": programs["scanner"]["pid"], "monotonic": 50.0, "resources": {}}
    assert liveness(programs, scanner, 51.0, 5.0, DRA_PROGRAMS).ok
    assert not liveness(programs, scanner, 51.0, 5.0, PROGRAMS).ok, "the device plugin mode's programs"
    dead = _dra_programs(**{"worker-dra": "BACKOFF"})
    assert "worker-dra is BACKOFF" in liveness(dead, scanner, 51.0, 5.0, DRA_PROGRAMS).reason


def test_in_dra_mode_readiness_is_worker_dra_s_registration():
    programs = _dra_programs()
    scanner = {"pid": programs["scanner"]["pid"], "monotonic": 50.0, "resources": {"rebellions.ai/npu": 2}}
    pid = programs["worker-dra"]["pid"]
    assert not readiness(programs, scanner, {"worker-dra": None}).ok
    assert not readiness(programs, scanner, {"worker-dra": {"pid": pid, "registered": False}}).ok
    assert not readiness(programs, scanner, {"worker-dra": {"pid": pid + 1, "registered": True}}).ok, "stale file"
    assert readiness(programs, scanner, {"worker-dra": {"pid": pid, "registered": True}}).ok
