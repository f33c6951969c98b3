"""Wake supervisord's main loop as soon as it has work, rather than at its next one-second poll; and let it
sleep while it has none.

supervisord (4.3) runs one loop: poll its descriptors with a fixed timeout of 1 s, then start
the programs due to start, reap the children that exited and act on the signals it received. Its
signal handlers only note the signal, and the poll goes on after one (PEP 475). So it spawns the
programs one poll after it is up, and stopping the stack it notices each stopped program's exit at
the next poll: a second per program when nothing else happens meanwhile.

Stopping, supervisord stops one program group (one program each here) per turn of the loop: it
signals the group's programs, polls, reaps, and moves on to the next group once this one's are all
down. A group with nothing left to stop (a program not started, such as the workers of the other
resource API, or one that already exited) still costs a turn, whose poll nothing wakes: a second.

supervisor.conf names `make_wakeup_rpcinterface` as an `[rpcinterface:...]` factory, which
supervisord calls in its main thread while it starts, before its loop. It gives the interpreter a
pipe to write the number of every signal into (`signal.set_wakeup_fd`: SIGCHLD and the stop
signals, which supervisord handles in Python) and puts the pipe's read end among the descriptors the
loop polls, with one byte already in it for the first poll. The loop then wakes when a child exits
or a signal arrives, and at once when it starts, or when a signal it noted is still to be acted on
(it acts on one a turn); and while it stops, at once when the group in turn has nothing left to stop.
What it does when it wakes is supervisord's own code, unchanged.

What it buys, measured for issue 36 on the stack of a one-resource node (8 whole NPUs, 5 s scans; a 2-core
machine at a 1-minute load of 8 to 11 from other work; 6 stacks each way, `bench/stack_lifecycle.py`'s
start and stop): from the spawn of `run` to supervisord's first spawn of a program 270-840 ms with it
(median 565) and 1200-2310 ms without (median 1300), about 0.7 s of every start; SIGTERM to supervisord's
exit 114-231 ms with it and 4.1-6.1 s without. Both far over the 30 ms of start that keeps a workaround.

Once every program is where it stays (RUNNING, STOPPED or FATAL), supervisord is not stopping and no
XML-RPC answer is deferred (stopProcess, startProcess: medusa looks again at a deferred answer only when the
loop turns), nothing in the loop waits for time to pass: a child's exit and a signal wake it through the
pipe, an XML-RPC request through its socket, a program's output through its pipe. The poll's timeout is then
`QUIET_POLL_SECONDS` instead of 1 s (`options.poller.poll` wrapped): a program STARTING, in BACKOFF,
STOPPING or just EXITED (restarted at the next turn) brings the one-second poll back for as long as it
lasts. The loop's tick events then come late, which nothing here listens to (supervisor.conf has no event
listener). Measured on an idle 8-NPU stack (per-thread CPU over 60 s): supervisord 22.3 ms of CPU a minute
with the one-second poll, 8.5 ms with the quiet one (what wakes it then is the watchdog's look every 10 s).

That the loop polls the dispatchers of `options.get_socket_map()`, acts after each poll on one of the
signals noted in `options.signal_receiver`, and keeps the groups still to stop in `stop_groups` is
supervisord's internals, hence the exact version in pyproject.toml. Should they change, the hook either
cannot install, which supervisord logs in one line before running as before (only slower), or it installs
and wakes the loop less often.

What it buys, measured on the stack as a node runs it (bench/stack_lifecycle.py --quick, 8-PF node, two runs
with it and two with the `[rpcinterface:wakeup]` section removed from supervisor.conf; a 2-core machine shared
with other work): stopping the stack (SIGTERM to supervisord's exit) 173-176 ms p50 (max 253-302 ms) with it,
2172-3297 ms p50 (max 3396-4255 ms) without; the start up to supervisord's first spawn 310-830 ms with it,
1160-1340 ms without (one poll of a second). Memory and idle CPU: no difference beyond the noise (Rss 187 MiB,
idle 0.19-0.23 % of a core either way).
Checked against supervisor 4.3.0 (`CHECKED_AGAINST`, pinned exactly in pyproject.toml and the lock).
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

# The version whose internals this module was written against (shared/fence/__init__.py).
CHECKED_AGAINST = ("supervisor", "4.3.0")
# What a read takes from the pipe at a time: signals come in ones and twos.
_READ_BYTES = 512
# The poll's timeout while nothing in supervisord waits for time to pass (anything else wakes the poll).
QUIET_POLL_SECONDS = 30.0


def _quiet(supervisord: Any) -> bool:
    """Whether nothing in supervisord waits for time to pass: not stopping, no signal to act on, no XML-RPC
    answer deferred (an HTTP channel with a `delay` looks again at its deferred answer only when the loop
    turns), every program in a state it stays in by itself."""
    from supervisor.states import ProcessStates, SupervisorStates

    options = supervisord.options
    if options.mood < SupervisorStates.RUNNING or options.signal_receiver._signals_recvd:
        return False
    if any(getattr(dispatcher, "delay", 0) for dispatcher in options.get_socket_map().values()):
        return False
    settled = (ProcessStates.RUNNING, ProcessStates.STOPPED, ProcessStates.FATAL)
    for group in supervisord.process_groups.values():
        for process in group.processes.values():
            state = process.get_state()
            if state not in settled or (state == ProcessStates.STOPPED and process.config.autostart
                                        and not process.laststart):
                return False  # on its way somewhere, or an autostart program still to be started
    return True


def sleep_while_quiet(supervisord: Any) -> None:
    """Wrap the poller's poll: QUIET_POLL_SECONDS instead of its timeout while `_quiet` (a reload's new
    Supervisor wraps the original poll again)."""
    poller = supervisord.options.poller
    poll = getattr(poller.poll, "unwrapped", poller.poll)

    def quiet_poll(timeout: float) -> Any:
        try:
            quiet = _quiet(supervisord)
        except Exception:  # another supervisord's internals: its own timeout
            quiet = False
        return poll(QUIET_POLL_SECONDS if quiet else timeout)

    quiet_poll.unwrapped = poll  # type: ignore[attr-defined]
    poller.poll = quiet_poll


class _SignalWakeup:
    """The pipe's read end in supervisord's socket map, as an asyncore dispatcher: readable while open,
    never writable; a read event empties the pipe."""

    def __init__(self, supervisord: Any, read_fd: int, write_fd: int) -> None:
        self._supervisord = supervisord
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._open = True
        self._follows_stop = True
        # Set by a read event, after which the loop asks `readable` before it acts on what woke it.
        self._woken = False

    def wakes(self, supervisord: Any) -> bool:
        return self._open and self._supervisord is supervisord

    def readable(self) -> bool:
        if self._woken:
            # Asked right after the read event: the signal noted and the group in turn are still to be acted
            # on in this turn, so they would wake the next poll for nothing.
            self._woken = False
        elif self._open and (self._signal_pending() or (self._follows_stop and self._turn_is_over())):
            # Asked just before the poll, after the loop acted on a signal and stopped the group in turn.
            self._wake()
        return self._open

    def _signal_pending(self) -> bool:
        """A signal noted but not acted on yet: the loop acts on one a turn, and the pipe was emptied of all of
        them, so a SIGTERM noted in the turn a SIGCHLD woke would otherwise wait out the next poll."""
        try:
            return bool(self._supervisord.options.signal_receiver._signals_recvd)
        except Exception:  # another supervisord: its signals are acted on at its own pace
            return False

    def _turn_is_over(self) -> bool:
        """Stopping, and the group in turn has nothing left to stop: the loop moves on after this poll."""
        try:
            stop_groups = self._supervisord.stop_groups
            return bool(stop_groups) and not stop_groups[-1].get_unstopped_processes()
        except Exception:  # one raised here would end supervisord's loop
            self._follows_stop = False  # another supervisord: its stop goes at its own pace
            return False

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: the poll returns at once anyway
            os.write(self.write_fd, b"\0")

    def writable(self) -> bool:
        return False

    def handle_read_event(self) -> None:
        try:
            while os.read(self.read_fd, _READ_BYTES):
                pass
        except BlockingIOError:
            self._woken = True
            return  # emptied
        # End of file: the write end was closed behind our back (its number may be another file's by now),
        # so nothing will wake the loop again; it polls as before.
        self._close(self.read_fd)

    def handle_error(self) -> None:
        self.close()

    def close(self) -> None:
        """Leave the loop to its timeout: the pipe goes, and with it the interpreter's wakeup fd."""
        self._close(self.read_fd, self.write_fd)

    def _close(self, *fds: int) -> None:
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(ValueError):  # not the main thread: the wakeup fd is not ours to change
            previous = signal.set_wakeup_fd(-1)
            if previous != self.write_fd:
                signal.set_wakeup_fd(previous)
        for fd in fds:
            os.close(fd)

    def __repr__(self) -> str:
        return f"<signal wakeup fd={self.read_fd}>"


