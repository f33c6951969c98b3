"""supervisord's programs over XML-RPC, on the bounded transport: states, signals, shutdown.

Used by the watchdog (its orders to the workers, shutdown, the probes' program states) and by
`rbln-device-plugin status`.
"""

from __future__ import annotations

import pathlib
import signal
import xmlrpc.client
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from xml.parsers.expat import ExpatError

from supervisor.xmlrpc import Faults

from shared.supervision import transport

# A signalled program with no process (NOT_RUNNING), or one that exited between supervisord's look at its state
# and its kill() (FAILED: the kill's OSError): either way nobody is left to tell.
_GONE = frozenset({Faults.NOT_RUNNING, Faults.FAILED})


class SupervisorError(RuntimeError):
    pass


class SupervisorStopping(SupervisorError):
    """supervisord is stopping every program (shutdown or reload) and refuses requests."""


def _checked(results: Iterable[Any], tolerated: frozenset[int]) -> None:
    """Raise the first fault of a multicall's results, except those `tolerated` (faults that mean nothing to do)."""
    for result in results:
        if isinstance(result, dict) and "faultCode" in result and result["faultCode"] not in tolerated:
            raise xmlrpc.client.Fault(result["faultCode"], result["faultString"])


class _Transport(xmlrpc.client.Transport):
    """xmlrpc.client's transport, replaced by the stack's bounded exchange with supervisord."""

    def __init__(self, run_dir: pathlib.Path, timeout: float):
        super().__init__()
        self._run_dir = run_dir
        self._timeout = timeout

    def request(self, host, handler, request_body, verbose=False):
        reply = transport.exchange(self._run_dir, request_body, self._timeout)
        if reply.status != 200:
            raise xmlrpc.client.ProtocolError(f"{transport.socket_path(self._run_dir)}{handler}",
                                              reply.status, "supervisord refused the request", {})
        parser, unmarshaller = self.getparser()
        try:
            parser.feed(reply.body)
            parser.close()
        except ExpatError as exc:
            raise xmlrpc.client.ResponseError(f"supervisord's reply is not XML-RPC: {exc}") from None
        return unmarshaller.close()


def server_proxy(run_dir: pathlib.Path, timeout: float = transport.CALL_TIMEOUT) -> xmlrpc.client.ServerProxy:
    """An XML-RPC proxy of supervisord in the stack's `run_dir` (its `supervisor` and `system` namespaces)."""
    return xmlrpc.client.ServerProxy("http://localhost/RPC2", transport=_Transport(run_dir, timeout))


def connect(run_dir: pathlib.Path) -> Supervisor:
    """A Supervisor talking to supervisord in the stack's `run_dir` (connects at each call)."""
    return Supervisor(server_proxy(run_dir))


class Supervisor:
    def __init__(self, proxy: Any):
        """`proxy`: an XML-RPC ServerProxy of supervisord (its `supervisor` and `system` namespaces)."""
        self._proxy = proxy

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except xmlrpc.client.Fault as fault:
            if fault.faultCode == Faults.SHUTDOWN_STATE:
                raise SupervisorStopping(f"{what}: supervisord is stopping every program") from None
            raise SupervisorError(f"{what}: {fault.faultString}") from None
        except (OSError, xmlrpc.client.Error) as exc:
            raise SupervisorError(f"{what}: {exc}") from None

    def programs(self) -> dict[str, dict]:
        """Every program's process info, keyed by name; but the programs supervisord never started: those of
        the other RESOURCE_API mode (supervisor.conf defines both; only this mode's start)."""
        infos = self._call("reading program states", self._proxy.supervisor.getAllProcessInfo)
        return {info["name"]: info for info in infos
                if not (info.get("statename") == "STOPPED" and info.get("start") == 0)}

    def answers(self) -> None:
        """Returns once supervisord answers a question (its own state: a few bytes each way, where the
        program table is kilobytes); SupervisorError otherwise."""
        self._call("asking supervisord's state", self._proxy.supervisor.getState)

    def send_signal(self, names: Iterable[str], signum: signal.Signals) -> None:
        """Send `signum` to each of `names` that has a process, in one request. One that has none (stopped,
        or waiting to be started again after an exit) is skipped: it has nobody to tell."""
        targets = list(names)
        calls = [{"methodName": "supervisor.signalProcess", "params": [name, signum.name]} for name in targets]
        self._call(f"sending {signum.name} to {', '.join(targets)}",
                   lambda: _checked(self._proxy.system.multicall(calls), tolerated=_GONE))

    def confirm_started(self, started: Mapping[str, int]) -> None:
        """Tell supervisord that each program of `started` (name: pid) is up (shared/fence/supervisord_started.py), in
        one request; a program that is no longer STARTING with that pid is left as it is."""
        calls = [{"methodName": "started.confirm", "params": [name, pid]} for name, pid in started.items()]
        self._call(f"confirming {', '.join(started)} started",
                   lambda: _checked(self._proxy.system.multicall(calls), tolerated=frozenset()))

    def shutdown(self) -> None:
        self._call("requesting shutdown", self._proxy.supervisor.shutdown)
