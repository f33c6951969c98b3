"""The programs of the stack: their supervisord program names, which are also the `process` key of every log
record and the names of each process's log and status files (docs/interface.md#processes).

supervisor.conf has a `[program:<name>]` section for each of ALL_PROGRAMS, and a test holds the two together;
which of them run depends on RESOURCE_API (the device plugin workers, or worker-dra) and, in device plugin
mode, on the resources the node has (`expected_programs`: one worker per resource found).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

from shared.config import ResourceApi
from shared.resources import Resource

SCANNER = "scanner"
WATCHDOG = "watchdog"
WORKER_DRA = "worker-dra"
WORKERS = tuple(resource.process_name for resource in Resource)
# In the order supervisord starts them: the device plugin mode's programs, and the DRA mode's.
PROGRAMS = (SCANNER, *WORKERS, WATCHDOG)
DRA_PROGRAMS = (SCANNER, WORKER_DRA, WATCHDOG)
ALL_PROGRAMS = (SCANNER, *WORKERS, WORKER_DRA, WATCHDOG)
# The watchdog's order to a worker to restart its device plugin (the kubelet restarted). A signal whose default
# action is to do nothing: a worker not yet listening for it drops it, and such a worker has not registered
# yet, so its first Register goes to the new kubelet anyway.
PLUGIN_RESTART_SIGNAL = signal.SIGWINCH


def autostart_environment(api: ResourceApi) -> dict[str, str]:
    """What supervisor.conf's `autostart` line of worker-dra reads: it starts in DRA mode only. The device
    plugin workers never start by themselves: the scanner has them started (scanner/worker_demand.py)."""
    return {"RBLN_DEVICE_PLUGIN_DRA_AUTOSTART": "true" if api is ResourceApi.DRA else "false"}


def expected_programs(api: ResourceApi, resources_with_devices: Iterable[str]) -> tuple[str, ...]:
    """The programs that must run: in DRA mode all of DRA_PROGRAMS; in device plugin mode the scanner, the
    watchdog and the worker of each resource (its name, e.g. `rebellions.ai/npu`) the scanner last found
    devices of. A worker of a resource the node lacks is not needed: absent, not down."""
    if api is ResourceApi.DRA:
        return DRA_PROGRAMS
    present = set(resources_with_devices)
    return (SCANNER, *(r.process_name for r in Resource if r.value in present), WATCHDOG)
