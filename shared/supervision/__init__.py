"""The stack's one client of supervisord, in two modules so that a process pays only for what it uses, and the
hook supervisord itself loads.

- `transport`: the bounded exchange over the run dir's unix socket and the credentials. Standard library
  only and light, since every process of the stack loads it (to learn at shutdown whether the stack stops).
- `client`: the XML-RPC `Supervisor` (program states, signals to programs, shutdown) for the watchdog and
  `status`.
- `wakeup`: the `[rpcinterface:wakeup]` factory supervisor.conf names, run inside supervisord to wake its
  loop on signals and child exits. Standard library only: supervisord imports it at every start.
"""
