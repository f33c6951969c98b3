"""The watchdog process: has the workers restart their device plugins when the kubelet restarts, ends a stack
that cannot recover, answers the pod's liveness and readiness probes and serves the stack's metrics."""

from __future__ import annotations

import enum
import os
import select
import time
from collections.abc import Callable

from loguru import logger

from kubelet_watchdog.health_server import HealthServer
from kubelet_watchdog.kubelet_socket_watch import KubeletSocketWatcher
from kubelet_watchdog.metrics_server import MetricsEndpoint
from kubelet_watchdog.probes import (
    Verdict,
    all_running,
    current_status,
    liveness,
    needed_programs,
    publication_deadline,
    readiness,
)
from kubelet_watchdog.stack_metrics import StackView
from kubelet_watchdog.stack_watch import ProgramExits, StatusFiles
from shared.cdi.stale_specs import remove_stale_specs
from shared.config import ResourceApi, Settings
from shared.observability.metrics import Recorder, metrics_dir, recorder_for
from shared.programs import PLUGIN_RESTART_SIGNAL, SCANNER, WATCHDOG, WORKER_DRA, WORKERS
from shared.supervision.client import Supervisor, SupervisorError, SupervisorStopping, connect
from shared.supervision.process_lifecycle import ShutdownSignal, exit_now, start_process

# Program states and status files, for the probes (which the kubelet asks every 10 s), the metrics and to
# notice a FATAL program. Reading supervisord's table costs this process and supervisord about 2 ms of CPU;
# reading a status file again a tenth of that. So the table is read every CHECK_INTERVAL only while the
# stack is unsettled (a program not running, the scanner not published yet, supervisord not answering),
# and at once when a program exits (stack_watch.ProgramExits). Once every program that must run runs,
# nothing but an exit or a worker the scanner has started changes the table: supervisord is then only asked
# whether it answers, every STEADY_CHECK_INTERVAL (the probes' period: a supervisord that stops answering is
# noticed by the next probe but one), and read again when the scanner's status names a resource whose worker
# the table does not show running. The status files are judged again whenever one is replaced and when the
# scanner's last publication grows too old for liveness (stack_watch.StatusFiles).
CHECK_INTERVAL = 2.0
STEADY_CHECK_INTERVAL = 10.0
# The status files written for one snapshot follow each other within milliseconds: one judgement for them.
STATUS_SETTLE_SECONDS = 0.05
# An exited program is reaped by supervisord at its SIGCHLD: asked a moment later, it has.
EXIT_SETTLE_SECONDS = 0.05
# The judgement at a publication's deadline comes just past it, when liveness has turned.
_PAST_DEADLINE_SECONDS = 0.01
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
        except OSError as exc:
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


