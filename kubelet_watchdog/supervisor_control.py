"""The watchdog's hold on supervisord: program states, restarts and shutdown over XML-RPC on the run dir's unix socket."""

from __future__ import annotations

import time
import xmlrpc.client
from collections.abc import Iterable, Mapping

from supervisor import childutils
from supervisor.xmlrpc import Faults

STOP_TIMEOUT = 12.0
_POLL = 0.05
_STOPPED_STATES = {"STOPPED", "EXITED", "FATAL", "BACKOFF"}


class SupervisorError(RuntimeError):
    pass


def _tolerating(fault_code: int, method, *args) -> None:
    """Call an XML-RPC method; the fault saying it was already done is not an error."""
    try:
        method(*args)
    except xmlrpc.client.Fault as fault:
        if fault.faultCode != fault_code:
            raise


class Supervisor:
    def __init__(self, environ: Mapping[str, str]):
        if "SUPERVISOR_SERVER_URL" not in environ:
            raise SupervisorError("not running under supervisord (SUPERVISOR_SERVER_URL is not set)")
        self._rpc = childutils.getRPCInterface(environ).supervisor

    def programs(self) -> dict[str, dict]:
        """Every program's process info, keyed by name."""
        try:
            return {info["name"]: info for info in self._rpc.getAllProcessInfo()}
        except (OSError, xmlrpc.client.Error) as exc:
            raise SupervisorError(f"supervisord did not answer: {exc}") from None

    def restart(self, names: Iterable[str]) -> None:
        """Stop all of `names` at once, wait until they are down, then start them all."""
        names = list(names)
        try:
            for name in names:
                _tolerating(Faults.NOT_RUNNING, self._rpc.stopProcess, name, False)
            deadline = time.monotonic() + STOP_TIMEOUT
            while time.monotonic() < deadline:
                states = self.programs()
                if all(states.get(n, {}).get("statename") in _STOPPED_STATES for n in names):
                    break
                time.sleep(_POLL)
            for name in names:
                _tolerating(Faults.ALREADY_STARTED, self._rpc.startProcess, name, False)
        except (OSError, xmlrpc.client.Error) as exc:
            raise SupervisorError(f"restarting {', '.join(names)} failed: {exc}") from None

    def shutdown(self) -> None:
        try:
            self._rpc.shutdown()
        except (OSError, xmlrpc.client.Error) as exc:
            raise SupervisorError(f"supervisord did not accept shutdown: {exc}") from None
