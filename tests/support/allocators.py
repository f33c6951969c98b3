"""An Allocator over a device table of plain PFs, its RSD groups faked and its device nodes in a temp dir."""

from __future__ import annotations

import pathlib
import threading

from resource_worker.allocation import Allocator
from resource_worker.device_table import DeviceTable
from shared.node.driver_status import StatusReading
from shared.node.rbln_smi import SmiUsage
from shared.node.rsd_group import GroupChange, RsdGroupError
from shared.resources import Resource
from tests.support.inventory import message, record

READY, FAULT = StatusReading(0), StatusReading(4)
NODE_TIMEOUT = 0.3


class FakeGroups:
    """RsdGroups that hand out group 7 and make its node appear after `delay` seconds (None: never)."""

    def __init__(self, dev_root: pathlib.Path, delay: float | None = 0.0, error: str | None = None):
        self._dev_root = dev_root
        self._delay = delay
        self._error = error
        self.calls: list[list[str]] = []

    def recreate(self, devices):
        self.calls.append([d.device_id for d in devices])
        if self._error:
            raise RsdGroupError(self._error)
        if self._delay is not None:
            threading.Timer(self._delay, (self._dev_root / "rsd7").touch).start()
        return GroupChange(7, (), SmiUsage())


def make_allocator(tmp_path: pathlib.Path, count: int = 3, nodes: tuple[str, ...] | None = None,
                   statuses: dict[str, StatusReading] | None = None, **groups) -> tuple[Allocator, FakeGroups]:
    ids = [f"rbln{i}" for i in range(count)]
    dev_root = tmp_path / "dev"
    dev_root.mkdir(parents=True)
    for name in ids if nodes is None else nodes:
        (dev_root / name).touch()
    table = DeviceTable(Resource.NPU)
    table.apply(message(devices=tuple(record(device_id, npu=i, bus_id=f"0000:{3 + i:02x}:00.0")
                                      for i, device_id in enumerate(ids))))
    statuses = statuses or {}
    fake = FakeGroups(dev_root, **groups)
    allocator = Allocator(table, fake, dev_root, lambda device_id: statuses.get(device_id, READY),
                          node_timeout=NODE_TIMEOUT)
    return allocator, fake