class Table(enum.Enum):
    """What the watchdog knows of supervisord's program table: the state of its checks."""

    # Not read yet, or supervisord did not answer (or a program is FATAL) at the last check: read at the next.
    UNKNOWN = "unknown"
    # Read at the last check and judged by; read again at the next, CHECK_INTERVAL later.
    READ = "read"
    # Every program runs and its exit is watched: until one exits, supervisord is only asked whether it
    # answers, every STEADY_CHECK_INTERVAL.
    STEADY = "steady"


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
        self._status = StatusFiles(settings.run_dir)
        self._exits = ProgramExits()
        self._table = Table.UNKNOWN
        self._programs: dict[str, dict] | None = None  # the table as read, while READ or STEADY
        # When supervisord is asked next, and when the status files are judged again before that (monotonic).
        self._next_check = 0.0
        self._next_judgement: float | None = None
        # A replaced status file awaits its judgement: its watch is not selected meanwhile (what comes on it
        # is read by that judgement).
        self._settling = False

    def run(self, shutdown: ShutdownSignal) -> None:
        while not shutdown.is_set():
            due = self._next_check if self._next_judgement is None else min(self._next_check, self._next_judgement)
            watched = [self._watcher.fileno(), None if self._settling else self._status.fileno()]
            if watched[0] is None:
                due = min(due, time.monotonic() + CHECK_INTERVAL)  # no inotify: look at kubelet.sock at this pace
            readable, _, _ = select.select([shutdown.fileno(), *(fd for fd in watched if fd is not None),
                                            *self._exits.filenos()], [], [], max(0.0, due - time.monotonic()))
            if shutdown.is_set():
                break
            # A DRA plugin needs nothing at a kubelet restart: the kubelet finds its registration socket again.
            if self._watcher.recreated() and self._settings.resource_api is ResourceApi.DEVICE_PLUGIN:
                self._restart_workers()
            self._follow(readable)
        self._exits.close()
        self._status.close()
        self._watcher.close()

    def _follow(self, readable: list[int]) -> None:
        """Checks or judges what the wake-up (`readable`: what select said) and the time call for."""
        now = time.monotonic()
        if self._exits.exited(readable):
            self._exits.close()  # readable from now on; the check watches the new table
            if self._table is Table.STEADY:
                self._table = Table.READ
            self._next_check = min(self._next_check, now + EXIT_SETTLE_SECONDS)
        if self._status.watching and self._status.fileno() in readable and self._status.changed():
            self._settling = True
            self._judge_at(now + STATUS_SETTLE_SECONDS)
        if now >= self._next_check:
            self._check()
        elif self._next_judgement is not None and now >= self._next_judgement:
            self._next_judgement = None
            if self._table is Table.UNKNOWN:
                return
            assert self._programs is not None
            if all_running(self._programs, needed_programs(self._settings.resource_api,
                                                           self._status.read(SCANNER))):
                self._judge(self._programs)
            else:
                # The scanner found a resource whose worker the table does not show running: it has just had
                # supervisord start it, and the table is read again to say so.
                self._table = Table.READ
                self._check()

    def _judge_at(self, when: float) -> None:
        self._next_judgement = when if self._next_judgement is None else min(self._next_judgement, when)

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
        """Asks supervisord for the program table (in a steady stack, only whether it answers), then judges
        the status files by it."""
        now = time.monotonic()
        self._next_check = now + CHECK_INTERVAL
        self._next_judgement = None
        self._settling = False
        programs = self._programs if self._table is Table.STEADY else None
        self._table, self._programs = Table.UNKNOWN, None
        try:
            if programs is None:
                self._exits.close()
                programs = self._supervisor.programs()
            else:
                self._supervisor.answers()
        except SupervisorError as exc:
            self._exits.close()
            if isinstance(exc, SupervisorStopping):
                return
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
        started = self._started(programs)
        if started:
            try:
                self._supervisor.confirm_started(started)
                programs = self._supervisor.programs()
            except SupervisorError as exc:  # then they become RUNNING at startsecs, as the table says
                logger.debug("Cannot confirm started programs", err=str(exc))
        self._table, self._programs = Table.READ, programs
        published = self._judge(programs)
        # Steady only while replaced status files are seen at once: otherwise they are judged at every check.
        settled = self._status.watching and published and all_running(
            programs, needed_programs(self._settings.resource_api, self._status.read(SCANNER)))
        if settled and (self._exits.filenos() or self._exits.watch(programs, skip=(os.getpid(),))):
            self._table = Table.STEADY
            self._next_check = now + STEADY_CHECK_INTERVAL

    def _started(self, programs: dict[str, dict]) -> dict[str, int]:
        """The STARTING programs that are up (name: pid): this watchdog, and each whose running instance has
        written its status file (shared/fence/supervisord_started.py)."""
        return {name: info["pid"] for name, info in programs.items() if info.get("statename") == "STARTING"
                and (info.get("pid") == os.getpid() if name == WATCHDOG
                     else current_status(self._status.read(name), programs, name) is not None)}

    def _judge(self, programs: dict[str, dict]) -> bool:
        """Probes and metrics from the status files as `programs` (supervisord's table) says which to trust.
        True when the running scanner has published."""
        self._status.changed()  # replacements so far: the files are read below
        self._settling = False
        writable = self._run_dir_writable()
        scanner = self._status.read(SCANNER)
        dra = self._settings.resource_api is ResourceApi.DRA
        workers = {name: self._status.read(name) for name in ((WORKER_DRA,) if dra else WORKERS)}
        ready = readiness(programs, scanner, workers)
        now = time.monotonic()
        self._report(liveness(programs, scanner, now, self._settings.device_scan_interval,
                              needed_programs(self._settings.resource_api, scanner), status_writable=writable), ready,
                     StackView(current_status(scanner, programs, SCANNER),
                               {name: current_status(status, programs, name) for name, status in workers.items()},
                               ready.ok))
        deadline = publication_deadline(programs, scanner, self._settings.device_scan_interval)
        if deadline is not None and writable and deadline > now:
            self._judge_at(deadline + _PAST_DEADLINE_SECONDS)
        return deadline is not None

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
    health = HealthEndpoint(settings.healthcheck_port, HealthServer)
    metrics = MetricsEndpoint(settings.metrics_port, metrics_dir(settings.run_dir))
    try:
        Watchdog(settings, connect(settings.run_dir), health, metrics, recorder).run(shutdown)
    finally:
        metrics.stop()
        health.stop()
    logger.info("Shutdown")
    exit_now(shutdown)
