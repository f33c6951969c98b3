"""The watchdog process: restarts the workers when the kubelet restarts, ends a stack that cannot recover,
and answers the pod's liveness and readiness probes."""

from __future__ import annotations

import select
import time
from collections.abc import Callable

from loguru import logger

from kubelet_watchdog.health_server import HealthServer
from kubelet_watchdog.probes import SCANNER, WORKERS, Verdict, liveness, readiness
from kubelet_watchdog.socket_watch import KubeletSocketWatcher
from kubelet_watchdog.supervisor_control import Supervisor, SupervisorError, SupervisorStopping, connect
from scanner.cdi import remove_stale_specs
from shared import runtime_status
from shared.config import Settings
from shared.process import ShutdownSignal, start_process

PROCESS = "watchdog"
# Program states and status files, for the probes (which the kubelet asks every 10 s) and to notice a
# FATAL program: each check costs this process and supervisord about 1.5 ms of CPU.
CHECK_INTERVAL = 2.0
_UNREACHABLE = Verdict(False, "supervisord does not answer")


class HealthEndpoint:
    """The health service, if enabled; a port that cannot be bound now is tried again at every check.
    A state is handed to the service only when it differs from the one it has."""

    def __init__(self, port: int, make_server: Callable[[int], HealthServer] = HealthServer):
        self._port = port
        self._make_server = make_server
        self._server: HealthServer | None = None
        self._published: tuple[bool, bool] | None = None
        self._failure_logged = False

    def set(self, live: bool, ready: bool) -> None:
        if self._port < 0:
            return
        if self._server is None and not self._listen():
            return
        if (live, ready) != self._published:
            self._server.set(live, ready)
            self._published = (live, ready)

    def _listen(self) -> bool:
        try:
            self._server = self._make_server(self._port)
        except RuntimeError as exc:  # grpc's "Failed to bind"
            if not self._failure_logged:
                logger.error("Health service cannot listen; retrying", port=self._port, err=str(exc))
                self._failure_logged = True
            return False
        self._server.start()
        logger.info("Health service listening", port=self._server.port)
        return True

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()


class Watchdog:
    def __init__(self, settings: Settings, supervisor: Supervisor, health: HealthEndpoint):
        self._settings = settings
        self._supervisor = supervisor
        self._health = health
        self._watcher = KubeletSocketWatcher(settings.kubelet_device_plugin_path)
        self._last_verdicts: tuple[Verdict, Verdict] | None = None

    def run(self, shutdown: ShutdownSignal) -> None:
        next_check = 0.0
        while not shutdown.is_set():
            select.select([self._watcher, shutdown], [], [], max(0.0, next_check - time.monotonic()))
            if shutdown.is_set():
                break
            if self._watcher.recreated():
                self._restart_workers()
            if time.monotonic() >= next_check:
                self._check()
                next_check = time.monotonic() + CHECK_INTERVAL
        self._watcher.close()

    def _restart_workers(self) -> None:
        logger.info("Detected kubelet socket recreation; restarting device plugins",
                    path=str(self._settings.kubelet_socket))
        # The device plugins start afresh, as at the stack's start, and so does the CDI root: leftover
        # transient specs go again. Here, not in the scanner, which a kubelet restart does not restart.
        remove_stale_specs(self._settings.cdi_root)
        try:
            self._supervisor.restart(WORKERS)
        except SupervisorStopping:
            pass  # the whole stack is stopping
        except SupervisorError as exc:
            logger.error("Restarting device plugins failed", err=str(exc))

    def _check(self) -> None:
        try:
            programs = self._supervisor.programs()
        except SupervisorStopping:
            return
        except SupervisorError as exc:
            # Nothing says the programs run, and nothing could restart them: so that Kubernetes
            # restarts the pod if supervisord stays unreachable past the probes' failure thresholds.
            if self._last_verdicts != (_UNREACHABLE, _UNREACHABLE):
                logger.warning("Cannot read program states; reporting not live and not ready", err=str(exc))
            self._report(_UNREACHABLE, _UNREACHABLE)
            return
        fatal = sorted(name for name, info in programs.items() if info.get("statename") == "FATAL")
        if fatal:
            # A program supervisord gave up on serves nothing; ending the pod lets Kubernetes restart it.
            logger.error("Program failed permanently; shutting the stack down", programs=fatal)
            try:
                self._supervisor.shutdown()
            except SupervisorStopping:
                pass  # already on its way down
            except SupervisorError as exc:
                logger.error("Shutdown request failed", err=str(exc))
            return
        run_dir = self._settings.run_dir
        scanner = runtime_status.read_status(run_dir, SCANNER)
        workers = {name: runtime_status.read_status(run_dir, name) for name in WORKERS}
        self._report(liveness(programs, scanner, time.monotonic(), self._settings.device_scan_interval),
                     readiness(programs, scanner, workers))

    def _report(self, live: Verdict, ready: Verdict) -> None:
        self._health.set(live.ok, ready.ok)
        if (live, ready) != self._last_verdicts:
            logger.debug("Probe state", live=live.ok, liveReason=live.reason, ready=ready.ok,
                         readyReason=ready.reason)
            self._last_verdicts = (live, ready)


def main() -> None:
    settings = start_process(PROCESS)
    shutdown = ShutdownSignal().install()
    health = HealthEndpoint(settings.healthcheck_port)
    try:
        Watchdog(settings, connect(settings.run_dir), health).run(shutdown)
    finally:
        health.stop()
    logger.info("Shutdown")
