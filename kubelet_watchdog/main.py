"""The watchdog process: restarts the workers when the kubelet restarts, ends a stack that cannot recover,
and answers the pod's liveness and readiness probes."""

from __future__ import annotations

import os
import time

from loguru import logger

from kubelet_watchdog.health_server import HealthServer
from kubelet_watchdog.probes import SCANNER, WORKERS, Verdict, liveness, readiness
from kubelet_watchdog.socket_watch import KubeletSocketWatcher
from kubelet_watchdog.supervisor_control import Supervisor, SupervisorError
from shared import runtime_status
from shared.config import Settings
from shared.process import ShutdownSignal, start_process

PROCESS = "watchdog"
CHECK_INTERVAL = 1.0


class Watchdog:
    def __init__(self, settings: Settings, supervisor: Supervisor, health: HealthServer | None):
        self._settings = settings
        self._supervisor = supervisor
        self._health = health
        self._watcher = KubeletSocketWatcher(settings.kubelet_device_plugin_path)
        self._last_verdicts: tuple[Verdict, Verdict] | None = None

    def run(self, shutdown: ShutdownSignal) -> None:
        next_check = 0.0
        while not shutdown.is_set():
            if self._watcher.wait(timeout=max(0.0, min(CHECK_INTERVAL, next_check - time.monotonic()))):
                self._restart_workers()
            if time.monotonic() >= next_check and not shutdown.is_set():
                self._check()
                next_check = time.monotonic() + CHECK_INTERVAL
        self._watcher.close()

    def _restart_workers(self) -> None:
        logger.info("Detected kubelet socket recreation; restarting device plugins",
                    path=str(self._settings.kubelet_socket))
        try:
            self._supervisor.restart(WORKERS)
        except SupervisorError as exc:
            logger.error("Restarting device plugins failed", err=str(exc))

    def _check(self) -> None:
        try:
            programs = self._supervisor.programs()
        except SupervisorError as exc:
            logger.warning("Cannot read program states", err=str(exc))
            return
        fatal = sorted(name for name, info in programs.items() if info.get("statename") == "FATAL")
        if fatal:
            # A program supervisord gave up on serves nothing; ending the pod lets Kubernetes restart it.
            logger.error("Program failed permanently; shutting the stack down", programs=fatal)
            try:
                self._supervisor.shutdown()
            except SupervisorError as exc:
                logger.error("Shutdown request failed", err=str(exc))
            return
        run_dir = self._settings.run_dir
        scanner = runtime_status.read_status(run_dir, SCANNER)
        workers = {name: runtime_status.read_status(run_dir, name) for name in WORKERS}
        live = liveness(programs, scanner, time.monotonic(), self._settings.device_scan_interval)
        ready = readiness(programs, scanner, workers)
        if self._health is not None:
            self._health.set(live.ok, ready.ok)
        if (live, ready) != self._last_verdicts:
            logger.debug("Probe state", live=live.ok, liveReason=live.reason, ready=ready.ok,
                         readyReason=ready.reason)
            self._last_verdicts = (live, ready)


def main() -> None:
    settings = start_process(PROCESS)
    shutdown = ShutdownSignal().install()
    health = None
    if settings.healthcheck_port >= 0:
        health = HealthServer(settings.healthcheck_port)
        health.start()
        logger.info("Health service listening", port=health.port)
    try:
        Watchdog(settings, Supervisor(os.environ), health).run(shutdown)
    finally:
        if health is not None:
            health.stop()
    logger.info("Shutdown")
