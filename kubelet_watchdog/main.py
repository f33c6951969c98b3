"""The watchdog process: has the workers restart their device plugins when the kubelet restarts, ends a stack
that cannot recover, answers the pod's liveness and readiness probes and serves the stack's metrics."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from loguru import logger

from kubelet_watchdog.health_server import HEALTH_BACKEND_SOCKET, HealthServer
from kubelet_watchdog.probes import Verdict, current_status, liveness, readiness
from kubelet_watchdog.socket_watch import KubeletSocketWatcher
from kubelet_watchdog.stack_metrics import StackView
from shared import process_status
from shared.cdi_specs import remove_stale_specs
from shared.config import ResourceApi, Settings
from shared.metrics import Recorder, metrics_dir, recorder_for
from shared.process_lifecycle import ShutdownSignal, start_process
from shared.programs import PLUGIN_RESTART_SIGNAL, SCANNER, WATCHDOG, WORKER_DRA, WORKERS, programs_for
from shared.supervisord.client import Supervisor, SupervisorError, SupervisorStopping, connect

if TYPE_CHECKING:
    from kubelet_watchdog.metrics_server import MetricsEndpoint

# Program states and status files, for the probes (which the kubelet asks every 10 s), the metrics and to
# notice a FATAL program: each check costs this process and supervisord about 1.5 ms of CPU.
CHECK_INTERVAL = 2.0
_UNREACHABLE = Verdict(False, "supervisord does not answer")


class HealthEndpoint:
    """The health service, if enabled; a port that cannot be bound now is tried again at every check.
    A state is handed to the service only when it differs from the one it has."""

    def __init__(self, port: int, make_server: Callable[[int], HealthServer]):
        self._port = port
        self._make_server = make_server
        self._server: HealthServer | None = None
        self._published: tuple[bool, bool] | None = None
        self._failure_logged = False

    def set(self, live: bool, ready: bool) -> None:
        if self._port < 0:
            return
        server = self._server if self._server is not None else self._listen()
        if server is None:
            return
        if (live, ready) != self._published:
            server.set(live, ready)
            self._published = (live, ready)

    def _listen(self) -> HealthServer | None:
        """The server, listening, or None when the port cannot be bound now."""
        server = None
        try:
            server = self._make_server(self._port)
            server.start()
        except (OSError, RuntimeError) as exc:  # RuntimeError: gRPC cannot bind its unix socket
            if server is not None:
                server.stop()  # the port it holds, to be bound again at the next check
            if not self._failure_logged:
                logger.error("Health service cannot listen; retrying", port=self._port, err=str(exc))
                self._failure_logged = True
            return None
        self._server = server
        logger.info("Health service listening", port=server.port)
        return server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()


class Watchdog:
    def __init__(self, settings: Settings, supervisor: Supervisor, health: HealthEndpoint,
                 metrics: MetricsEndpoint, recorder: Recorder):
        self._settings = settings
        self._supervisor = supervisor
        self._health = health
        self._metrics = metrics
        self._recorder = recorder
        self._watcher = KubeletSocketWatcher(settings.kubelet_device_plugin_path)
        self._last_verdicts: tuple[Verdict, Verdict] | None = None
        self._run_dir_was_writable = True

    def run(self, shutdown: ShutdownSignal) -> None:
        next_check = 0.0
        while not shutdown.is_set():
            select.select([self._watcher.fileno(), shutdown.fileno()], [], [], max(0.0, next_check - time.monotonic()))
            if shutdown.is_set():
                break
            # A DRA plugin needs nothing at a kubelet restart: the kubelet finds its registration socket again.
            if self._watcher.recreated() and self._settings.resource_api is ResourceApi.DEVICE_PLUGIN:
                self._restart_workers()
            if time.monotonic() >= next_check:
                self._check()
                next_check = time.monotonic() + CHECK_INTERVAL
        self._watcher.close()

    def _restart_workers(self) -> None:
        logger.info("Detected kubelet socket recreation; restarting device plugins",
                    path=str(self._settings.kubelet_socket))
        self._recorder.kubelet_restart()
        self._recorder.flush()
        # The device plugins start afresh, as at the stack's start, and so does the CDI root: leftover
        # transient specs go again. Here, not in the scanner, which a kubelet restart does not restart.
        remove_stale_specs(self._settings.cdi_root)
        # Each worker replaces its plugin instance itself: a new worker process would spend longer on its
        # imports than the whole restart takes in place. Sent through supervisord, which knows their pids.
        try:
            self._supervisor.send_signal(WORKERS, PLUGIN_RESTART_SIGNAL)
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
            # Nor can any status file be trusted: the metrics show nothing registered and nothing ready.
            self._report(_UNREACHABLE, _UNREACHABLE, StackView(None, {}, ready=False))
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
        writable = self._run_dir_writable()
        scanner = process_status.read_status(run_dir, SCANNER)
        dra = self._settings.resource_api is ResourceApi.DRA
        workers = {name: process_status.read_status(run_dir, name) for name in ((WORKER_DRA,) if dra else WORKERS)}
        ready = readiness(programs, scanner, workers)
        self._report(liveness(programs, scanner, time.monotonic(), self._settings.device_scan_interval,
                              programs_for(self._settings.resource_api), status_writable=writable), ready,
                     StackView(current_status(scanner, programs, SCANNER),
                               {name: current_status(status, programs, name) for name, status in workers.items()},
                               ready.ok))

    def _run_dir_writable(self) -> bool:
        """Whether the run dir's file system takes writes; a change is logged once."""
        try:
            writable = not os.statvfs(self._settings.run_dir).f_flag & os.ST_RDONLY
        except OSError:
            writable = True  # nothing says otherwise: the status files are judged as usual
        if writable != self._run_dir_was_writable:
            if writable:
                logger.info("Run dir writable again", path=str(self._settings.run_dir))
            else:
                logger.warning("Run dir is read-only; liveness judges program states only",
                               path=str(self._settings.run_dir))
            self._run_dir_was_writable = writable
        return writable

    def _report(self, live: Verdict, ready: Verdict, view: StackView) -> None:
        self._health.set(live.ok, ready.ok)
        self._metrics.update(view)
        if (live, ready) != self._last_verdicts:
            logger.debug("Probe state", live=live.ok, liveReason=live.reason, ready=ready.ok,
                         readyReason=ready.reason)
            self._last_verdicts = (live, ready)


def main() -> None:
    settings = start_process(WATCHDOG)
    shutdown = ShutdownSignal().install()
    recorder = recorder_for(settings.metrics_port, settings.run_dir)
    recorder.load()
    # Imported once recorder_for has told prometheus_client where the value files are.
    from kubelet_watchdog.metrics_server import MetricsEndpoint

    backend = settings.run_dir / HEALTH_BACKEND_SOCKET
    health = HealthEndpoint(settings.healthcheck_port, lambda port: HealthServer(port, backend))
    metrics = MetricsEndpoint(settings.metrics_port, metrics_dir(settings.run_dir))
    try:
        Watchdog(settings, connect(settings.run_dir), health, metrics, recorder).run(shutdown)
    finally:
        metrics.stop()
        health.stop()
    logger.info("Shutdown")
