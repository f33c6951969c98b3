"""What wakes the watchdog: replaced status files and exited programs, and that its loop asks supervisord
only when they, the unsettled stack or the steady interval call for it."""

import os
import select
import socket
import subprocess
import sys
import threading

import pytest

from kubelet_watchdog import main as watchdog_main
from kubelet_watchdog.main import HealthEndpoint, Watchdog
from kubelet_watchdog.stack_watch import ProgramExits, StatusFiles
from shared.channels import status_files
from shared.config import Settings
from shared.observability.metrics import Recorder
from shared.programs import PROGRAMS, SCANNER
from shared.supervision.process_lifecycle import ShutdownSignal
from tests.support.waiting import wait_until

TIMEOUT = 15


def test_a_status_file_is_read_again_only_once_it_was_replaced(short_tmp, monkeypatch):
    files = StatusFiles(short_tmp)
    assert files.read(SCANNER) is None and not files.changed()
    status_files.write_status(short_tmp, SCANNER, {"resources": {"a": 1}})
    assert files.changed() and not files.changed()
    assert files.read(SCANNER)["resources"] == {"a": 1}
    reads = []
    real = status_files.read_status
    monkeypatch.setattr(status_files, "read_status", lambda *args: reads.append(args) or real(*args))
    assert files.read(SCANNER)["resources"] == {"a": 1} and reads == []
    status_files.write_status(short_tmp, SCANNER, {"resources": {"a": 2}})
    assert files.read(SCANNER)["resources"] == {"a": 2} and len(reads) == 1
    (short_tmp / "unrelated").write_text("x")
    files.changed()
    (short_tmp / "other").write_text("y")
    assert not files.changed(), "only status files count"
    status_files.remove_status(short_tmp, SCANNER)
    assert files.read(SCANNER) is None
    files.close()


def _child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def _serving_worker(run_dir) -> subprocess.Popen:
    """A stand-in of worker-npu that has registered (its status file, stamped with its pid), and the scanner's
    status saying the node has npu: a worker that must run."""
    _publish(run_dir, **{"rebellions.ai/npu": 1})
    code = ("import pathlib, sys; from shared.channels import status_files; "
            f"status_files.write_status(pathlib.Path({str(run_dir)!r}), 'worker-npu', "
            "{'registered': True, 'streams': 1}); print(flush=True); sys.stdin.read()")
    worker = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert worker.stdout is not None and worker.stdout.readline() == b"\n"
    return worker


def test_an_exited_program_makes_its_pidfd_readable_and_a_gone_one_is_noticed_at_once():
    exits = ProgramExits()
    child, other = _child(), _child()
    table = {"a": {"statename": "RUNNING", "pid": child.pid}, "b": {"statename": "RUNNING", "pid": other.pid},
             "c": {"statename": "STOPPED", "pid": 0}, "self": {"statename": "RUNNING", "pid": os.getpid()}}
    try:
        assert exits.watch(table, skip=(os.getpid(),)) and len(exits.filenos()) == 2
        assert not exits.exited([])
        child.kill()
        child.wait()
        readable = select.select(exits.filenos(), [], [], TIMEOUT)[0]
        assert exits.exited(readable)
        assert not exits.watch(table), "the table names a program that has exited"
        assert exits.filenos() == []
    finally:
        other.kill()
        other.wait()
        exits.close()


class CountingSupervisor:
    """supervisord's table as the watchdog asks for it, counted; `table` is changed by the test."""

    def __init__(self, table):
        self.table = table
        self.asked = 0
        self.pinged = 0
        self.lock = threading.Lock()

    def answers(self):
        with self.lock:
            self.pinged += 1

    def programs(self):
        with self.lock:
            self.asked += 1
            return {name: dict(info) for name, info in self.table.items()}

    def confirm_started(self, started):
        with self.lock:
            for name, pid in started.items():
                if self.table[name]["statename"] == "STARTING" and self.table[name]["pid"] == pid:
                    self.table[name]["statename"] = "RUNNING"


