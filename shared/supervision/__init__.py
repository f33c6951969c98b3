"""Supervision: the stack's one client of supervisord, and what every process does at its start and shutdown.

- `transport`: the bounded exchange over the run dir's unix socket and the credentials. Standard library
  only and light, since every process of the stack loads it (to learn at shutdown whether the stack stops).
- `client`: the XML-RPC `Supervisor` (program states, signals to programs, shutdown) for the watchdog and
  `status`.
- `process_lifecycle`: logging, settings and the startup record at a process's start; its shutdown.

The hook supervisord itself loads to wake its loop is behind the fence (shared/fence/supervisord_wakeup.py).
May import the vocabulary, `fs` and `observability` (a process's logging).
"""

MAY_IMPORT = ("shared", "shared.fs", "shared.observability")
