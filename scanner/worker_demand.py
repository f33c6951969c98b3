"""One worker per resource the node has: the scanner, which is first to know which resources those are, has
supervisord start a resource's worker when a scan first finds its devices, and stop it once its resource has
been gone for a grace (`absent_grace`: ABSENT_SCANS scans, at most ABSENT_GRACE_MAX_SECONDS).

supervisord owns the workers throughout (supervisor.conf: `autostart=false`, `autorestart=true`): it spawns
one when told to, restarts it when it exits and stops it with the stack; program names, log streams and status
files are as before. A worker whose resource leaves stops serving at once, as it always did (resource_worker/
lifecycle.py); its process is stopped after the grace, so that a node whose partitioning changed runs only the
workers it now needs within a minute, while a resource that is gone for a moment (a device reset, a failed
scan) keeps its worker. A failed scan says nothing about which resources the node has: it neither starts nor
stops a worker, and an absence is timed again from the next scan that succeeds.

`plan` is the policy: plain data in, the orders out. `WorkerDemand` keeps what the orders did.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib
from collections.abc import Callable, Mapping

from loguru import logger

from shared.resources import Resource
from shared.supervision import transport

# A resource gone from this many scans in a row loses its worker, or sooner at long scan intervals: a node whose
# partitioning changed runs only the workers it needs within half a minute (5 s scans: 15 s).
ABSENT_SCANS = 3
ABSENT_GRACE_MAX_SECONDS = 30.0


def absent_grace(scan_interval: float) -> float:
    return min(ABSENT_SCANS * scan_interval, ABSENT_GRACE_MAX_SECONDS)


class Need(enum.Enum):
    """What the scanner knows of a resource's worker."""

    UNKNOWN = "unknown"  # nothing yet: this scanner has not ordered anything (a worker may run from before)
    STARTED = "started"  # ordered started: the resource has devices
    LEAVING = "leaving"  # the resource has no devices since `absent_since`: stopped once the grace is over
    STOPPED = "stopped"  # ordered stopped


class Order(enum.Enum):
    START = "startProcess"
    STOP = "stopProcess"


@dataclasses.dataclass(frozen=True)
class State:
    need: Need = Need.UNKNOWN
    absent_since: float | None = None


def plan(state: State, has_devices: bool, now: float, grace: float) -> tuple[Order | None, State]:
    """The order a successful scan calls for and the state once it is carried out."""
    if has_devices:
        return (None, state) if state.need is Need.STARTED else (Order.START, State(Need.STARTED))
    if state.need is Need.STOPPED:
        return None, state
    if state.absent_since is None:
        return None, State(Need.LEAVING, now)
    if now - state.absent_since >= grace:
        return Order.STOP, State(Need.STOPPED)
    return None, state


OrderSender = Callable[[Order, str], bool]
"""Sends one order for one program to supervisord: True when it changed the program's state, False when the
program already was as ordered; OSError when the order could not be carried out."""


def supervisord_orders(run_dir: pathlib.Path) -> OrderSender:
    """Orders over supervisord's socket. An order that finds its program as it asked (already started, not
    running) or supervisord stopping every program is done; any other fault is an OSError."""
    done = {transport.ALREADY_STARTED_FAULT, transport.NOT_RUNNING_FAULT, transport.SHUTDOWN_STATE_FAULT}

    def send(order: Order, program: str) -> bool:
        reply = transport.exchange(run_dir, transport.program_order(order.value, program))
        if reply.status != 200:
            raise OSError(f"supervisord refused the request (HTTP {reply.status})")
        # An order's answer is a few bytes; only a fault's needs parsing.
        fault = transport.fault_code(reply.body) if b"<fault>" in reply.body else None
        if fault is not None and fault not in done:
            raise OSError(f"supervisord answered fault {fault}")
        return fault is None

    return send


class WorkerDemand:
    """Applies `plan` to every scan; the state belongs to the scan loop's thread."""

    def __init__(self, send: OrderSender, clock: Callable[[], float], grace: float):
        self._send = send
        self._clock = clock
        self._grace = grace
        self._states = {resource: State() for resource in Resource}
        self._failing: set[Resource] = set()  # whose last order failed: logged once until one succeeds

    def follow(self, device_counts: Mapping[Resource, int], scan_failed: bool) -> None:
        """Start or stop workers as a scan says (`device_counts`: each resource's devices)."""
        now = self._clock()
        for resource in Resource:
            state = self._states[resource]
            if scan_failed:
                # Absences are timed from a scan that succeeds.
                if state.need is Need.LEAVING:
                    self._states[resource] = State(Need.LEAVING)
                continue
            order, after = plan(state, device_counts.get(resource, 0) > 0, now, self._grace)
            if order is not None and not self._carry_out(order, resource):
                continue  # state unchanged: the next scan orders again
            self._states[resource] = after

    def _carry_out(self, order: Order, resource: Resource) -> bool:
        program = resource.process_name
        try:
            changed = self._send(order, program)
        except OSError as exc:
            if resource not in self._failing:
                logger.error("Cannot have supervisord start or stop a worker; retrying at the next scan",
                             program=program, order=order.value, err=str(exc))
                self._failing.add(resource)
            return False
        self._failing.discard(resource)
        if order is Order.STOP and changed:
            logger.info("Stopped worker of absent resource", program=program, resourceName=resource.value)
        return True