class WakeupRPCInterface:
    """The `wakeup` namespace of supervisord's XML-RPC interface."""

    def __init__(self, installed: bool) -> None:
        self._installed = installed

    def installed(self) -> bool:
        """Whether supervisord's loop wakes on signals and child exits (False: it polls once a second).

        @return boolean result  Whether the hook is in place
        """
        return self._installed


def install(supervisord: Any) -> _SignalWakeup:
    """Put a signal wakeup pipe into supervisord's socket map, one byte in it. supervisord calls the factory
    once per HTTP server it serves: the second call finds the pipe in place. A reload (a new Supervisor)
    replaces the earlier one, whose descriptors supervisord closed before starting again."""
    socket_map = supervisord.options.get_socket_map()
    for fd, dispatcher in list(socket_map.items()):
        if isinstance(dispatcher, _SignalWakeup):
            if dispatcher.wakes(supervisord):
                return dispatcher
            del socket_map[fd]
    read_fd, write_fd = os.pipe()
    try:
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    wakeup = _SignalWakeup(supervisord, read_fd, write_fd)
    wakeup._wake()
    socket_map[read_fd] = wakeup
    return wakeup


def make_wakeup_rpcinterface(supervisord: Any, **_config: str) -> WakeupRPCInterface:
    """supervisord's factory for the `[rpcinterface:wakeup]` section; never raises, since supervisord
    refuses to start on a factory that does. The quiet poll needs the pipe: without it, nothing would wake a
    long poll."""
    try:
        install(supervisord)
    except Exception as exc:  # whatever a future supervisord changed, it must still run
        _warn(supervisord, f"cannot wake supervisord's loop on signals ({exc!r}); "
                           "it starts and stops programs at its one-second poll")
        return WakeupRPCInterface(installed=False)
    try:
        sleep_while_quiet(supervisord)
    except Exception as exc:
        _warn(supervisord, f"cannot lengthen supervisord's poll while it is quiet ({exc!r}); it polls every second")
    return WakeupRPCInterface(installed=True)


def _warn(supervisord: Any, message: str) -> None:
    with contextlib.suppress(Exception):
        supervisord.options.logger.warn(f"rbln-device-plugin: {message}")
