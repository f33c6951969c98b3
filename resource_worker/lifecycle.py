"""A worker's lifecycle: keep one resource's plugin served and registered with the kubelet while it has devices.

One thread (`Worker.run`) moves the resource towards "served and registered" one `step` at a time. Everything
a step reaches out to is handed in, so each transition can be driven and checked on its own: the plugin
server (a factory, since every instance is a new server on a socket of its own) with its Register call and
stream tracker, the look at the kubelet's socket, the clock, and the run dir of the status file.

An instance registers with one kubelet only. When the kubelet restarts (kubelet.sock has another identity),
the watchdog orders every worker to restart its device plugin (`order_restart`, on a signal): the worker stops
the instance the old kubelet knew, forgets the devices' health history and serves a new instance on a new
socket, which it registers with the new kubelet, as at its start. Whichever comes first, the order or the
worker's own notice of the new kubelet (its stream ended, its socket removed), the new kubelet gets one
Register: a worker that notices first stops serving and waits for the order, and registers by itself only if
none comes within HANDOVER_SECONDS of the new kubelet.sock; an order for an instance the kubelet there now
already has, or for a worker serving nothing, replaces nothing. What the kubelet sees of it is in
docs/kubelet.md#registration.
"""

from __future__ import annotations

import enum
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from loguru import logger

from resource_worker.device_table import DeviceTable
from shared import process_status, status_records
from shared.ipc import InventoryMessage
from shared.plugin_socket import SocketIdentity, socket_identity
from shared.resources import Resource
from shared.status_records import DeviceState, WorkerStatus

# How often a serving worker looks at its socket when the socket cannot be watched (it may vanish silently).
IDLE_CHECK_SECONDS = 1.0
# A worker without devices has nothing to check: only an inventory or shutdown can give it work. Nor has one
# whose socket is watched, while it waits for a Register answer or serves: the answer, a stream's end and the
# socket's removal wake it.
UNTIL_SIGNALLED = None
BACKOFF_START = 0.2
BACKOFF_MAX = 5.0
# How long a worker whose kubelet was replaced waits for the watchdog's order before it registers with the new
# kubelet itself (the watchdog notices a new kubelet.sock at once and orders the restart within milliseconds:
# the wait ends early only when the watchdog is down or its order got lost).
HANDOVER_SECONDS = 5.0


class RegistrationError(RuntimeError):
    """The kubelet refused the registration, or could not be asked; the message says which."""


class PendingRegistration(Protocol):
    """One Register call in flight (resource_worker.registration.Registration)."""

    def done(self) -> bool: ...

    def result(self) -> None:
        """Returns once the kubelet accepted; RegistrationError otherwise."""

    def cancel(self) -> None: ...


class StreamCount(Protocol):
    """The instance's ListAndWatch streams (shared.streams.StreamTracker)."""

    @property
    def open_streams(self) -> int: ...

    def take_dropped(self) -> bool:
        """True, once, when the kubelet ended a stream and none is open now."""


class PluginInstance(Protocol):
    """One instance of the resource's plugin (resource_worker.plugin_server.PluginServer)."""

    socket_name: str

    @property
    def streams(self) -> StreamCount: ...

    @property
    def socket_exists(self) -> bool: ...

    @property
    def socket_watched(self) -> bool:
        """Whether a removal of the socket calls the instance's change callback (else it must be looked at)."""

    def serve(self) -> None: ...

    def register(self, kubelet_socket: pathlib.Path, on_done: Callable[[], None]) -> PendingRegistration: ...

    def log_registered(self) -> None: ...

    def stop(self) -> None: ...


PluginFactory = Callable[[Callable[[], None]], PluginInstance]
"""Makes a new instance; the callable it is given is to be called whenever the instance's streams change and,
if the instance watches its socket, whenever the socket may have gone."""


class Flag(Protocol):
    def is_set(self) -> bool: ...


class Backoff:
    """The pause before the next registration attempt: doubling from `start` up to `cap`, reset on success."""

    def __init__(self, start: float = BACKOFF_START, cap: float = BACKOFF_MAX) -> None:
        self._start = start
        self._cap = cap
        self.delay = start

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.delay * 2, self._cap)
        return delay

    def reset(self) -> None:
        self.delay = self._start


class Phase(enum.Enum):
    """Where the serving instance stands with the kubelet."""

    UNREGISTERED = "unregistered"
    REGISTERING = "registering"
    REGISTERED = "registered"


