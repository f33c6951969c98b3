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

Where the worker stands is one value, its `Situation` (no devices, starting, handing over, to register, waiting
for kubelet.sock, registering, registered); `Phase` is what the kubelet and the status file see of it.
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
from shared.channels import status_files, status_records
from shared.channels.inventory_protocol import InventoryMessage
from shared.channels.status_records import DeviceState, WorkerStatus
from shared.kubelet.plugin_socket import SocketIdentity, socket_identity
from shared.resources import Resource

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
    """The instance's ListAndWatch streams (shared.kubelet.streams.StreamTracker)."""

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
    """Where the serving instance stands with the kubelet: what the status file and the probes see of a
    `Situation`."""

    UNREGISTERED = "unregistered"
    REGISTERING = "registering"
    REGISTERED = "registered"


class Situation(enum.Enum):
    """Every situation a worker can be in: the state of its step machine. The worker's other fields are the
    data of a situation (the instance served, the call in flight, when to try again), never a state of
    their own."""

    # Nothing to serve (no inventory yet, or none with devices): no instance; waiting for an inventory.
    NO_DEVICES = "no devices"
    # Devices and no instance: one is served at the next step, or at `_retry_at` after a failed try.
    STARTING = "starting"
    # The kubelet this instance registered with was replaced: serving nothing, waiting for the watchdog's
    # order, looking for the new kubelet.sock after a growing pause, and once it is there until
    # `_handover_deadline`. A spell without devices does not end it: the new kubelet still gets one Register.
    HANDING_OVER = "handing over"
    # Serving; a Register call is due (at `_retry_at` after a refusal).
    TO_REGISTER = "to register"
    # Serving, with no kubelet.sock to register with: looked for again at `_retry_at`.
    WAITING_FOR_KUBELET = "waiting for kubelet.sock"
    # Serving; a Register call in flight (`_registration`), whose answer wakes the loop.
    REGISTERING = "registering"
    # Serving and registered: nothing to do until a stream ends, the socket goes, or the devices change.
    REGISTERED = "registered"

    @property
    def serving(self) -> bool:
        return self in _SERVING

    @property
    def phase(self) -> Phase:
        return _PHASES.get(self, Phase.UNREGISTERED)


_SERVING = frozenset({Situation.TO_REGISTER, Situation.WAITING_FOR_KUBELET, Situation.REGISTERING,
                      Situation.REGISTERED})
