"""What a worker needs only while its resource has devices, built when they first appear: the recorder and the
tracer, the rbln-smi runner and the Allocator, and the factory of plugin servers (gRPC, the API, placement).

A worker whose resource the node lacks (most nodes have one of the three) follows the snapshots with only
the subscription, its device table and the log; resource_worker/main.py imports this module at the first
snapshot with devices, so that such a worker never pays for any of it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

from resource_worker.allocation import Allocator
from resource_worker.device_table import DeviceTable
from resource_worker.lifecycle import PluginInstance
from resource_worker.plugin_server import PluginServer
from shared.config import Settings
from shared.node.driver_status import read_status
from shared.node.rbln_smi import GROUP_COMMANDS, RblnSmi
from shared.node.rsd_group import RsdGroups
from shared.observability.metrics import recorder_for
from shared.observability.tracing import AllocationTracer, setup_tracing
from shared.version import VERSION


class Serving:
    """The resource's serving parts, made once; `new_plugin` makes a plugin server per instance from them."""

    def __init__(self, settings: Settings, table: DeviceTable):
        self._settings = settings
        self._table = table
        self._metrics = recorder_for(settings.metrics_port, settings.run_dir)
        self._metrics.load(table.resource.value, [command.value for command in GROUP_COMMANDS])
        self.tracer: AllocationTracer = setup_tracing(settings.otlp_endpoint, VERSION, settings.node_name)
        smi = RblnSmi(settings.rbln_smi, observe=self._metrics.rbln_smi)
        self._allocator = Allocator(table, RsdGroups(smi, settings.rsd_lock_file), settings.dev_root,
                                    lambda device_id: read_status(settings.sysfs_root, device_id),
                                    cdi_annotation=settings.cdi_annotation)
        # What the imports made lives as long as the process: out of the collector's reach, a full collection
        # no longer walks it (about 16 ms at 34 000 objects), which would otherwise land in whichever
        # GetPreferredAllocation or Allocate happened to trigger it. Once, as later instances add only a
        # server's worth. Not collected first: the imports leave no garbage a collection finds (it frees 0
        # objects at this point), and it cost the first registration 9-16 ms (measured on a loaded 2-core machine).
        gc.freeze()

    def new_plugin(self, on_stream_change: Callable[[], None]) -> PluginInstance:
        return PluginServer(self._table, self._allocator, self._settings.kubelet_device_plugin_path,
                            on_stream_change, self.tracer, self._metrics)