class Worker:
    """The lifecycle loop: one thread moves the resource towards "served and registered" step by step.

    Everything that can change what the next step is (an inventory, a stream
    opening or ending, a Register answer, the socket's removal, the watchdog's
    order, shutdown) sets `_attention`; the loop never blocks on the kubelet, so
    it notices each of them at once.
    """

    def __init__(self, resource: Resource, table: DeviceTable, new_plugin: PluginFactory,
                 kubelet_socket: pathlib.Path, run_dir: pathlib.Path, shutdown: Flag,
                 kubelet_identity: Callable[[], SocketIdentity | None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._resource = resource
        self.table = table
        self._new_plugin = new_plugin
        self._kubelet_socket = kubelet_socket
        self._kubelet_identity = kubelet_identity or (lambda: socket_identity(kubelet_socket))
        self._run_dir = run_dir
        self._shutdown = shutdown
        self._clock = clock
        # Set by anything the lifecycle loop must react to: inventory, streams, Register answers, the socket's
        # removal, the watchdog's order, shutdown.
        self._attention = threading.Event()
        # Set by the signal thread when the watchdog orders a restart; cleared by the lifecycle loop.
        self._restart_ordered = threading.Event()
        # The fields below belong to the lifecycle loop's thread.
        self._server: PluginInstance | None = None
        self._phase = Phase.UNREGISTERED
        self._registration: PendingRegistration | None = None
        self._asked_kubelet: SocketIdentity | None = None  # the kubelet.sock the last Register call went to
        self._handing_over = False  # waiting for the watchdog's restart after a kubelet restart
        self._handover_deadline: float | None = None  # when a new kubelet.sock is there: the end of the wait
        self._retry_at = 0.0
        self._waiting_for: str | None = None  # the reason for not being registered last logged
        self._backoff = Backoff()
        self._socket_lookup = Backoff()  # the pause between looks for kubelet.sock while handing over
        self._reported: WorkerStatus | None = None
        # Set by the subscriber thread: when the scan behind the current inventory ran (CLOCK_MONOTONIC, s).
        self._scanned_at: float | None = None

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def serving(self) -> bool:
        return self._server is not None

    def on_inventory(self, message: InventoryMessage) -> None:
        """Take a scanner snapshot (called from the subscriber's thread)."""
        self.table.apply(message)
        self._scanned_at = message.scanned_at_ns / 1e9
        self._attention.set()

    def wake(self) -> None:
        self._attention.set()

    def order_restart(self) -> None:
        """The watchdog's order to restart the device plugin, the kubelet having restarted (any thread)."""
        self._restart_ordered.set()
        self._attention.set()

    def run(self) -> None:
        while not self._shutdown.is_set():
            timeout = self.step()
            self._attention.wait(timeout)
            self._attention.clear()
        if self._server is not None:
            self._stop_serving()
        process_status.remove_status(self._run_dir, self._resource.process_name)

    def step(self) -> float | None:
        """One step towards the desired state, then the status file brought up to date; returns how long to
        wait before the next step (None: until something calls `wake`)."""
        timeout = self._step()
        self._report()
        return timeout

    def _report(self) -> None:
        """Keep the status file (read by the watchdog's probes and metrics, and by `status`) current."""
        devices = self.table.devices()
        healthy = sum(1 for d in devices if d.healthy)
        status = WorkerStatus(resource=self._resource.value, registered=self._phase is Phase.REGISTERED,
                              streams=self._server.streams.open_streams if self._server else 0,
                              endpoint=self._server.socket_name if self._server else None,
                              scanned_at=self._scanned_at, device_count=len(devices), healthy_count=healthy,
                              unhealthy_count=len(devices) - healthy, cdi_resolvable=self.table.cdi_resolvable,
                              devices={d.device_id: DeviceState(d.health.health.value, d.health.status.name)
                                       for d in devices})
        if status != self._reported:
            status_records.write(self._run_dir, self._resource.process_name, status)
            self._reported = status

    def _step(self) -> float | None:
        if self._restart_ordered.is_set():
            self._restart_ordered.clear()
            self._restart_plugin()
        if not (self.table.synced and self.table.devices()):
            if self._server is not None:
                self._stop_serving()
                # A later instance for this resource starts with no health history, and meets whichever
                # kubelet is there then as a newcomer.
                self.table.forget_history()
                self._end_handover(forget_kubelet=True)
                logger.info("Stopped device plugin for absent resource", resourceName=self._resource.value)
            return UNTIL_SIGNALLED
        # A kubelet restart removes the socket and ends the stream too; then the handover below says what happens.
        if self._server is not None and not self._server.socket_exists:
            if not self._kubelet_replaced():
                logger.warning("Device plugin socket was removed; serving on a new one",
                               resourceName=self._resource.value, endpoint=self._server.socket_name)
            self._stop_serving()
        if self._server is not None and self._phase is Phase.REGISTERED and self._server.streams.take_dropped():
            if not self._kubelet_replaced():
                logger.warning("Kubelet ended the device list stream; registering again",
                               resourceName=self._resource.value)
            self._phase = Phase.UNREGISTERED
        if self._phase is Phase.UNREGISTERED:
            handover = self._await_replacement()
            if handover is not None:
                return handover
        if self._server is None:
            started = self._start_serving()
            if started is not None:
                return started
            assert self._server is not None
        if self._phase is Phase.REGISTERING:
            return self._finish_registration(self._server)
        if self._phase is Phase.UNREGISTERED:
            return self._register(self._server)
        return _idle(self._server)

    def _start_serving(self) -> float | None:
        """A new instance, serving: None once it is; else the pause before the next try. Serving's parts are
        built at the first devices and its socket may not be bindable yet: a failure is said and tried again,
        not a death that spends supervisord's retries on a condition that may clear."""
        now = self._clock()
        if now < self._retry_at:
            return self._retry_at - now
        server = None
        try:
            server = self._new_plugin(self.wake)
            server.serve()
        except Exception as exc:  # anything building or binding raises: the next attempt starts afresh
            if server is not None:
                server.stop()
            self._log_wait("ERROR", "Cannot serve the device plugin; retrying", err=str(exc))
            return self._retry_later(now)
        self._server = server
        return None

    def _register(self, server: PluginInstance) -> float | None:
        now = self._clock()
        if now < self._retry_at:
            return self._retry_at - now
        kubelet = self._kubelet_identity()
        if kubelet is None:
            self._log_wait("INFO", "Waiting for the kubelet socket", path=str(self._kubelet_socket))
            return self._retry_later(now)
        self._asked_kubelet = kubelet
        self._registration = server.register(self._kubelet_socket, self.wake)
        self._phase = Phase.REGISTERING
        return _idle(server)

    def _finish_registration(self, server: PluginInstance) -> float | None:
        registration = self._registration
        assert registration is not None, "REGISTERING without a call in flight"
        if not registration.done():
            return _idle(server)
        self._registration = None
        try:
            registration.result()
        except RegistrationError as exc:
            self._log_wait("WARNING", "Registration with kubelet failed; retrying", err=str(exc))
            self._phase = Phase.UNREGISTERED
            return self._retry_later(self._clock())
        self._phase = Phase.REGISTERED
        self._waiting_for = None
        self._backoff.reset()
        server.log_registered()
        return _idle(server)

    def _restart_plugin(self) -> None:
        """Obey the watchdog's order: the instance a replaced kubelet knew goes, and with it the devices' health
        history; the steps that follow serve a new one and register it with the kubelet there now."""
        # The watchdog saw a new kubelet.sock: whatever registration is due can be tried now.
        self._retry_at = 0.0
        self._backoff.reset()
        kubelet = self._kubelet_identity()
        if self._asked_kubelet is None or self._asked_kubelet == kubelet:
            return  # no kubelet has this instance yet (or none serves), or the one there now already has it
        logger.info("Restarting device plugin for the new kubelet", resourceName=self._resource.value)
        if self._server is not None:
            self._stop_serving()
        self.table.forget_history()
        self._end_handover(forget_kubelet=True)
        self._waiting_for = None

    def _await_replacement(self) -> float | None:
        """While the kubelet this instance called Register on has been replaced, not serving and waiting for the
        watchdog's order: how long to wait before looking again; None once there is nothing to wait for."""
        kubelet = self._kubelet_identity()
        if self._asked_kubelet is None or kubelet == self._asked_kubelet:
            # The same kubelet after all (its socket was only out of sight for a moment): nothing to wait for.
            self._end_handover(forget_kubelet=False)
            return None
        if not self._handing_over:
            self._handing_over = True
            self._socket_lookup.reset()
            logger.info("Kubelet restarted; waiting for the watchdog's order to restart the device plugin",
                        resourceName=self._resource.value)
            if self._server is not None:
                self._stop_serving()
        if kubelet is None:
            # The new kubelet has no socket yet: the watchdog's order is still to come. Looked for again after
            # a growing pause, as at the start: the kubelet may be down for long.
            return self._socket_lookup.next()
        now = self._clock()
        if self._handover_deadline is None:
            self._handover_deadline = now + HANDOVER_SECONDS
        if now < self._handover_deadline:
            return self._handover_deadline - now
        logger.warning("No restart came after the kubelet restarted; registering with the new kubelet",
                       resourceName=self._resource.value)
        self._end_handover(forget_kubelet=True)
        return None

    def _end_handover(self, forget_kubelet: bool) -> None:
        """No longer waiting for the watchdog's order; `forget_kubelet`: the next Register goes to whichever
        kubelet is there, this instance (or its successor) being new to it."""
        self._handing_over, self._handover_deadline = False, None
        if forget_kubelet:
            self._asked_kubelet = None

    def _kubelet_replaced(self) -> bool:
        return self._asked_kubelet is not None and self._kubelet_identity() != self._asked_kubelet

    def _log_wait(self, level: str, message: str, **fields: Any) -> None:
        """Say why the worker is not registered yet, once per reason; retries for the same reason log at debug."""
        logger.log(level if message != self._waiting_for else "DEBUG", message, resourceName=self._resource.value,
                   **fields)
        self._waiting_for = message

    def _retry_later(self, now: float) -> float:
        delay = self._backoff.next()
        self._retry_at = now + delay
        return delay

    def _stop_serving(self) -> None:
        assert self._server is not None
        if self._registration is not None:
            self._registration.cancel()
            self._registration = None
        self._server.stop()
        self._server = None
        self._phase = Phase.UNREGISTERED


def _idle(server: PluginInstance) -> float | None:
    """How long a serving worker with nothing to do waits: until woken, unless its socket must be looked at."""
    return UNTIL_SIGNALLED if server.socket_watched else IDLE_CHECK_SECONDS
