import os
import pathlib
import socket

import pytest

from kubelet_watchdog.probes import PROGRAMS, liveness, readiness
from kubelet_watchdog.socket_watch import KubeletSocketWatcher


def running(**overrides):
    programs = {name: {"statename": "RUNNING", "pid": 100 + i, "start": 1000, "now": 1001}
                for i, name in enumerate(PROGRAMS)}
    for name, state in overrides.items():
        programs[name.replace("_", "-")]["statename"] = state
    return programs


def scanner_status(programs, monotonic=50.0, **resources):
    return {"pid": programs["scanner"]["pid"], "monotonic": monotonic,
            "resources": {"rebellions.ai/npu": 0, "rebellions.ai/npu-vf1": 0, "rebellions.ai/npu-vf4": 0,
                          **{f"rebellions.ai/{k.replace('_', '-')}": v for k, v in resources.items()}}}


def test_live_when_every_program_runs_and_the_scanner_publishes():
    programs = running()
    assert liveness(programs, scanner_status(programs), now_monotonic=55.0, scan_interval=5).ok


@pytest.mark.parametrize("program", PROGRAMS)
def test_not_live_when_any_program_is_not_running(program):
    programs = running(**{program.replace("-", "_"): "BACKOFF"})
    verdict = liveness(programs, scanner_status(programs), now_monotonic=55.0, scan_interval=5)
    assert not verdict.ok and program in verdict.reason


def test_not_live_when_the_scanner_is_stuck():
    programs = running()
    verdict = liveness(programs, scanner_status(programs, monotonic=10.0), now_monotonic=26.0, scan_interval=5)
    assert not verdict.ok and "old" in verdict.reason


def test_a_just_started_scanner_gets_three_intervals_of_grace():
    programs = running()
    assert liveness(programs, None, now_monotonic=0, scan_interval=5).ok
    programs["scanner"]["now"] = programs["scanner"]["start"] + 16
    assert not liveness(programs, None, now_monotonic=0, scan_interval=5).ok


def test_ready_only_when_every_resource_with_devices_is_registered_and_streaming():
    programs = running()
    scanner = scanner_status(programs, npu=4, npu_vf4=8)
    worker = lambda name, **f: {"pid": programs[name]["pid"], "registered": True, "streams": 1, **f}  # noqa: E731
    workers = {"worker-npu": worker("worker-npu"), "worker-npu-vf4": worker("worker-npu-vf4"),
               "worker-npu-vf1": None}
    assert readiness(programs, scanner, workers).ok
    assert not readiness(programs, scanner, {**workers, "worker-npu-vf4": worker("worker-npu-vf4", streams=0)}).ok
    assert not readiness(programs, scanner, {**workers, "worker-npu": worker("worker-npu", registered=False)}).ok
    stale = {**workers, "worker-npu": {**workers["worker-npu"], "pid": 1}}  # left by a dead instance
    assert not readiness(programs, scanner, stale).ok
    assert not readiness(programs, None, workers).ok


def test_socket_watch_reports_each_new_kubelet_socket(short_tmp):
    watcher = KubeletSocketWatcher(short_tmp)
    assert not watcher.wait(0.01)
    path = short_tmp / "kubelet.sock"
    first = socket.socket(socket.AF_UNIX)
    first.bind(str(path))
    assert watcher.wait(2.0)
    assert not watcher.wait(0.01)
    os.unlink(path)
    second = socket.socket(socket.AF_UNIX)
    second.bind(str(path))
    assert watcher.wait(2.0)
    first.close()
    second.close()
    watcher.close()


def test_socket_watch_survives_a_missing_directory(short_tmp):
    plugin_dir = short_tmp / "later"
    watcher = KubeletSocketWatcher(plugin_dir)
    assert not watcher.wait(0.01)
    plugin_dir.mkdir()
    pathlib.Path(plugin_dir / "kubelet.sock").touch()
    assert watcher.wait(0.01)
    watcher.close()
