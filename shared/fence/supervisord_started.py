"""Tell supervisord that a program has started, rather than have it guess from `startsecs`.

supervisord calls a program STARTING until it has stayed up `startsecs` (2 s in supervisor.conf, so that a
program failing on its configuration on a loaded node is retried and given up on), and RUNNING only at its
first one-second poll after that: a scanner that has published, a worker that serves, show as STARTING for 2
to 3 s, to `rbln-device-plugin status` and to the liveness probe alike. Each program of the stack says it is
up in the way it says everything else: its status file, written by its running instance (a scanner's after
its first scan, a worker's at its first step). The watchdog, which reads those files, confirms such a program
to supervisord through this interface (`started.confirm`), and supervisord moves it from STARTING to RUNNING
as it would have at `startsecs`. A program that exits after it was confirmed is restarted without end, as one
that exits later than `startsecs` always was; one that fails before it writes its status file is retried and
given up on as before.

supervisor.conf names `make_started_rpcinterface` as an `[rpcinterface:started]` factory. That a program's
process is `supervisord.process_groups[name].processes[name]`, with `pid`, `delay`, `backoff` and
`change_state` as supervisord's own `transition` uses them, is supervisord's internals, hence the version range
in pyproject.toml; `confirm` checks each before it changes anything, and answers False (nothing changed; the
program becomes RUNNING at `startsecs`) when one is not as it expects.

What it buys: correct states, not time or memory. Without it a scanner that has published and a worker that
serves show as STARTING for 2 to 3 s after every start and restart, to `rbln-device-plugin status`, to the
metrics and to the liveness probe, which then cannot tell a program that is up from one still failing on its
configuration. Checked against supervisor 4.3.0 (`CHECKED_AGAINST`, pinned exactly in pyproject.toml and the
lock).
"""

from __future__ import annotations

from typing import Any

from supervisor.states import ProcessStates
from supervisor.xmlrpc import Faults, RPCError

CHECKED_AGAINST = ("supervisor", "4.3.0")


class StartedRPCInterface:
    """The `started` namespace of supervisord's XML-RPC interface."""

    def __init__(self, supervisord: Any) -> None:
        self._supervisord = supervisord

    def confirm(self, name: str, pid: int) -> bool:
        """Take program `name` from STARTING to RUNNING if its process is `pid`.

        @param string name  The program's name
        @param int pid      The process that said it is up
        @return boolean result  Whether the program was STARTING with that process and is RUNNING now
        """
        group = self._supervisord.process_groups.get(name)
        process = None if group is None else group.processes.get(name)
        if process is None:
            raise RPCError(Faults.BAD_NAME, name)
        if process.get_state() != ProcessStates.STARTING or process.pid != pid or not hasattr(process, "backoff"):
            return False
        # What supervisord's own transition does at startsecs: the retries' count starts afresh.
        process.delay = 0
        process.backoff = 0
        process.change_state(ProcessStates.RUNNING)
        self._supervisord.options.logger.info(f"success: {name} entered RUNNING state, the process said it is up")
        return True


def make_started_rpcinterface(supervisord: Any, **_config: str) -> StartedRPCInterface:
    """supervisord's factory for the `[rpcinterface:started]` section."""
    return StartedRPCInterface(supervisord)
