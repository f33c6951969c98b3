"""Wake supervisord's main loop as soon as it has work, rather than at its next one-second poll.

supervisord (4.2, 4.3) runs one loop: poll its descriptors with a fixed timeout of 1 s, then start
the programs due to start, reap the children that exited and act on the signals it received. Its
signal handlers only note the signal, and the poll goes on after one (PEP 475). So it spawns the
programs one poll after it is up, and stopping the stack it notices each stopped program's exit at
the next poll: a second per program when nothing else happens meanwhile.

supervisor.conf names `make_wakeup_rpcinterface` as an `[rpcinterface:...]` factory, which
supervisord calls in its main thread while it starts, before its loop. It gives the interpreter a
pipe to write the number of every signal into (`signal.set_wakeup_fd`: SIGCHLD and the stop
signals, which supervisord handles in Python) and puts the pipe's read end among the descriptors the
loop polls, with one byte already in it for the first poll. The loop then wakes when a child exits
or a signal arrives, and at once when it starts. What it does when it wakes is supervisord's own
code, unchanged.

That the loop polls the dispatchers of `options.get_socket_map()` and acts after each poll is
supervisord's internals, hence the version range in pyproject.toml. Should they change, the hook
either cannot install, which supervisord logs in one line before running as before (only slower),
or it installs and no longer wakes anything.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

# What a read takes from the pipe at a time: signals come in ones and twos.
_READ_BYTES = 512


class _SignalWakeup:
    """The pipe's read end in supervisord's socket map, as an asyncore dispatcher: readable while open,
    never writable; a read event empties the pipe."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._open = True

    def readable(self) -> bool:
        return self._open

    def writable(self) -> bool:
        return False

    def handle_read_event(self) -> None:
        try:
            while os.read(self.read_fd, _READ_BYTES):
                pass
        except BlockingIOError:
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


def install(socket_map: dict[int, Any]) -> _SignalWakeup:
    """Put a signal wakeup pipe into `socket_map`, one byte in it; replaces any earlier one (a reload:
    supervisord closed that one's descriptors before starting again)."""
    for fd, dispatcher in list(socket_map.items()):
        if isinstance(dispatcher, _SignalWakeup):
            del socket_map[fd]
    read_fd, write_fd = os.pipe()
    try:
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        os.write(write_fd, b"\0")
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    wakeup = _SignalWakeup(read_fd, write_fd)
    socket_map[read_fd] = wakeup
    return wakeup


def make_wakeup_rpcinterface(supervisord: Any, **_config: str) -> WakeupRPCInterface:
    """supervisord's factory for the `[rpcinterface:wakeup]` section; never raises, since supervisord
    refuses to start on a factory that does."""
    try:
        install(supervisord.options.get_socket_map())
    except Exception as exc:  # whatever a future supervisord changed, it must still run
        with contextlib.suppress(Exception):
            supervisord.options.logger.warn(
                f"rbln-device-plugin: cannot wake supervisord's loop on signals ({exc!r}); "
                "it starts and stops programs at its one-second poll")
        return WakeupRPCInterface(installed=False)
    return WakeupRPCInterface(installed=True)
