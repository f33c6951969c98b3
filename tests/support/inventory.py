"""Inventory records and messages as the scanner publishes them, every field at a plain default."""

from __future__ import annotations

from shared.channels import inventory_protocol
from shared.node.device_record import DeviceRecord
from shared.node.driver_status import StatusReading
from shared.resources import Resource


def record(device_id="rbln0", **overrides):
    fields = dict(device_id=device_id, npu=0, bus_id="0000:03:00.0", product="RBLN-CA25", sid="abc",
                  numa_node=0, parent_pf=None, pci_path=("pci0000:00", "0000:03:00.0"),
                  status=StatusReading(0), observed_at_ns=123)
    fields.update(overrides)
    return DeviceRecord(**fields)


RECORD = record()


def message(devices=(RECORD,), **overrides):
    fields = dict(resource=Resource.NPU, epoch="e1", seq=1, scanned_at_ns=5, devices=tuple(devices))
    fields.update(overrides)
    return inventory_protocol.InventoryMessage(**fields)