class RecordingHealth(HealthEndpoint):
    def __init__(self):
        super().__init__(-1, None)
        self.states = []

    def set(self, live, ready):
        if not self.states or self.states[-1] != (live, ready):
            self.states.append((live, ready))


class NoMetrics:
    def update(self, view):
        pass


@pytest.fixture
def steady_for_an_hour(monkeypatch):
    """supervisord is asked again in a steady stack only when something says it should."""
    monkeypatch.setattr(watchdog_main, "STEADY_CHECK_INTERVAL", 3600.0)


def _running_watchdog(short_tmp, monkeypatch, table, scan_interval="5s"):
    monkeypatch.setenv("KUBELET_DEVICE_PLUGIN_PATH", str(short_tmp))
    monkeypatch.setenv("RBLN_DEVICE_PLUGIN_RUN_DIR", str(short_tmp))
    monkeypatch.setenv("DEVICE_SCAN_INTERVAL", scan_interval)
    supervisor, health, shutdown = CountingSupervisor(table), RecordingHealth(), ShutdownSignal()
    watchdog = Watchdog(Settings.from_environ(), supervisor, health, NoMetrics(), Recorder(None))
    thread = threading.Thread(target=watchdog.run, args=(shutdown,), daemon=True)
    thread.start()
    return supervisor, health, shutdown, thread


def _table(**pids):
    return {name: {"statename": "RUNNING", "pid": pids.get(name.replace("-", "_"), os.getpid()), "start": 1000,
                   "now": 1001} for name in PROGRAMS}


def _publish(run_dir, **resources):
    status_files.write_status(run_dir, SCANNER, {"resources": {"rebellions.ai/npu": 0, "rebellions.ai/npu-vf1": 0,
                                                                 "rebellions.ai/npu-vf4": 0, **resources}})


def test_a_settled_stack_is_judged_on_its_status_files_without_asking_supervisord_again(
        short_tmp, monkeypatch, steady_for_an_hour):
    _publish(short_tmp, **{"rebellions.ai/npu": 1})
    supervisor, health, shutdown, thread = _running_watchdog(short_tmp, monkeypatch, _table())
    try:
        wait_until(lambda: health.states == [(True, False)], TIMEOUT, "live, npu not registered")
        status_files.write_status(short_tmp, "worker-npu", {"registered": True, "streams": 1})
        wait_until(lambda: health.states[-1] == (True, True), TIMEOUT, "ready once npu's worker says so")
        assert supervisor.asked == 1
    finally:
        shutdown.request()
        thread.join(TIMEOUT)
    assert not thread.is_alive()


def test_an_exiting_program_has_supervisord_asked_at_once(short_tmp, monkeypatch, steady_for_an_hour):
    worker = _serving_worker(short_tmp)
    table = _table(worker_npu=worker.pid)
    supervisor, health, shutdown, thread = _running_watchdog(short_tmp, monkeypatch, table)
    try:
        wait_until(lambda: health.states == [(True, True)], TIMEOUT, "live and ready")
        assert supervisor.asked == 1
        with supervisor.lock:
            supervisor.table["worker-npu"] = {"statename": "BACKOFF", "pid": 0, "start": 1000, "now": 1002}
        worker.kill()
        worker.wait()
        wait_until(lambda: health.states[-1] == (False, False), TIMEOUT, "not live once worker-npu is gone")
        with supervisor.lock:
            supervisor.table["worker-npu"] = {"statename": "RUNNING", "pid": os.getpid(), "start": 1002, "now": 1005}
        status_files.write_status(short_tmp, "worker-npu", {"registered": True, "streams": 1})
        # Unsettled: asked every CHECK_INTERVAL again until every program runs.
        wait_until(lambda: health.states[-1] == (True, True), TIMEOUT, "live again")
    finally:
        shutdown.request()
        thread.join(TIMEOUT)
        if worker.poll() is None:
            worker.kill()


