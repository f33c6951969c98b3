"""The programs of the stack: their supervisord program names, which are also the `process` key of every log
record and the names of each process's log and status files (docs/interface.md#processes).

supervisor.conf has a `[program:<name>]` section for each, and a test holds the two together.
"""

from __future__ import annotations

from shared.resources import Resource

SCANNER = "scanner"
WATCHDOG = "watchdog"
WORKERS = tuple(resource.process_name for resource in Resource)
# In the order supervisord starts them.
PROGRAMS = (SCANNER, *WORKERS, WATCHDOG)