_PHASES = {Situation.REGISTERING: Phase.REGISTERING, Situation.REGISTERED: Phase.REGISTERED}


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
        self._situation = Situation.NO_DEVICES
        self._server: PluginInstance | None = None  # the instance served, in the serving situations
        self._registration: PendingRegistration | None = None  # the call in flight, while REGISTERING
        # The kubelet.sock the last Register call went to: the kubelet that knows this instance, if any.
        self._asked_kubelet: SocketIdentity | None = None
        self._handover_deadline: float | None = None  # HANDING_OVER with a new kubelet.sock: the end of the wait
        self._retry_at = 0.0
        self._waiting_for: str | None = None  # the reason for not being registered last logged
        self._backoff = Backoff()
        self._socket_lookup = Backoff()  # the pause between looks for kubelet.sock while handing over
        self._status = status_records.ChangeWriter(run_dir, resource.process_name)
        # Set by the subscriber thread: when the scan behind the current inventory ran (CLOCK_MONOTONIC, s).
        self._scanned_at: float | None = None

    @property
    def situation(self) -> Situation:
        return self._situation

    @property
    def phase(self) -> Phase:
        return self._situation.phase

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
        # A status from the start: the first step may already register (the inventory can arrive first), and
        # its report comes only after the Register call and the allocation parts' load.
        self._report()
        while not self._shutdown.is_set():
            timeout = self.step()
            self._attention.wait(timeout)
            self._attention.clear()
        if self._server is not None:
            self._stop_serving()
        status_files.remove_status(self._run_dir, self._resource.process_name)

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
        self._status.write(WorkerStatus(
            resource=self._resource.value, registered=self._situation is Situation.REGISTERED,
            streams=self._server.streams.open_streams if self._server else 0,
            endpoint=self._server.socket_name if self._server else None,
            scanned_at=self._scanned_at, device_count=len(devices), healthy_count=healthy,
            unhealthy_count=len(devices) - healthy, cdi_resolvable=self.table.cdi_resolvable,
            devices={d.device_id: DeviceState(d.health.health.value, d.health.status.name) for d in devices}))

    def _step(self) -> float | None:
        # The kubelet's replacement is known one way: kubelet.sock's identity, looked at once per step, against
        # the one the last Register call went to. The watchdog's order is the go-ahead to restart for it.
        kubelet = self._kubelet_identity()
        if self._restart_ordered.is_set():
            self._restart_ordered.clear()
            self._obey_restart(kubelet)
        if not (self.table.synced and self.table.devices()):
            return self._without_devices()
        if self._situation is Situation.NO_DEVICES:
            self._situation = Situation.STARTING
        if self._situation.serving:
            self._check_instance(kubelet)
        if self._situation.phase is Phase.UNREGISTERED:
            handover = self._await_replacement(kubelet)
            if handover is not None:
                return handover
        if self._situation is Situation.STARTING:
            started = self._start_serving()
            if started is not None:
                return started
        server = self._server
        assert server is not None, f"{self._situation} without an instance"
        if self._situation is Situation.REGISTERING:
            return self._finish_registration(server)
        if self._situation is Situation.REGISTERED:
            return _idle(server)
        return self._register(server, kubelet)

    def _without_devices(self) -> float | None:
        if self._situation.serving:
            self._stop_serving()
            # A later instance for this resource starts with no health history, and meets whichever kubelet is
            # there then as a newcomer.
            self.table.forget_history()
            self._asked_kubelet = None
            logger.info("Stopped device plugin for absent resource", resourceName=self._resource.value)
        if self._situation is Situation.STARTING:
            self._situation = Situation.NO_DEVICES
        return UNTIL_SIGNALLED

    def _check_instance(self, kubelet: SocketIdentity | None) -> None:
        """A serving instance whose socket is gone is replaced; one whose stream the kubelet ended registers
        again. A kubelet restart does both; then the handover says what happens, and no warning is due."""
        assert self._server is not None
        if not self._server.socket_exists:
            if not self._kubelet_replaced(kubelet):
                logger.warning("Device plugin socket was removed; serving on a new one",
                               resourceName=self._resource.value, endpoint=self._server.socket_name)
            self._stop_serving()
        elif self._situation is Situation.REGISTERED and self._server.streams.take_dropped():
            if not self._kubelet_replaced(kubelet):
                logger.warning("Kubelet ended the device list stream; registering again",
                               resourceName=self._resource.value)
            self._situation = Situation.TO_REGISTER

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
        self._situation = Situation.TO_REGISTER
        return None

    def _register(self, server: PluginInstance, kubelet: SocketIdentity | None) -> float | None:
        now = self._clock()
        if now < self._retry_at:
            return self._retry_at - now
        if kubelet is None:
            self._log_wait("INFO", "Waiting for the kubelet socket", path=str(self._kubelet_socket))
            self._situation = Situation.WAITING_FOR_KUBELET
            return self._retry_later(now)
        self._asked_kubelet = kubelet
        self._registration = server.register(self._kubelet_socket, self.wake)
        self._situation = Situation.REGISTERING
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
            self._situation = Situation.TO_REGISTER
            return self._retry_later(self._clock())
        self._situation = Situation.REGISTERED
        self._waiting_for = None
        self._backoff.reset()
        server.log_registered()
        return _idle(server)

    def _obey_restart(self, kubelet: SocketIdentity | None) -> None:
        """Obey the watchdog's order: the instance a replaced kubelet knew goes, and with it the devices' health
        history; the steps that follow serve a new one and register it with the kubelet there now."""
        # The watchdog saw a new kubelet.sock: whatever registration is due can be tried now.
        self._retry_at = 0.0
        self._backoff.reset()
        if not self._kubelet_replaced(kubelet):
            return  # no kubelet has this instance yet (or none serves), or the one there now already has it
        logger.info("Restarting device plugin for the new kubelet", resourceName=self._resource.value)
        if self._server is not None:
            self._stop_serving()
        self.table.forget_history()
        self._end_handover()
        self._asked_kubelet = None
        self._waiting_for = None

    def _await_replacement(self, kubelet: SocketIdentity | None) -> float | None:
        """While the kubelet this instance called Register on has been replaced, not serving and waiting for the
        watchdog's order: how long to wait before looking again; None once there is nothing to wait for."""
        if not self._kubelet_replaced(kubelet):
            # The same kubelet after all (its socket was only out of sight for a moment): nothing to wait for.
            self._end_handover()
            return None
        if self._situation is not Situation.HANDING_OVER:
            self._socket_lookup.reset()
            logger.info("Kubelet restarted; waiting for the watchdog's order to restart the device plugin",
                        resourceName=self._resource.value)
            if self._server is not None:
                self._stop_serving()
            self._situation = Situation.HANDING_OVER
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
        self._end_handover()
        self._asked_kubelet = None  # the instance to come is new to the kubelet there
        return None

    def _end_handover(self) -> None:
        """No longer waiting for the watchdog's order: an instance is to be served."""
        if self._situation is Situation.HANDING_OVER:
            self._situation = Situation.STARTING
        self._handover_deadline = None

    def _kubelet_replaced(self, kubelet: SocketIdentity | None) -> bool:
        return self._asked_kubelet is not None and kubelet != self._asked_kubelet

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
        """The instance stopped, its call in flight cancelled: STARTING, unless the caller says otherwise."""
        assert self._server is not None
        if self._registration is not None:
            self._registration.cancel()
            self._registration = None
        self._server.stop()
        self._server = None
        self._situation = Situation.STARTING


def _idle(server: PluginInstance) -> float | None:
    """How long a serving worker with nothing to do waits: until woken, unless its socket must be looked at."""
    return UNTIL_SIGNALLED if server.socket_watched else IDLE_CHECK_SECONDS
