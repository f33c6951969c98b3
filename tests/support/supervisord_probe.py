"""Real supervisord that writes down what its main loop does, one line each, to the file $PROBE_RECORDS:

- `woken` / `timed out`: a poll of the loop returned because a descriptor was ready, or after its
  timeout (1 s) with none;
- `quiet`: a poll begins with a longer timeout (the wake-up hook's while every program is settled): the loop
  has nothing pending;
- `spawned <name> <pid>`: it started a program; `reaped <pid>`: it collected an exited child.

    python -m tests.support.supervisord_probe -n -c <conf>

With PROBE_NO_WAKEUP_FD set, the interpreter refuses a signal wakeup fd (as it does off the main thread),
so that shared/fence/supervisord_wakeup.py cannot install.
"""

from __future__ import annotations

import os
import signal

from supervisor import options, poller, process, supervisord

_records = os.open(os.environ["PROBE_RECORDS"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _record(line: str) -> None:
    os.write(_records, f"{line}\n".encode())


_poll = poller.Poller.poll
_waitpid = options.ServerOptions.waitpid
_spawn = process.Subprocess.spawn


def _recorded_poll(self, timeout):
    if timeout > 1:
        _record("quiet")
    readable, writable = _poll(self, timeout)
    _record("woken" if readable or writable else "timed out")
    return readable, writable


def _recorded_waitpid(self):
    pid, status = _waitpid(self)
    if pid:
        _record(f"reaped {pid}")
    return pid, status


def _recorded_spawn(self):
    pid = _spawn(self)  # returns in supervisord only: the child execs or exits
    if pid:
        _record(f"spawned {self.config.name} {pid}")
    return pid


def _no_wakeup_fd(fd, **_flags):
    raise ValueError("set_wakeup_fd only works in main thread of the main interpreter")


poller.Poller.poll = _recorded_poll
options.ServerOptions.waitpid = _recorded_waitpid
process.Subprocess.spawn = _recorded_spawn
if os.environ.get("PROBE_NO_WAKEUP_FD"):
    signal.set_wakeup_fd = _no_wakeup_fd  # supervisord itself never sets one

if __name__ == "__main__":
    supervisord.main()
