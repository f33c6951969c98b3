"""A full run dir or log dir costs observability, never a process: the running stack with the directory on a
small tmpfs of its own (a mount namespace: only the stack sees it), filled while it serves. Mounting needs
root, as CI runs the tests."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import sys

from shared.programs import WORKERS
from shared.supervision.client import server_proxy
from simulator.node import SimulatedNode
from simulator.stack import ENTRYPOINT, StackProcess
from tests.support.metrics_scrape import scrape_text
from tests.support.ports import free_port
from tests.support.supervision import (
    DEVICES,
    NODE,
    SERVING,
    await_health,
    await_restarted_plugins,
    await_serving,
    health,
    registrations,
)
from tests.support.waiting import wait_until

VF4 = "rebellions.ai/npu-vf4"
TMPFS_SIZE = "4m"
NOT_WRITTEN = "Log file not written; logging to stdout only"
# A round of new workers writes some 2 KiB to each log file, whose last page has at most 4 KiB free.
MAX_BURSTS = 4


def on_own_tmpfs(directory: pathlib.Path) -> list[str]:
    """`rbln-device-plugin run` in a mount namespace of its own where `directory` is a small empty tmpfs."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs -o size={TMPFS_SIZE},mode=0700 tmpfs "$0" && exec "$@"', str(directory),
            sys.executable, "-c", ENTRYPOINT, "run"]


def seen_by(stack: StackProcess, path: pathlib.Path) -> pathlib.Path:
    """`path` as the stack's mount namespace has it."""
    return pathlib.Path(f"/proc/{stack.pid}/root") / path.relative_to("/")


@contextlib.contextmanager
def filled(directory: pathlib.Path):
    """`directory`'s file system full until the end of the block."""
    filler = directory / "filler"
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    try:
        yield
    finally:
        filler.unlink()


def deaths(stack: StackProcess) -> list[str]:
    """supervisord's lines for programs that ended unexpectedly (a SIGBUS among them)."""
    return [line for line in stack.stderr_lines if "exited:" in line and "not expected" in line]


def new_workers(kubelet, run_dir: pathlib.Path) -> None:
    """Every worker stopped and started again by supervisord, each a new process that needs its files anew (a
    kubelet restart keeps the processes), and serving again. `run_dir`: as the test sees it."""
    before = registrations(kubelet)
    supervisor = server_proxy(run_dir).supervisor
    for worker in WORKERS:
        supervisor.stopProcess(worker)  # returns once it is stopped
        supervisor.startProcess(worker, False)
    await_serving(kubelet, since=before)


def start(node: SimulatedNode, directory: pathlib.Path) -> tuple[StackProcess, int, int]:
    health_port, metrics_port = free_port(), free_port()
    environ = {**os.environ, **node.env("200ms"), "HEALTHCHECK_PORT": str(health_port),
               "METRICS_PORT": str(metrics_port)}
    return StackProcess(environ, command=on_own_tmpfs(directory)).start(), health_port, metrics_port


def test_a_full_run_dir_costs_the_metrics_and_no_process(make_node, kubelet):
    node = make_node(NODE)
    stack, health_port, metrics_port = start(node, node.run_dir)
    try:
        await_serving(kubelet)
        await_health(health_port, liveness=SERVING, readiness=SERVING)
        run_dir = seen_by(stack, node.run_dir)
        with filled(run_dir):
            # New workers need new value files: they cannot have them, and serve without.
            new_workers(kubelet, run_dir)
            for _ in range(3):
                assert kubelet.allocate(VF4, [sorted(DEVICES[VF4])[:1]]).container_responses[0].devices
            reported = stack.wait_for_record("Metrics cannot be recorded; continuing without them",
                                             process="worker-npu-vf4")
            assert reported[-1]["path"] == str(node.run_dir / "metrics")
            # A kubelet restart meanwhile: the device plugins restart in their processes.
            before = registrations(kubelet)
            kubelet.restart()
            await_restarted_plugins(stack, restarts=1)
            await_serving(kubelet, since=before)
            # The probes still see every program's status: the status files are written without new space.
            wait_until(lambda: health(health_port, "liveness") == SERVING
                       and health(health_port, "readiness") == SERVING, 15, "the probes on a full run dir")
            for _ in range(10):
                assert health(health_port, "liveness") == SERVING
            assert "rbln_device_plugin_registered" in scrape_text(metrics_port)
        # Space again: the next events are recorded, and that is said once.
        assert kubelet.allocate(VF4, [sorted(DEVICES[VF4])[1:2]]).container_responses[0].devices
        stack.wait_for_record("Metrics recorded again", process="worker-npu-vf4")
        wait_until(lambda: 'rbln_device_plugin_allocations_total{resource="rebellions.ai/npu-vf4",result="success"}'
                   in scrape_text(metrics_port), 15, "the allocation counted")
        assert deaths(stack) == []
        for worker in WORKERS:
            assert len(stack.find("Metrics cannot be recorded; continuing without them", process=worker)) <= 1
    finally:
        assert stack.stop() == 0


def test_a_full_log_dir_stops_the_log_files_and_never_stdout(make_node, kubelet):
    node = make_node(NODE)
    stack, health_port, _ = start(node, node.log_dir)
    try:
        await_serving(kubelet)
        log_dir = seen_by(stack, node.log_dir)
        wait_until(lambda: len(list(log_dir.glob("*.log"))) == 5, 15, "a log file for each program")
        with filled(log_dir):
            # Bursts of records from every worker, until one does not fit: a file's last page may have room for
            # a round or two (tmpfs counts whole pages; the filler cannot take what the log files hold).
            for _ in range(MAX_BURSTS):
                new_workers(kubelet, node.run_dir)
                if stack.find(NOT_WRITTEN):
                    break
            (reported, *_) = stack.wait_for_record(NOT_WRITTEN)
            assert reported["path"] == str(node.log_dir) and "No space left" in reported["err"]
            process = reported["process"]
            await_health(health_port, liveness=SERVING, readiness=SERVING)
            # stdout had every record meanwhile, the file whole records only.
            assert stack.find("Registered device plugin with kubelet", process=process) or process not in WORKERS
            sizes = {worker: (log_dir / f"{worker}.log").stat().st_size for worker in WORKERS}
        for path in log_dir.glob("*.log"):
            for line in path.read_text().splitlines():
                json.loads(line)
        before = registrations(kubelet)
        kubelet.restart()
        await_restarted_plugins(stack, restarts=1)
        await_serving(kubelet, since=before)
        # Space again: the workers write their files, and a process that saw the full dir says so once.
        wait_until(lambda: all((log_dir / f"{worker}.log").stat().st_size > sizes[worker] for worker in WORKERS),
                   15, "the workers' log files written again")
        stack.wait_for_record("Log file written again", process=process)
        assert deaths(stack) == []
        assert not [line for line in stack.stderr_lines if "Logging error" in line]
        # Said once per change by the process running now (a worker's process before new_workers may have said
        # so too; a record that fits the file's last page is written even on a full file system).
        own = [r["msg"] for r in stack.find(process=process)]
        changes = [msg for msg in own[len(own) - own[::-1].index("Starting rbln-device-plugin"):]
                   if msg in (NOT_WRITTEN, "Log file written again")]
        assert changes[0] == NOT_WRITTEN and changes == [NOT_WRITTEN, "Log file written again"] * (len(changes) // 2)
    finally:
        assert stack.stop() == 0