def test_a_scanner_that_stops_publishing_ends_liveness_with_no_other_event(short_tmp, monkeypatch,
                                                                           steady_for_an_hour):
    _publish(short_tmp)
    supervisor, health, shutdown, thread = _running_watchdog(short_tmp, monkeypatch, _table(), scan_interval="1s")
    try:
        wait_until(lambda: health.states[-1:] == [(False, True)], TIMEOUT,
                   "not live once the publication is three intervals old")
        assert health.states[0] == (True, True) and supervisor.asked == 1
        _publish(short_tmp)
        wait_until(lambda: health.states[-1] == (True, True), TIMEOUT, "live again at the next publication")
    finally:
        shutdown.request()
        thread.join(TIMEOUT)


def test_a_steady_stack_has_supervisord_asked_only_whether_it_answers(short_tmp, monkeypatch):
    monkeypatch.setattr(watchdog_main, "STEADY_CHECK_INTERVAL", 0.1)
    worker = _serving_worker(short_tmp)
    supervisor, health, shutdown, thread = _running_watchdog(short_tmp, monkeypatch, _table(worker_npu=worker.pid))
    try:
        wait_until(lambda: supervisor.pinged >= 3, TIMEOUT, "three steady checks")
        assert supervisor.asked == 1 and health.states == [(True, True)]
        with supervisor.lock:
            supervisor.table["worker-npu"] = {"statename": "BACKOFF", "pid": 0, "start": 1000, "now": 1002}
        worker.kill()
        worker.wait()
        wait_until(lambda: health.states[-1] == (False, False), TIMEOUT, "the table read again at the exit")
        assert supervisor.asked >= 2
    finally:
        shutdown.request()
        thread.join(TIMEOUT)


def test_without_an_inotify_instance_the_watchdog_polls_instead_of_dying(short_tmp, monkeypatch):
    """The node's root may have used up fs.inotify.max_user_instances (shared by every root container)."""
    def refused():
        raise OSError(24, "Too many open files")

    from shared.fs import inotify

    monkeypatch.setattr(inotify, "INotify", refused)
    monkeypatch.setattr(watchdog_main, "CHECK_INTERVAL", 0.2)
    restarts = []
    monkeypatch.setattr(Watchdog, "_restart_workers", lambda self: restarts.append(1))
    _publish(short_tmp, **{"rebellions.ai/npu": 1})
    supervisor, health, shutdown, thread = _running_watchdog(short_tmp, monkeypatch, _table())
    try:
        wait_until(lambda: health.states == [(True, False)], TIMEOUT, "live, npu not registered")
        status_files.write_status(short_tmp, "worker-npu", {"registered": True, "streams": 1})
        wait_until(lambda: health.states[-1] == (True, True), TIMEOUT, "ready, seen by a check")
        assert supervisor.asked >= 2, "no steady state without status events: the table is read at every check"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(short_tmp / "kubelet.sock"))
        wait_until(lambda: restarts, TIMEOUT, "the new kubelet.sock seen without inotify")
        listener.close()
    finally:
        shutdown.request()
        thread.join(TIMEOUT)
    assert not thread.is_alive()


def test_a_starting_program_that_wrote_its_status_is_confirmed_started(short_tmp, monkeypatch, steady_for_an_hour):
    """supervisord would call it RUNNING only once startsecs has passed; its status file says it is up."""
    worker = _serving_worker(short_tmp)
    table = _table(worker_npu=worker.pid)
    for name in ("worker-npu", "watchdog", "worker-npu-vf1"):
        table[name]["statename"] = "STARTING"
    supervisor, health, shutdown, thread = _running_watchdog(short_tmp, monkeypatch, table)
    try:
        wait_until(lambda: health.states[-1:] == [(True, True)], TIMEOUT, "live and ready")
        with supervisor.lock:
            states = {name: info["statename"] for name, info in supervisor.table.items()}
        # worker-npu-vf1 wrote no status file: it is left to startsecs.
        assert states == {**dict.fromkeys(PROGRAMS, "RUNNING"), "worker-npu-vf1": "STARTING"}
    finally:
        shutdown.request()
        thread.join(TIMEOUT)
        worker.kill()
        worker.wait()
